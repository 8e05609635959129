"""The tasks WAL's files: adopt orphans in batches (W-35), claim orphans, create a file, write a fresh copy, retire or discard
(spec/wal.md W-1..W-4, W-10).

Rules: a new file's name is durable (directory fsync) before any record goes into it (W-1);
an orphan is claimed with ``LOCK_EX | LOCK_NB`` and skipped if it was unlinked meanwhile
(W-27); a fresh copy holds the seed marker and every live task and is fsynced before the
files it replaces are unlinked, still locked, and the directory fsynced (W-3, W-4, W-10); a
copy that failed is durably unlinked or the WAL fail-stops (W-10). Cleanup failures are
logged, never raised over the original error. Part of ``TasksWal`` (see ``walbase``).
"""

from __future__ import annotations

import logging
from typing import Final

from deferq._core.errors import StorageBrokenError, UnsafeEntryError
from deferq._core.fastreplay import FastWalReplay
from deferq._core.limits import ADOPT_FILES_MAX, FILE_MODE, WRITE_BATCH_BYTES
from deferq._core.names import is_wal_file_name, wal_file_name
from deferq._core.recovery import WalReplay
from deferq._core.walcodec import encode_rem
from deferq._engine.env import OpenFlag
from deferq._engine.io import chunks_forward, join, name_file, records_end, write_all
from deferq._engine.walbase import WalBase

log = logging.getLogger("deferq")

_RW_APPEND: Final = OpenFlag.READ | OpenFlag.WRITE | OpenFlag.APPEND
# A worker's own file is written at its descriptor's offset, not with O_APPEND: the file
# is longer than its records by the space reserved ahead of them (W-25).
RW: Final = OpenFlag.READ | OpenFlag.WRITE
_CREATE_ATTEMPTS_MAX: Final = 16


class WalFiles(WalBase):
    """Creating, claiming, copying and retiring WAL files."""

    def _adopt_orphans(self) -> tuple[str, int] | None:
        """Implements W-27, W-3, W-4 and W-35: adopt every orphan, at most ``ADOPT_FILES_MAX`` at a time.

        The orphans are claimed in name order, a batch at a time; each batch is replayed
        after this worker's copy of the batches before it (which holds exactly their
        pending tasks and seed, W-3) and replaced by a new copy (W-4), so the outcome is
        that of one replay of every file in name order while at most ``ADOPT_FILES_MAX``
        + 2 descriptors are open. Returns the last copy (the main file), or None when
        there was nothing to adopt.
        """
        names = self._orphan_names()
        current: tuple[str, int] | None = None
        adopted: list[str] = []
        for start in range(0, len(names), ADOPT_FILES_MAX):
            claimed = self._claim_orphans(names[start:start + ADOPT_FILES_MAX])
            if not claimed:
                continue
            files = claimed if current is None else [current, *claimed]
            try:
                replay = self._replay(files)
            except BaseException:
                self._close_fds([fd for _, fd in files])
                raise
            self._live = replay.live
            self.corrupt_records += replay.corrupt
            if replay.corrupt:
                log.warning("Detected %d corrupted deferred task record(s) in %s", replay.corrupt,
                            ", ".join(join(self._path, name) for name, _ in claimed))
            # Implements W-28: ids start above every id seen and above the clock.
            self._ids.raise_floor(replay.seed_max + 1)
            current = self._adopt(files)
            adopted.extend(name for name, _ in claimed)
        if current is not None:
            # Implements Q-32 at the storage level: which files a start took over.
            log.info("adopted %d WAL file(s) holding %d pending task(s): %s", len(adopted),
                     len(self._live), ", ".join(adopted))
        return current

    def _replay(self, claimed: list[tuple[str, int]]) -> WalReplay:
        """Replay every claimed file in name order (W-3, W-15, R-@A..R-@L), on the fast path (W-16)."""
        replay = FastWalReplay()
        for name, fd in claimed:
            try:
                end = records_end(self._env, fd, self._env.fstat(fd).size)  # R-@L
                replay.apply_file(chunks_forward(self._env, fd, end))
            except OSError as exc:
                name_file(exc, join(self._path, name))  # W-82: a read error names its file
                raise
        return replay.result()

    def _adopt(self, claimed: list[tuple[str, int]]) -> tuple[str, int]:
        """Implements W-3 and W-4: copy the live tasks to a fresh file, then retire the claimed ones.

        An adopted file is never appended to nor trusted to be durable: its records
        may exist only in the page cache after a previous owner's failed fsync
        (A-7) marked them clean, and an fsync of ours would return 0 without
        writing them. The fresh copy's fsync writes every byte it holds (D-2,
        D-3); only then are the claimed files unlinked, still locked, and the
        directory fsynced. Any failure raises from the constructor, which has
        acknowledged nothing; the files left behind hold the same pending tasks.
        """
        try:
            name, fd = self._write_fresh_copy()
        except BaseException:
            self._close_fds([fd for _, fd in claimed] + self._held_fds)
            raise
        try:
            self._retire(claimed)
        except BaseException:
            self._close_fds([fd])
            raise
        return name, fd

    def _orphan_names(self) -> list[str]:
        """Every WAL file name of the prefix, sorted by name (W-27)."""
        return sorted(n for n in self._env.listdir(self._path) if is_wal_file_name(self._prefix, n))

    def _claim_orphans(self, names: list[str] | None = None,
                       files_max: int | None = None) -> list[tuple[str, int]]:
        """Lock every file of ``names`` (every WAL file of the prefix by default) that no live
        process holds (W-27), in name order; ``files_max`` stops after that many are locked
        (the sweep's bound, W-31)."""
        env = self._env
        if names is None:
            names = self._orphan_names()
        claimed: list[tuple[str, int]] = []
        try:
            for name in names:
                try:
                    fd = env.open(join(self._path, name), _RW_APPEND)
                except FileNotFoundError:
                    continue  # Unlinked by its owner (rotation or merge) since listdir.
                except UnsafeEntryError as exc:
                    # Implements F-16: not a WAL file, whatever its name; leave it alone.
                    log.warning("skipping %s: %s", name, exc)
                    continue
                # Implements W-27: a file unlinked between open and flock is a ghost; skip it.
                if env.flock_exclusive_nb(fd) and env.fstat(fd).links > 0:
                    claimed.append((name, fd))
                    if files_max is not None and len(claimed) >= files_max:
                        break
                else:
                    env.close(fd)
        except BaseException:
            self._close_fds([fd for _, fd in claimed])
            raise
        return claimed

    def _create_file(self) -> tuple[str, int]:
        """Create, lock and make durable the name of a new WAL file (W-1)."""
        env = self._env
        for _ in range(_CREATE_ATTEMPTS_MAX):
            name = wal_file_name(self._prefix, env.local_date(), self._pid, env.random_u32())
            try:
                fd = env.open(join(self._path, name), RW | OpenFlag.CREATE
                              | OpenFlag.EXCLUSIVE, FILE_MODE)
            except FileExistsError:
                continue
            try:
                taken = env.flock_exclusive_nb(fd) and env.fstat(fd).links > 0
                if taken:
                    env.fsync_dir(self._path)
            except BaseException as exc:
                # Cleanup failures are logged, never raised: they must not hide the original
                # error, least of all a failed fsync that must fail-stop (W-12).
                self._close_fds([fd])
                try:
                    self._unlink_quietly(name)
                except OSError:
                    log.warning("could not unlink abandoned WAL file %s", name, exc_info=True)
                if isinstance(exc, OSError):
                    # A failed fsync is never retried (W-12), not even by a later rotation.
                    raise StorageBrokenError(f"could not make new WAL file {join(self._path, name)}"
                                             f" durable ({exc})") from exc
                raise
            if not taken:
                # A booting worker listed and claimed the file between our create and our
                # flock (W-27): it is that worker's file now (or it merged and unlinked it),
                # so never unlink it and never write to it; use another name.
                env.close(fd)
                continue
            return name, fd
        raise FileExistsError(f"could not pick an unused WAL file name in {self._path}")

    def _write_fresh_copy(self) -> tuple[str, int]:
        """Implements W-10's first steps (shared with W-3): a new file holding every pending task.

        Creates the file (W-1), writes the seed marker (W-28) and every pending
        task's ``add`` line, and fsyncs it. Raises ``StorageBrokenError`` when the
        WAL must fail-stop; any other ``OSError`` means the copy was durably
        discarded (``_discard_copy``) and the old files are still the WAL.
        """
        env = self._env
        name, fd = self._create_file()
        try:
            # Implements W-28: a marker carrying the current seed keeps ids issued before
            # the copy (whose records the old files take with them) from being reissued.
            write_all(env, fd, encode_rem(f"{self._ids.current_seed()}-{self._pid}-0"))
            batch: list[bytes] = []
            batch_bytes = 0
            for line in self._live.values():
                batch.append(line)
                batch_bytes += len(line)
                if batch_bytes >= WRITE_BATCH_BYTES:
                    write_all(env, fd, b"".join(batch))
                    batch, batch_bytes = [], 0
            if batch:
                write_all(env, fd, b"".join(batch))
            env.fsync(fd)
        except OSError as exc:
            # The error names the file; no traceback: the caller raises it or logs it (W-10),
            # and an operator's command (W-34) would print a traceback as if it had crashed.
            log.warning("could not copy the pending tasks to a new WAL file: %s",
                        name_file(exc, join(self._path, name)))
            self._discard_copy(name, fd, exc)
            raise
        return name, fd

    def _retire(self, files: list[tuple[str, int]]) -> None:
        """Implements the last steps of W-4 and W-10: unlink while locked, fsync the directory, close.

        A retired file that survived beside the fresh copy could undo removals
        recorded from now on (D-3), so a failed unlink or directory fsync makes
        the WAL broken (W-12); a restart adopts the files left behind safely.
        """
        try:
            for name, _ in files:
                self._unlink_quietly(name)
            self._env.fsync_dir(self._path)
        except OSError as exc:
            names = ", ".join(join(self._path, name) for name, _ in files)
            raise self._break(StorageBrokenError(
                f"could not durably unlink retired WAL file(s) {names} ({exc})")) from exc
        finally:
            self._close_fds([fd for _, fd in files])

    def _unlink_quietly(self, name: str) -> None:
        try:
            self._env.unlink(join(self._path, name))
        except FileNotFoundError:
            pass

    def _close_fds(self, fds: list[int]) -> None:
        for fd in fds:
            try:
                self._env.close(fd)
            except OSError:
                log.warning("closing a WAL file descriptor failed", exc_info=True)

    def _discard_copy(self, name: str, fd: int, cause: OSError) -> None:
        """Implements W-10 (and W-3): durably unlink a failed copy, or fail-stop.

        The copy holds ``add`` records of tasks that this WAL may remove from now
        on; if it survived (a failed unlink, or an unlink a power loss undoes),
        a restart would merge it after the old file and bring those tasks back
        (D-3). So it is unlinked while still locked and the directory fsynced;
        if either fails the WAL is broken, and the copy stays locked until
        ``close`` so no booting worker adopts it beside this live one.
        """
        try:
            self._unlink_quietly(name)
            self._env.fsync_dir(self._path)
        except OSError as exc:
            self._held_fds.append(fd)
            raise self._break(StorageBrokenError(
                f"copying the pending tasks failed ({cause}) and the copy "
                f"{join(self._path, name)} could not be durably removed ({exc})")) from exc
        self._close_fds([fd])
