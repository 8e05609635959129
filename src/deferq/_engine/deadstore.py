"""The dead-task store: one shared, append-only file for all workers (spec/dead-tasks.md).

Theory of operation (the reference design, ../shared/reference/dead-letter-design.md):
- Three names: the data file (renamed over by compaction), the lock file
  (never renamed or unlinked, so every process serializes on one inode, S-2)
  and the compaction staging file ``.tmp``.
- Every operation takes the lock file with LOCK_EX | LOCK_NB *and* a
  process-local mutex in one bounded retry loop (L-1..L-3), then opens the data
  file by path: no data descriptor outlives an operation (S-3), so nobody
  writes to an inode a compaction has replaced.
- add: serialize first, then under the lock cut a torn tail, append, fsync
  (S-4). Threads of one process that add at once are committed as a group: the
  thread holding the locks appends every queued line in one write and one
  fsync (S-14). remove: survivors to ``.tmp``, fsync, rename, fsync the
  directory; with no match the live file is untouched and nothing is fsynced
  (S-5). list/find read backwards from the newest end in bounded chunks (S-6),
  or, once built, through a per-process index of the data file that is checked
  against the file under the lock before each use (S-10..S-13, ``_deadindex``).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
from typing import Final

from deferq._engine.compact import copy_survivors
from deferq._engine.deadindex import (
    DeadIndex,
    NeedleScan,
    RecordReader,
    StaleIndex,
    dead_line,
)
from deferq._engine.env import Env, FileStat, OpenFlag
from deferq._core.errors import DeadTasksLockTimeout, StorageBrokenError, StorageClosedError
from deferq._core.format import (
    BadLine,
    dead_data_name,
    dead_lock_name,
    dead_tmp_name,
    decode_dead_payload,
    decode_dead_record,
    encode_dead,
)
from deferq._engine.io import join, lines_backward, repair_tail, write_all
from deferq._core.limits import (
    FILE_MODE,
    GROUP_COMMIT_ROUNDS_MAX,
    LINE_BYTES_MAX,
    LOCK_ATTEMPTS_MAX,
    lock_sleep_s,
)
from deferq._core.types import DeadTask

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


_APPEND: Final = OpenFlag.READ | OpenFlag.WRITE | OpenFlag.APPEND  # computed once: enum | costs
_APPEND_CREATE: Final = _APPEND | OpenFlag.CREATE

# The lock file holds no data; its size says whether a compaction's rename may not be
# durable yet (S-9): 0 = settled, COMPACTION_MARK_BYTES = a rename is in flight.
COMPACTION_MARK_BYTES = 1


class _AddRequest:
    """One caller's line waiting for a group commit (S-14)."""

    __slots__ = ("claimed", "committer", "error", "finished", "line")

    def __init__(self, line: bytes) -> None:
        self.line = line
        self.claimed = False  # a leader took it: only that leader may finish it
        self.finished = False
        self.error: BaseException | None = None
        self.committer = 0  # the thread id of the leader that wrote it


class DeadTaskStore:
    """The shared dead-task store of one storage directory and prefix. Thread-safe."""

    _index_class: type[DeadIndex] = DeadIndex  # S-10 (a mutant swaps it for a weaker one)

    def __init__(self, env: Env, path: str, prefix: str) -> None:
        self._env = env
        self._path = path
        self._data = join(path, dead_data_name(prefix))
        self._tmp = join(path, dead_tmp_name(prefix))
        self._local = threading.Lock()
        self._closed = False
        self._broken = False
        self._pid = env.getpid()
        self._init_process_state()
        # Implements S-1: the lock file is opened once and kept; it is never renamed.
        self._lock_fd = env.open(join(path, dead_lock_name(prefix)),
                                 OpenFlag.READ | OpenFlag.WRITE | OpenFlag.CREATE, FILE_MODE)
        try:
            self._create_data_file()
        except BaseException:
            env.close(self._lock_fd)
            raise

    def _create_data_file(self) -> None:
        """Implements S-1 / D-6: create the data file without truncating it and make its
        name durable before any dead task can leave a WAL."""
        self._env.close(self._env.open(self._data, OpenFlag.READ | OpenFlag.WRITE
                                       | OpenFlag.CREATE, FILE_MODE))
        self._env.fsync_dir(self._path)

    def _init_process_state(self) -> None:
        """The group-commit queue (S-14) and the per-process index (S-10), both empty."""
        # The condition's lock, taken directly where no wait or notify is needed: holding it
        # is holding the condition, and Condition.__enter__ is a Python-level call.
        self._mutex = threading.Lock()
        self._cond = threading.Condition(self._mutex)
        self._queue: list[_AddRequest] = []
        self._leading = False
        self._waiting = 0  # threads inside cond.wait() (S-14): notify only when some are
        self._index: DeadIndex | None = None
        # Bytes read by scans since the index was last dropped (S-11's build rule).
        self._cold_bytes = 0

    # ------------------------------------------------------------------ locking

    def _locked(self, operation: str) -> contextlib.AbstractContextManager[None]:
        """Implements L-1..L-3: both locks, non-blocking, bounded retries.

        Taken on ``__enter__`` by ``_Held`` (a plain context manager: a generator-based
        one costs a few microseconds more per dead-task call).
        """
        return _Held(self, operation)

    def _acquire(self, operation: str) -> None:
        """Take the process-local mutex and the flock in one bounded retry loop (L-1..L-3)."""
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
                    return
                self._local.release()
            if attempt == LOCK_ATTEMPTS_MAX:
                raise DeadTasksLockTimeout(f"Could not lock the dead tasks store to {operation} it")
            env.sleep(lock_sleep_s(attempt))

    def _release(self) -> None:
        """Implements L-4: release both locks, the mutex even if the unlock fails."""
        try:
            self._env.flock_unlock(self._lock_fd)
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
        self._index = None
        return StorageBrokenError(message)

    def _open_data(self, flags: OpenFlag) -> int | None:
        """Open the data file by path (S-3); None when it does not exist."""
        try:
            return self._env.open(self._data, flags)
        except FileNotFoundError:
            return None

    # ------------------------------------------------------------------ the index

    def _drop_index(self) -> None:
        self._index = None
        self._cold_bytes = 0

    def _checked_index(self, fd: int, stat: FileStat, *, build: bool = False) -> DeadIndex | None:
        """Implements S-10, S-11: the index, checked against ``fd`` and extended; or None.

        With no usable index, one is built from the whole file when ``build`` is
        set or when scans since the last drop have read as many bytes as the file
        holds (so a build costs at most one more scan's worth of work per scan).
        """
        env = self._env
        index = self._index
        if index is None and not (
                build or (stat.size and self._cold_bytes >= stat.size)):
            return None
        lock_ctime = env.fstat(self._lock_fd).ctime_ns
        if index is not None and not index.usable(env, fd, stat, lock_ctime):
            self._drop_index()
            index = None
            if not build:
                return None
        if index is None:
            index = self._index_class(stat, lock_ctime)
        try:
            index.extend(env, fd, stat.size)
        except BaseException:
            self._drop_index()
            raise
        self._index = index
        return index

    # ------------------------------------------------------------------ operations

    def add(self, task: DeadTask) -> str:
        """Append one dead task durably (S-4), committed with concurrent adds (S-14).

        ``task`` was validated by the caller.
        """
        line = encode_dead(task)  # Implements S-4: serialize before locking.
        with self._mutex:
            # Implements S-14. A caller that finds no leader and nothing queued leads at once
            # with its own line as the first batch: no request to hand over, its error is
            # its own (the usual case, one thread adding).
            solo = not self._leading and not self._queue
            if solo:
                self._leading = True
        if solo:
            try:
                self._lead_adds(line)
            finally:
                self._end_lead()
            return task.id
        return self._add_queued(_AddRequest(line), task.id)

    def _add_queued(self, request: _AddRequest, task_id: str) -> str:
        """S-14 with a leader at work or lines queued: queue, then wait or lead."""
        cond = self._cond
        with self._mutex:
            self._queue.append(request)
            # Implements S-14: one thread of this process at a time tries to take the locks
            # for the queued lines (the leader); the others wait for its outcome.
            while not request.finished and self._leading:
                self._waiting += 1
                try:
                    cond.wait()
                finally:
                    self._waiting -= 1
            lead = not request.finished
            if lead:
                self._leading = True
        if lead:
            try:
                self._lead_adds()
            finally:
                self._end_lead()
        error = request.error
        if error is not None:
            if request.committer == threading.get_ident():
                raise error
            # Another thread's batch failed with this line in it (S-14): the same error,
            # as a copy, so that each thread's traceback is its own.
            clone = copy.copy(error)
            clone.__cause__ = error.__cause__
            raise clone
        return task_id

    def _end_lead(self) -> None:
        """The leader is done: a waiting caller (if any) may lead next (S-14)."""
        with self._mutex:
            self._leading = False
            if self._waiting:  # a notify costs microseconds; nobody may be waiting
                self._cond.notify_all()

    def _lead_adds(self, first: bytes | None = None) -> None:
        """Implements S-14: take the locks, then commit the queued lines in rounds.

        ``first`` is the leader's own line when it queued none (``add``'s solo case):
        it is the first round's batch, alone, and a failure to write it is raised
        here after the locks are released, as a failed batch fails its callers.
        If the locks cannot be taken (L-3) or the store refuses work, every line still
        queued fails with that error, none of it written; the exception propagates.
        """
        cond = self._cond
        mutex = self._mutex
        me = threading.get_ident()
        first_error: BaseException | None = None
        try:
            with self._locked("add a task to"):
                rounds = GROUP_COMMIT_ROUNDS_MAX
                if first is not None:
                    rounds -= 1
                    try:
                        self._append_batch([first])
                    except BaseException as exc:  # raised once the locks are released
                        first_error = exc
                        rounds = 0
                for _ in range(rounds):
                    with mutex:
                        batch, self._queue = self._queue, []
                        for queued in batch:
                            queued.claimed = True
                            queued.committer = me
                    if not batch:
                        break
                    error: BaseException | None = None
                    try:
                        self._append_batch([queued.line for queued in batch])
                    except BaseException as exc:  # every caller of the batch gets it (S-14)
                        error = exc
                    with mutex:
                        for queued in batch:
                            queued.error = error
                            queued.finished = True
                        if self._waiting:
                            cond.notify_all()
                    if error is not None:
                        break
        except BaseException as exc:
            with mutex:
                left, self._queue = self._queue, []
                for queued in left:  # L-3, D-8: withdrawn, nothing of them was written
                    queued.error = exc
                    queued.committer = me
                    queued.finished = True
                cond.notify_all()
            raise
        if first_error is not None:
            raise first_error

    def _append_batch(self, lines: list[bytes]) -> None:
        """One write and one fsync for every line of a group (S-4, S-14), under the locks."""
        env = self._env
        self._settle_compaction()
        fd = self._open_data(_APPEND)
        created = fd is None
        if fd is None:
            # S-1: someone removed the data file; recreate it and make its name durable.
            fd = env.open(self._data, _APPEND_CREATE, FILE_MODE)
        try:
            index = None if self._index is None else self._checked_index(fd, env.fstat(fd))
            self._append_durably(fd, lines[0] if len(lines) == 1 else b"".join(lines))
            if index is not None:
                try:
                    index.extend(env, fd, env.fstat(fd).size)  # S-10: our own append
                except OSError:
                    self._drop_index()  # the add is durable; only the index is lost
        finally:
            env.close(fd)
        if created:
            try:
                env.fsync_dir(self._path)
            except OSError as exc:
                raise self._fail_stop("fsync of the storage directory failed", exc) from exc

    def _append_durably(self, fd: int, line: bytes) -> None:
        """Implements S-4: cut a torn tail, append, fsync; on failure cut the append back.

        Cutting back leaves no partial or unacknowledged line for the next add to
        build on. After a failed fsync the kernel may have dropped the pages and
        would report success next time (A-7), so the store also fail-stops.
        """
        env = self._env
        size = repair_tail(env, fd)
        try:
            written = env.write(fd, line)  # one write nearly always takes it all
            if written != len(line):
                if written <= 0:
                    raise OSError(f"write returned {written} with {len(line)} bytes left")
                write_all(env, fd, line[written:])
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
        env = self._env
        with self._locked("read tasks from"):
            fd = self._open_data(OpenFlag.READ)
            if fd is None:
                return []
            try:
                stat = env.fstat(fd)
                # S-11: a list of everything reads the whole file anyway: index it first.
                index = self._checked_index(fd, stat, build=limit is None)
                if index is not None:
                    try:
                        return self._list_indexed(index, fd, stat.size, offset, limit)
                    except StaleIndex:
                        self._drop_index()
                return self._scan_newest_first(fd, stat.size, offset, limit)
            finally:
                env.close(fd)

    def find(self, task_id: str) -> DeadTask | None:
        """The latest record of ``task_id``, or None (S-6, R-@H)."""
        env = self._env
        with self._locked("read tasks from"):
            fd = self._open_data(OpenFlag.READ)
            if fd is None:
                return None
            try:
                stat = env.fstat(fd)
                index = self._checked_index(fd, stat)
                if index is not None:
                    try:
                        return self._find_indexed(index, fd, stat.size, task_id)
                    except StaleIndex:
                        self._drop_index()
                return self._find_scan(fd, stat.size, task_id)
            finally:
                env.close(fd)

    def _report(self, corrupt: int, undecodable: list[str]) -> None:
        """Implements S-7: one error per undecodable record, one warning for the damage."""
        for task_id in undecodable:
            log.error("Can't deserialize the dead-lettered task with id %s", task_id)
        if corrupt:
            log.warning("Detected %d corrupted dead-lettered task record(s) in %s",
                        corrupt, self._data)

    def _list_indexed(self, index: DeadIndex, fd: int, size: int, offset: int,
                      limit: int | None) -> list[DeadTask]:
        """Implements S-11, S-12: the page of S-6 read through the index."""
        out: list[DeadTask] = []
        undecodable: list[str] = []
        stop = 0  # a scan that does not fill the page reads the whole file
        reader = RecordReader(index, self._env, fd)
        everything = len(index.offs)
        for position in index.newest(offset):
            task = decode_dead_record(index.ids[position], reader.read(
                position, everything if limit is None else limit - len(out)))
            if isinstance(task, BadLine):
                undecodable.append(index.ids[position])
            else:
                out.append(task)
                if limit is not None and len(out) >= limit:
                    stop = index.key(position)
                    break
        corrupt = (1 if size > index.end else 0) + sum(
            damage.faults for damage in index.damage_from(stop))
        self._report(corrupt, undecodable)
        return out

    def _find_indexed(self, index: DeadIndex, fd: int, size: int,
                      task_id: str) -> DeadTask | None:
        """Implements S-11, S-12: find through the index, counting damage as S-7 says."""
        env = self._env
        needle = _needle(task_id)
        position = index.latest.get(task_id)
        payload = None if position is None else RecordReader(index, env, fd).read(position, 1)
        corrupt = 0
        if index.end < size <= index.end + LINE_BYTES_MAX:
            corrupt += needle in env.pread(fd, size - index.end, index.end)
        for damage in index.damage_from(0 if position is None else index.key(position)):
            if damage.readable and damage.length >= len(needle):
                if needle in env.pread(fd, damage.length, damage.start):
                    corrupt += damage.faults
        found = None if payload is None else decode_dead_record(task_id, payload)
        self._report(corrupt, [task_id] if isinstance(found, BadLine) else [])
        return found if isinstance(found, DeadTask) else None

    def _find_scan(self, fd: int, size: int, task_id: str) -> DeadTask | None:
        """Implements S-6, S-7, S-13: the lines holding the id's body prefix, newest first."""
        scan = NeedleScan(self._env, fd, size, _needle(task_id))
        corrupt = 0
        found: DeadTask | None = None
        undecodable: list[str] = []
        for raw in scan.lines():
            framed, _, faults = dead_line(raw)
            corrupt += faults
            if framed is None or framed.task_id != task_id:
                continue
            task = decode_dead_payload(framed)
            if isinstance(task, BadLine):
                undecodable.append(task_id)
            else:
                found = task
            break
        self._cold_bytes += scan.bytes_read
        self._report(corrupt, undecodable)
        return found

    def _scan_newest_first(self, fd: int, size: int, offset: int,
                           limit: int | None) -> list[DeadTask]:
        """Up to ``limit`` decoded tasks newest first, read backwards in chunks under the lock.

        The first ``offset`` distinct ids (latest records with a valid frame) are
        skipped without decoding their payloads, so only their ids are held (D-14).
        Stops reading as soon as it has ``limit`` tasks.
        """
        out: list[DeadTask] = []
        seen: set[str] = set()
        corrupt = 0
        low = size
        undecodable: list[str] = []
        for raw in lines_backward(self._env, fd, size):
            low = raw.offset
            framed, _, faults = dead_line(raw)
            corrupt += faults
            if framed is None or framed.task_id in seen:
                continue
            seen.add(framed.task_id)
            if offset:
                offset -= 1
                continue
            task = decode_dead_payload(framed)
            if isinstance(task, BadLine):
                undecodable.append(framed.task_id)
            else:
                out.append(task)
            if limit is not None and len(out) >= limit:
                break
        self._cold_bytes += size - low
        self._report(corrupt, undecodable)
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
            self._drop_index()  # S-10: the data file is about to be another inode
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
        """Implements S-9: finish the directory fsync of a compaction whose process died.

        The mark is the lock file's size, 0 or ``COMPACTION_MARK_BYTES``: a read of its
        first byte tells the two apart in one system call, like an fstat, without
        building a stat result (about 9k instructions, 5 % of a dead-task add).
        """
        if self._env.pread(self._lock_fd, COMPACTION_MARK_BYTES, 0):
            log.warning("a compaction of %s ended before its rename was made durable; "
                        "fsyncing the directory now", self._data)
            self._fsync_dir_after_rename()

    def _copy_survivors(self, tmp_fd: int, task_ids: set[str]) -> set[str]:
        """Implements S-5, S-15: copy every valid record not requested to ``tmp_fd``.

        Returns the requested ids found; logs the damaged lines dropped (S-7).
        """
        env = self._env
        fd = self._open_data(OpenFlag.READ)
        if fd is None:
            return set()
        try:
            found, dropped = copy_survivors(env, fd, tmp_fd, task_ids)
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
            self._index = None
            self._env.close(self._lock_fd)


class _Held:
    """The locks of one dead-task operation, held between ``__enter__`` and ``__exit__``."""

    __slots__ = ("_operation", "_store")

    def __init__(self, store: DeadTaskStore, operation: str) -> None:
        self._store = store
        self._operation = operation

    def __enter__(self) -> None:
        self._store._acquire(self._operation)

    def __exit__(self, *exc_info: object) -> None:
        self._store._release()


def _needle(task_id: str) -> bytes:
    """The body prefix of ``task_id``'s records: find's filter before any CRC work (S-7)."""
    return b"dead_task:" + task_id.encode("utf-8") + b":"
