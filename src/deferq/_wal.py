"""The tasks WAL: one append-only file per worker process (spec/wal.md).

Theory of operation. At open, a worker claims every WAL file of its prefix
that no live process holds (LOCK_EX | LOCK_NB, W-2). The first claimed file in
name order becomes its main file; others are orphans of dead workers. The main
file's torn tail is cut and the cut fsynced before anything is appended to it
(W-3). Orphans are merged: their valid records are appended to the main file,
which is fsynced, and only then are the orphans unlinked and the directory
fsynced (W-4). With nothing to claim, a new file is created and the directory
fsynced before any record goes into it (W-1).

Every pending task's ``add`` line is kept in memory (``_live``), so rotation
(W-9) can write them all to a fresh file, fsync it and the directory, and
only then unlink the old file while still holding its lock (W-10). Because
every live task is copied, outstanding immediate tasks never block rotation
(the reference's leaking counter, W-11).

Writes go to the OS at once; fsync happens every ``fsync_frequency`` seconds,
driven by ``tick()`` (called by the Env's timer, or by tests) and checked on
every write, or inline when the frequency is 0 (W-8). A failed fsync is never
retried: the WAL becomes BROKEN and refuses all work (W-12, D-10).
"""

from __future__ import annotations

import enum
import logging
from binascii import a2b_base64
import threading
from typing import Final

from deferq._env import Env, OpenFlag
from deferq._errors import StorageBrokenError, StorageClosedError
from deferq._format import (
    BadLine,
    WalAdd,
    decode_wal_line,
    encode_add,
    encode_rem,
    is_wal_file_name,
    wal_file_name,
)
from deferq._ids import id_source
from deferq._io import join, lines_forward, repair_tail, write_all
from deferq._limits import (
    FILE_MODE,
    WAL_SIZE_INCREASE_RATIO,
    WAL_SIZE_LIMIT_BYTES,
    WRITE_BATCH_BYTES,
)
from deferq._recovery import LiveTask, WalReplay
from deferq._types import PendingTask

log = logging.getLogger("deferq")

_RW_APPEND: Final = OpenFlag.READ | OpenFlag.WRITE | OpenFlag.APPEND
_CREATE_ATTEMPTS_MAX: Final = 16


class WalState(enum.Enum):
    OPEN = "open"
    BROKEN = "broken"
    CLOSED = "closed"


class TasksWal:
    """One worker's write-ahead log of pending tasks. Thread-safe."""

    def __init__(self, env: Env, path: str, prefix: str, fsync_frequency_s: float) -> None:
        self._env = env
        self._path = path
        self._prefix = prefix
        self._fsync_frequency_s = fsync_frequency_s
        self._mutex = threading.Lock()
        self._pid = env.getpid()
        self._state = WalState.OPEN
        self._dirty = False
        self._last_sync_s = env.monotonic()
        self._held_fds: list[int] = []  # files kept locked until close (see _discard_copy)
        self.corrupt_records = 0
        claimed = self._claim_orphans()
        owned = [fd for _, fd in claimed]
        try:
            if claimed:
                self._name, self._fd = claimed[0]
            else:
                self._name, self._fd = self._create_file()
                owned = [self._fd]
            replay = WalReplay()
            for raw in lines_forward(env, self._fd, env.fstat(self._fd).size):
                replay.apply(raw)  # R-@F: the main file's torn tail is counted here, cut below.
            if claimed:
                self._repair_main_tail()
            self._merge(claimed[1:], replay)
        except BaseException:
            self._close_fds(owned)
            raise
        self._live: dict[str, LiveTask] = replay.live
        self._size = env.fstat(self._fd).size
        self._limit = WAL_SIZE_LIMIT_BYTES
        self.corrupt_records = replay.corrupt
        if replay.corrupt:
            log.warning("Detected %d corrupted deferred task record(s) in %s",
                        replay.corrupt, join(path, self._name))
        # Implements W-5: ids start above every id seen and above the clock.
        self._ids = id_source(env)
        self._ids.raise_floor(replay.seed_max + 1)

    # ------------------------------------------------------------------ opening

    def _claim_orphans(self) -> list[tuple[str, int]]:
        """Lock every WAL file no live process holds (W-2), sorted by name."""
        env = self._env
        names = sorted(n for n in env.listdir(self._path) if is_wal_file_name(self._prefix, n))
        claimed: list[tuple[str, int]] = []
        try:
            for name in names:
                try:
                    fd = env.open(join(self._path, name), _RW_APPEND)
                except FileNotFoundError:
                    continue  # Unlinked by its owner (rotation or merge) since listdir.
                # Implements W-2: a file unlinked between open and flock is a ghost; skip it.
                if env.flock_exclusive_nb(fd) and env.fstat(fd).links > 0:
                    claimed.append((name, fd))
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
                fd = env.open(join(self._path, name), _RW_APPEND | OpenFlag.CREATE
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
                    raise StorageBrokenError(f"could not make new WAL file {name} durable") from exc
                raise
            if not taken:
                # A booting worker listed and claimed the file between our create and our
                # flock (W-2): it is that worker's file now (or it merged and unlinked it),
                # so never unlink it and never write to it; use another name.
                env.close(fd)
                continue
            return name, fd
        raise FileExistsError(f"could not pick an unused WAL file name in {self._path}")

    def _repair_main_tail(self) -> None:
        """Implements W-3: cut a torn tail, then fsync the file and its directory.

        Both fsyncs are unconditional: a killed owner may have left acknowledged
        but unsynced records in the page cache, or died (or lost a race with us,
        see ``_create_file``) before it fsynced the directory after creating the
        file; after open every recovered task and the file's name are durable
        (D-3, D-6).
        """
        repair_tail(self._env, self._fd)
        self._env.fsync(self._fd)
        self._env.fsync_dir(self._path)

    def _merge(self, orphans: list[tuple[str, int]], replay: WalReplay) -> None:
        """Implements W-4: copy orphans' valid records, fsync, then unlink the orphans."""
        if not orphans:
            return
        env = self._env
        batch: list[bytes] = []
        batch_bytes = 0
        for _, fd in orphans:
            for raw in lines_forward(env, fd, env.fstat(fd).size):
                valid = replay.apply(raw)
                if valid:
                    batch.append(valid + b"\n")
                    batch_bytes += len(valid) + 1
                    if batch_bytes >= WRITE_BATCH_BYTES:
                        write_all(env, self._fd, b"".join(batch))
                        batch, batch_bytes = [], 0
        write_all(env, self._fd, b"".join(batch))
        env.fsync(self._fd)
        for name, _ in orphans:
            self._unlink_quietly(name)
        env.fsync_dir(self._path)
        self._close_fds([fd for _, fd in orphans])

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

    # ------------------------------------------------------------------ operations

    @property
    def file_name(self) -> str:
        """The name of the current main file (it changes at rotation)."""
        return self._name

    def add(self, context: bytes, publish_at: int | None, task_id: str | None) -> str:
        """Append an ``add`` record; arguments were validated by the caller (W-6)."""
        with self._mutex:
            self._check_usable()
            if task_id is None:
                task_id = self._ids.next_id(self._pid)
            line = encode_add(task_id, publish_at, context)
            self._append(line)
            # Implements W-7 and R-@J: a re-added id replaces the task, keeping its position.
            self._live[task_id] = LiveTask(publish_at, line)
            self._after_write()
            return task_id

    def remove(self, task_id: str) -> None:
        """Append a ``rem`` record if the task is pending here, then maybe rotate (W-6, W-9)."""
        with self._mutex:
            self._check_usable()
            if task_id not in self._live:
                return  # Implements W-6: nothing in this WAL to remove, nothing to write.
            self._append(encode_rem(task_id))
            del self._live[task_id]
            self._after_write()
            if self._size >= self._limit:
                self._rotate()

    def pending(self) -> list[PendingTask]:
        """Every task pending in this WAL now, each id once, in first-insertion order (W-7)."""
        with self._mutex:
            self._check_usable()
            # Every live line was checked (CRC and fields) when it was written or replayed,
            # so only its payload field is decoded here; check_invariants re-checks it all.
            return [PendingTask(task_id, a2b_base64(task.line[:-1].split(b":", 4)[4]),
                                task.publish_at)
                    for task_id, task in self._live.items()]

    def sync(self) -> None:
        """fsync now if anything was written since the last fsync (W-8)."""
        with self._mutex:
            self._check_usable()
            self._sync_locked()

    def tick(self) -> None:
        """The periodic timer fired: fsync if anything is unsynced (W-8).

        Never raises for a closed WAL: the timer may fire while ``close`` runs.
        """
        with self._mutex:
            if self._state is WalState.OPEN and self._dirty:
                self._sync_locked()

    def close(self) -> None:
        """fsync if usable, then release the lock and the file (C-9). Idempotent."""
        with self._mutex:
            if self._state is WalState.CLOSED:
                return
            try:
                if self._state is WalState.OPEN:
                    self._sync_locked()
            finally:
                self._state = WalState.CLOSED
                self._close_fds([self._fd, *self._held_fds])

    @property
    def broken(self) -> bool:
        return self._state is WalState.BROKEN

    def check_invariants(self) -> None:
        """Assert the in-memory state agrees with itself (used by tests)."""
        with self._mutex:
            if self._state is WalState.CLOSED:
                return
            assert self._size >= 0 and self._limit >= WAL_SIZE_LIMIT_BYTES
            for task_id, task in self._live.items():
                record = decode_wal_line(task.line[:-1])
                assert isinstance(record, WalAdd) and record.task_id == task_id
                assert record.publish_at == task.publish_at

    # ------------------------------------------------------------------ internals

    def _check_usable(self) -> None:
        if self._state is WalState.CLOSED:
            raise StorageClosedError("the Disk backend is closed")
        if self._state is WalState.BROKEN:
            raise StorageBrokenError(
                "the tasks WAL failed to write or fsync earlier and refuses work; restart the worker")
        if self._env.getpid() != self._pid:
            raise RuntimeError(
                f"this Disk was opened by process {self._pid}; a forked child must open its own")

    def _append(self, line: bytes) -> None:
        """Write one whole line; on failure cut any partial line back off (W-13)."""
        try:
            write_all(self._env, self._fd, line)
        except OSError:
            try:
                self._env.ftruncate(self._fd, self._size)
            except OSError as exc:
                self._state = WalState.BROKEN
                raise StorageBrokenError("a WAL write failed and its partial line could not be"
                                         " cut off") from exc
            raise
        self._size += len(line)

    def _after_write(self) -> None:
        self._dirty = True
        if self._fsync_frequency_s == 0 or self._sync_due():
            self._sync_locked()

    def _sync_due(self) -> bool:
        return self._dirty and (
            self._env.monotonic() - self._last_sync_s >= self._fsync_frequency_s)

    def _sync_locked(self) -> None:
        if not self._dirty:
            return
        try:
            self._env.fsync(self._fd)
        except OSError as exc:
            # Implements W-12: never retry; the unsynced pages may already be gone.
            self._state = WalState.BROKEN
            raise StorageBrokenError("fsync of the tasks WAL failed; the backend stops") from exc
        self._dirty = False
        self._last_sync_s = self._env.monotonic()

    def _discard_copy(self, name: str, fd: int, cause: OSError) -> None:
        """Implements W-10: durably unlink a failed rotation's copy, or fail-stop.

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
            self._state = WalState.BROKEN
            raise StorageBrokenError(
                f"rotation failed ({cause}) and its copy {name} could not be durably removed"
            ) from exc
        self._close_fds([fd])

    def _rotate(self) -> None:
        """Implements W-9 and W-10: copy live tasks to a new file, then drop the old one."""
        env = self._env
        try:
            name, fd = self._create_file()
        except StorageBrokenError:
            self._state = WalState.BROKEN
            raise
        except OSError:
            log.warning("WAL rotation could not create a new file; will retry later", exc_info=True)
            self._limit = int(self._size * WAL_SIZE_INCREASE_RATIO)
            return
        try:
            # Implements W-5: a marker carrying the current seed keeps ids issued before
            # the rotation (whose records the old file takes with it) from being reissued.
            write_all(env, fd, encode_rem(f"{self._ids.current_seed()}-{self._pid}-0"))
            lines = [task.line for task in self._live.values()]
            for start in range(0, len(lines), 1024):
                write_all(env, fd, b"".join(lines[start:start + 1024]))
            env.fsync(fd)
        except OSError as exc:
            log.warning("WAL rotation failed to copy live tasks; keeping the old file",
                        exc_info=True)
            self._discard_copy(name, fd, exc)
            self._limit = int(self._size * WAL_SIZE_INCREASE_RATIO)
            return
        old_name, old_fd = self._name, self._fd
        self._name, self._fd = name, fd
        self._size = env.fstat(fd).size
        self._dirty = False
        self._limit = WAL_SIZE_LIMIT_BYTES
        while self._size * WAL_SIZE_INCREASE_RATIO >= self._limit:
            self._limit = int(self._limit * WAL_SIZE_INCREASE_RATIO)
        try:
            # The old file is unlinked while still locked, so no booting worker can claim it.
            self._unlink_quietly(old_name)
            env.fsync_dir(self._path)
        except OSError as exc:
            # If the old file survived, replaying it after the new one could undo removals
            # recorded from now on (D-3), so stop here: a restart adopts both files safely.
            self._state = WalState.BROKEN
            raise StorageBrokenError(f"could not durably unlink rotated WAL file {old_name}") from exc
        finally:
            self._close_fds([old_fd])
