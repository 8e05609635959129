"""The adoption sweep: a running worker adopts orphaned WAL files into its open WAL
(spec/wal.md W-30..W-34).

Rules: at most ``files_max`` orphans are claimed per sweep, in name order, with the same
``LOCK_EX | LOCK_NB`` and link-count check as at open (W-27, W-31), so live siblings that
sweep the same directory never adopt the same file (the flock decides) and share the
orphans. The claimed files are replayed outside the WAL's mutex (they are this worker's
own descriptors; the appends and removes of other threads go on meanwhile). Then, under
the mutex, the ``add`` line of every task they hold that is not pending here already is
appended to the main file in one write (cut back whole if it fails, W-13), every record
written so far is fsynced (group commit, W-21), and only then are the orphans unlinked,
still locked, the directory fsynced and their descriptors closed (W-32: the same order as
the fresh copy of an adoption at open, W-3/W-4). A task already pending here is the same
task, left in two files by an adoption that was interrupted between its copy and its
unlink (W-4): its copy here is kept as it is, so it never runs twice in one worker.

Unlike an adoption at open, the adopted records go into the main file rather than a fresh
file: the main file is this worker's own, created per W-1 and only ever written by it, so
its fsync covers them (A-7 concerns the adopted files' pages, which are never written to
nor trusted). Part of ``TasksWal`` (see ``walbase``).
"""

from __future__ import annotations

import logging

from deferq._core.errors import StorageBrokenError
from deferq._core.recovery import WalReplay, live_fields
from deferq._core.types import PendingTask
from deferq._engine.env import OpenFlag
from deferq._engine.io import join
from deferq._engine.walbase import WalState
from deferq._engine.walfiles import WalFiles
from deferq._engine.walspace import WalSpace
from deferq._engine.walsync import WalSync

log = logging.getLogger("deferq")


class WalSweep(WalFiles, WalSpace, WalSync):
    """Adopting orphaned WAL files while the WAL is open (W-30..W-34)."""

    def adopt_orphans(self, files_max: int) -> list[PendingTask]:
        """Implements W-30..W-32: adopt up to ``files_max`` orphaned WAL files.

        Returns the tasks adopted (pending in this WAL from now on, durable in its main
        file), in the orphans' pending order; ``files_max`` was validated by the caller.
        Raises what ``add`` raises (``StorageClosedError``, ``StorageBrokenError``, an
        ``OSError`` of a write that was cut back), leaving every orphan as it was.
        """
        with self._mutex:
            self._check_usable()
            self._replace_if_nameless()  # W-80, W-81
        claimed = self._claim_orphans(files_max=files_max)
        if not claimed:
            return []
        fds = [fd for _, fd in claimed]
        try:
            replay = self._replay(claimed)
        except BaseException:
            self._close_fds(fds)
            raise
        # Implements W-28 for adopted ids: never issue an id at or below a seed adopted.
        self._ids.raise_floor(replay.seed_max + 1)
        if replay.corrupt:
            log.warning("Detected %d corrupted deferred task record(s) in %s", replay.corrupt,
                        ", ".join(join(self._path, name) for name, _ in claimed))
        with self._mutex:
            try:
                self._check_usable()
                adopted = self._append_adopted(replay)
                # Implements W-32: every adopted record is durable before any orphan goes.
                self._sync_through_locked(self._written)
            except BaseException:
                self._close_fds(fds)
                raise
            self._retire(claimed)
        log.info("swept %d orphaned WAL file(s) holding %d pending task(s): %s", len(claimed),
                 len(adopted), ", ".join(name for name, _ in claimed))
        return [PendingTask(task_id, context, publish_at)
                for task_id, (publish_at, context) in adopted]

    def _append_adopted(self, replay: WalReplay) -> list[tuple[str, tuple[int | None, bytes]]]:
        """Append the ``add`` line of every adopted task not pending here (W-32, W-33).

        One write for all of them: a failure cuts the whole batch back (W-13) and nothing
        is adopted. The mutex is held.
        """
        lines = {task_id: line for task_id, line in replay.live.items()
                 if task_id not in self._live}
        if not lines:
            return []
        self._append(b"".join(lines.values()))
        self._written += len(lines)  # W-20: one ticket per record
        self._live.update(lines)
        return [(task_id, live_fields(line)) for task_id, line in lines.items()]

    def _replace_if_nameless(self) -> None:
        """Implements W-80 and W-81: a main file that lost its name is replaced by a fresh copy.

        Someone deleted it (by hand, or with the whole storage directory): every record
        written since, acknowledged or not, would be gone at the next start, since no
        worker can adopt a file without a name. Every pending task is in memory (W-7),
        so the rotation's copy (W-10) puts them all back under a new name; the old file
        is only closed, never unlinked by name (that name may hold another file by now).
        Where no file can be created (the directory itself was removed) the WAL breaks:
        it must not acknowledge a record that no restart could find. One ``fstat`` per
        call. The mutex is held; an fsync in flight is waited for (W-23).
        """
        while self._syncing:
            self._synced.wait()
        if self._state is not WalState.OPEN or not self._main_file_deleted():
            return
        lost = join(self._path, self._name)
        try:
            name, fd = self._write_fresh_copy()
        except StorageBrokenError as exc:
            self._break(exc)
            raise
        except OSError as exc:
            raise self._break(StorageBrokenError(
                f"the tasks WAL file {lost} was deleted while this worker ran, and no new file"
                f" can be made in {self._path} ({exc}): its {len(self._live)} pending task(s)"
                " exist only in this process")) from exc
        log.warning("the tasks WAL file %s was deleted while this worker ran; its %d pending "
                    "task(s) were copied to %s", lost, len(self._live), join(self._path, name))
        self._unmap()
        old_fd = self._fd
        self._name, self._fd = name, fd
        self._size = self._reserved = self._env.fstat(fd).size
        self._offset_stale = False  # the copy was written with write: its offset is its end
        # The rotation limit stays: the copy is no larger than the file it replaces (W-9).
        self._durable = self._written  # W-77: the fsynced copy holds every pending task
        self._close_fds([old_fd])

    def _main_file_deleted(self) -> bool:
        """W-80: the main file has no name: its link count is 0, and its name (if it still
        opens) is another file. The name is asked too, only then, so that a filesystem whose
        link count lied would not get a new copy at every sweep."""
        env = self._env
        mine = env.fstat(self._fd)
        if mine.links > 0:
            return False
        try:
            fd = env.open(join(self._path, self._name), OpenFlag.READ)
        except OSError:  # gone (the name, or the directory), or not a regular file (F-16)
            return True
        try:
            named = env.fstat(fd)
        finally:
            self._close_fds([fd])
        return (named.device, named.inode) != (mine.device, mine.inode)
