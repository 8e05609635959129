"""The dead-task store: one shared, append-only file for all workers (spec/dead-tasks.md).

Theory of operation (the reference design, ../shared/reference/dead-letter-design.md):
- Three names: the data file (renamed over by compaction), the lock file
  (never renamed or unlinked, so every process serializes on one inode, S-2)
  and the compaction staging file ``.tmp``.
- Every operation takes the lock file with LOCK_EX | LOCK_NB *and* a
  process-local mutex in one bounded retry loop (L-1..L-3), then opens the data
  file by path: no data descriptor outlives an operation (S-3), so nobody
  writes to an inode a compaction has replaced.
- add: serialize first, then under the lock cut a torn tail, append one line,
  fsync (S-4). remove: survivors to ``.tmp``, fsync, rename, fsync the
  directory; with no match the live file is untouched and nothing is fsynced
  (S-5). list/find read backwards from the newest end in bounded chunks (S-6).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator

from deferq._env import Env, OpenFlag
from deferq._errors import DeadTasksLockTimeout, StorageBrokenError, StorageClosedError
from deferq._format import (
    BadLine,
    DeadLine,
    dead_data_name,
    dead_lock_name,
    dead_tmp_name,
    decode_dead_line,
    decode_dead_payload,
    encode_dead,
)
from deferq._io import join, lines_backward, lines_forward, repair_tail, write_all
from deferq._recovery import RawLine, line_body
from deferq._limits import FILE_MODE, LOCK_ATTEMPTS_MAX, WRITE_BATCH_BYTES, lock_sleep_s
from deferq._types import DeadTask

log = logging.getLogger("deferq")


def parent_dir(path: str) -> str:
    """The directory holding ``path`` (``.`` for a bare name)."""
    head, sep, _ = path.rstrip("/").rpartition("/")
    return head if head else ("/" if sep else ".")


def ancestors(path: str) -> list[str]:
    """The directories holding ``path``, its parent, ... up to ``/`` or ``.``, nearest first.

    ``..`` components are kept as written: their durability is the user's (A-4).
    """
    out = []
    while True:
        path = parent_dir(path)
        out.append(path)
        if path in ("/", "."):
            return out


def _dead_line(raw: RawLine) -> tuple[DeadLine | None, bytes | None, int]:
    """One line's framed record, its bytes (after any R-@K hole) and its damage count."""
    data, faults = line_body(raw)
    if data is None:
        return None, None, len(faults)
    framed = decode_dead_line(data)
    if isinstance(framed, BadLine):
        return None, None, len(faults) + 1
    return framed, data, len(faults)


# The lock file holds no data; its size says whether a compaction's rename may not be
# durable yet (S-9): 0 = settled, COMPACTION_MARK_BYTES = a rename is in flight.
COMPACTION_MARK_BYTES = 1


class DeadTaskStore:
    """The shared dead-task store of one storage directory and prefix. Thread-safe."""

    def __init__(self, env: Env, path: str, prefix: str) -> None:
        self._env = env
        self._path = path
        self._data = join(path, dead_data_name(prefix))
        self._tmp = join(path, dead_tmp_name(prefix))
        self._local = threading.Lock()
        self._closed = False
        self._broken = False
        self._pid = env.getpid()
        # Implements S-1: the lock file is opened once and kept; it is never renamed.
        self._lock_fd = env.open(join(path, dead_lock_name(prefix)),
                                 OpenFlag.READ | OpenFlag.WRITE | OpenFlag.CREATE, FILE_MODE)
        try:
            # Implements S-1 / D-6: create the data file without truncating it and make
            # its name durable before any dead task can leave a WAL.
            env.close(env.open(self._data, OpenFlag.READ | OpenFlag.WRITE | OpenFlag.CREATE,
                               FILE_MODE))
            env.fsync_dir(path)
        except BaseException:
            env.close(self._lock_fd)
            raise

    # ------------------------------------------------------------------ locking

    @contextlib.contextmanager
    def _locked(self, operation: str) -> Iterator[None]:
        """Implements L-1..L-3: both locks, non-blocking, bounded retries."""
        self._check_usable()
        env = self._env
        for attempt in range(1, LOCK_ATTEMPTS_MAX + 1):
            if self._local.acquire(blocking=False):
                try:
                    taken = env.flock_exclusive_nb(self._lock_fd)
                except BaseException:
                    self._local.release()
                    raise
                if taken:
                    break
                self._local.release()
            if attempt == LOCK_ATTEMPTS_MAX:
                raise DeadTasksLockTimeout(f"Could not lock the dead tasks store to {operation} it")
            env.sleep(lock_sleep_s(attempt))
        try:
            yield
        finally:
            try:
                env.flock_unlock(self._lock_fd)
            finally:
                self._local.release()

    def _check_usable(self) -> None:
        if self._closed:
            raise StorageClosedError("the Disk backend is closed")
        if self._broken:
            raise StorageBrokenError("the dead-task store failed to write or fsync earlier and"
                                     " refuses work; restart the worker")
        if self._env.getpid() != self._pid:
            # W-14: a forked child shares the lock file's description, so its flock would
            # succeed while the parent holds it and its unlock would release the parent's.
            raise RuntimeError(
                f"this Disk was opened by process {self._pid}; a forked child must open its own")

    def _fail_stop(self, message: str, exc: OSError) -> StorageBrokenError:
        """Implements D-10: after a failed fsync nothing later may be acknowledged."""
        self._broken = True
        return StorageBrokenError(message)

    def _open_data(self, flags: OpenFlag) -> int | None:
        """Open the data file by path (S-3); None when it does not exist."""
        try:
            return self._env.open(self._data, flags)
        except FileNotFoundError:
            return None

    # ------------------------------------------------------------------ operations

    def add(self, task: DeadTask) -> str:
        """Append one dead task durably (S-4). ``task`` was validated by the caller."""
        line = encode_dead(task)  # Implements S-4: serialize before taking the lock.
        env = self._env
        with self._locked("add a task to"):
            self._settle_compaction()
            fd = self._open_data(OpenFlag.READ | OpenFlag.WRITE | OpenFlag.APPEND)
            created = fd is None
            if fd is None:
                # S-1: someone removed the data file; recreate it and make its name durable.
                fd = env.open(self._data, OpenFlag.READ | OpenFlag.WRITE | OpenFlag.APPEND
                              | OpenFlag.CREATE, FILE_MODE)
            try:
                self._append_durably(fd, line)
            finally:
                env.close(fd)
            if created:
                try:
                    env.fsync_dir(self._path)
                except OSError as exc:
                    raise self._fail_stop("fsync of the storage directory failed", exc) from exc
        return task.id

    def _append_durably(self, fd: int, line: bytes) -> None:
        """Implements S-4: cut a torn tail, append, fsync; on failure cut the append back.

        Cutting back leaves no partial or unacknowledged line for the next add to
        build on. After a failed fsync the kernel may have dropped the pages and
        would report success next time (A-7), so the store also fail-stops.
        """
        env = self._env
        size = repair_tail(env, fd)
        try:
            write_all(env, fd, line)
        except OSError:
            self._cut_back(fd, size)
            raise
        try:
            env.fsync(fd)
        except OSError as exc:
            self._cut_back(fd, size)
            raise self._fail_stop("fsync of the dead-task data file failed", exc) from exc

    def _cut_back(self, fd: int, size: int) -> None:
        try:
            self._env.ftruncate(fd, size)
        except OSError as exc:
            raise self._fail_stop("a failed dead-task write could not be cut back", exc) from exc

    def list_tasks(self, limit: int | None, offset: int) -> list[DeadTask]:
        """Dead tasks newest first, each id once at its latest record (S-6, R-@H)."""
        if limit == 0:
            self._check_usable()
            return []
        return self._scan_newest_first(None, offset, limit)

    def find(self, task_id: str) -> DeadTask | None:
        """The latest record of ``task_id``, or None (S-6, R-@H)."""
        found = self._scan_newest_first(task_id, 0, 1)
        return found[0] if found else None

    def _scan_newest_first(self, only_id: str | None, offset: int,
                           limit: int | None) -> list[DeadTask]:
        """Up to ``limit`` decoded tasks newest first, read backwards in chunks under the lock.

        The first ``offset`` distinct ids (latest records with a valid frame) are
        skipped without decoding their payloads, so only their ids are held (D-14).
        Stops reading as soon as it has ``limit`` tasks, or, for ``only_id``, at the
        latest record of that id (whether or not its payload decodes).
        """
        env = self._env
        out: list[DeadTask] = []
        with self._locked("read tasks from"):
            fd = self._open_data(OpenFlag.READ)
            if fd is None:
                return out
            seen: set[str] = set()
            corrupt = 0
            # For find, lines of other ids are skipped by a prefix test before any CRC work
            # (S-7: find counts damage only among the requested id's lines).
            wanted_prefix = None if only_id is None else (
                b"dead_task:" + only_id.encode("utf-8") + b":")
            try:
                for raw in lines_backward(env, fd, env.fstat(fd).size):
                    if wanted_prefix is not None and (
                            raw.data is None or wanted_prefix not in raw.data):
                        continue
                    framed, _, faults = _dead_line(raw)
                    corrupt += faults
                    if framed is None:
                        continue
                    if framed.task_id in seen or (only_id is not None and framed.task_id != only_id):
                        continue
                    seen.add(framed.task_id)
                    if offset:
                        offset -= 1
                        continue
                    task = decode_dead_payload(framed)
                    if isinstance(task, BadLine):
                        log.error("Can't deserialize the dead-lettered task with id %s",
                                  framed.task_id)
                    else:
                        out.append(task)
                    if only_id is not None or (limit is not None and len(out) >= limit):
                        break
            finally:
                env.close(fd)
            if corrupt:
                log.warning("Detected %d corrupted dead-lettered task record(s) in %s",
                            corrupt, self._data)
        return out

    def remove(self, task_ids: set[str]) -> int:
        """Compact away every record of the given ids (S-5); return how many ids were found."""
        if not task_ids:
            self._check_usable()  # C-9, W-14: refused even as a no-op.
            return 0  # Implements S-5: no lock, no file touched.
        env = self._env
        with self._locked("delete tasks from"):
            self._settle_compaction()
            tmp_fd = env.open(self._tmp, OpenFlag.WRITE | OpenFlag.CREATE | OpenFlag.TRUNCATE,
                              FILE_MODE)
            try:
                found = self._copy_survivors(tmp_fd, task_ids)
                if found:
                    env.fsync(tmp_fd)  # A failure leaves the live file untouched: no fail-stop.
            finally:
                env.close(tmp_fd)
            if not found:
                env.unlink(self._tmp)  # Implements S-5: the live file stays byte-identical.
                return 0
            # Implements S-9: mark the rename in flight, so that if this process dies before
            # the directory fsync, the next writer under the lock makes the rename durable
            # before it acknowledges anything written to the new inode.
            env.ftruncate(self._lock_fd, COMPACTION_MARK_BYTES)
            env.rename(self._tmp, self._data)
            self._fsync_dir_after_rename()
            return len(found)

    def _fsync_dir_after_rename(self) -> None:
        try:
            self._env.fsync_dir(self._path)
        except OSError as exc:
            # The rename may be undone by a power loss, and with it any add that a later
            # operation makes to the new inode: stop (D-10, A-7). The mark stays set.
            raise self._fail_stop("fsync of the storage directory after compaction failed",
                                  exc) from exc
        self._env.ftruncate(self._lock_fd, 0)

    def _settle_compaction(self) -> None:
        """Implements S-9: finish the directory fsync of a compaction whose process died."""
        if self._env.fstat(self._lock_fd).size != 0:
            log.warning("a compaction of %s ended before its rename was made durable; "
                        "fsyncing the directory now", self._data)
            self._fsync_dir_after_rename()

    def _copy_survivors(self, tmp_fd: int, task_ids: set[str]) -> set[str]:
        env = self._env
        fd = self._open_data(OpenFlag.READ)
        if fd is None:
            return set()
        found: set[str] = set()
        batch: list[bytes] = []
        batch_bytes = 0
        dropped = 0
        try:
            for raw in lines_forward(env, fd, env.fstat(fd).size):
                framed, data, faults = _dead_line(raw)
                dropped += faults  # Damage is dropped by compaction (R-@B..R-@F, R-@K).
                if framed is None or data is None:
                    continue
                if framed.task_id in task_ids:
                    found.add(framed.task_id)
                    continue
                batch.append(data + b"\n")
                batch_bytes += len(data) + 1
                if batch_bytes >= WRITE_BATCH_BYTES:
                    write_all(env, tmp_fd, b"".join(batch))
                    batch, batch_bytes = [], 0
            write_all(env, tmp_fd, b"".join(batch))
        finally:
            env.close(fd)
        if dropped and found:
            log.warning("Compaction of %s dropped %d corrupted dead-lettered task record(s)",
                        self._data, dropped)
        return found

    def close(self) -> None:
        """Release the lock file descriptor. Idempotent."""
        with self._local:
            if self._closed:
                return
            self._closed = True
            self._env.close(self._lock_fd)
