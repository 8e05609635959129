"""The tasks WAL: one append-only file per worker process (spec/wal.md).

Theory of operation. At open, a worker claims every WAL file of its prefix
that no live process holds (LOCK_EX | LOCK_NB, W-2): orphans of dead workers.
It replays them in name order and writes the pending tasks into a fresh file
of its own, fsyncs it, and only then unlinks the claimed files, still locked,
and fsyncs the directory (W-3, W-4): an adopted file is never appended to, nor
trusted to be on disk, since a previous owner's failed fsync may have left its
records only in the page cache (A-7). With nothing to claim, a new file is
created and the directory fsynced before any record goes into it (W-1).

Every pending task's ``add`` line is kept in memory (``_live``), so rotation
(W-9) uses the same step: write them all to a fresh file, fsync it, and only
then unlink the old file while still holding its lock (W-10). Because
every live task is copied, outstanding immediate tasks never block rotation
(the reference's leaking counter, W-11).

Each record is written where the records end, into space reserved ahead of
them (W-25): an fsync that does not grow the file is cheaper. Writes go to the
OS at once; fsync happens every ``fsync_frequency`` seconds, driven by
``tick()`` (called by the Env's timer, or by tests) and checked on every
write, or inline when the frequency is 0 (W-8). A failed fsync is never
retried: the WAL becomes BROKEN and refuses all work (W-12, D-10).

Group commit (W-20..W-24): every record appended takes the next ticket; an
fsync runs outside the mutex, at most one at a time, and covers exactly the
tickets taken before it began (its target is read under the mutex first), so
concurrent writers share fsyncs and none is acknowledged by an fsync that
started before its record existed (D-15). Rotation and close wait while an
fsync is in flight, since they close the file it runs on.
"""

from __future__ import annotations

import enum
import errno
import logging
import threading
from typing import Final

from deferq._engine.env import Env, MappedWindow, OpenFlag
from deferq._core.errors import StorageBrokenError, StorageClosedError
from deferq._core.format import (
    BadLine,
    WalAdd,
    check_task_id,
    decode_wal_line,
    encode_add,
    encode_rem,
    is_wal_file_name,
    wal_file_name,
)
from deferq._engine.ids import id_source
from deferq._engine.io import chunks_forward, join, records_end, write_all
from deferq._core.limits import (
    FILE_MODE,
    WAL_SIZE_INCREASE_RATIO,
    WAL_SIZE_LIMIT_BYTES,
    WRITE_BATCH_BYTES,
)
from deferq._core.fastreplay import FastWalReplay
from deferq._core.recovery import WalReplay, live_fields
from deferq._core.types import PendingTask

log = logging.getLogger("deferq")

_RW_APPEND: Final = OpenFlag.READ | OpenFlag.WRITE | OpenFlag.APPEND
# A worker's own file is written at its descriptor's offset, not with O_APPEND: the file
# is longer than its records by the space reserved ahead of them (W-25).
_RW: Final = OpenFlag.READ | OpenFlag.WRITE
# allocate() errors meaning "this filesystem cannot reserve": stop trying (W-25).
_NO_RESERVE_ERRNOS: Final = frozenset({errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS,
                                       errno.EINVAL})
_NEVER: Final = 1 << 62  # a reserved end no record reaches: reserving is off
_CREATE_ATTEMPTS_MAX: Final = 16


def _limit_after_copy(size: int) -> int:
    """Implements W-9: the size limit of a fresh copy of ``size`` bytes (rotation or adoption)."""
    limit = WAL_SIZE_LIMIT_BYTES
    while size * WAL_SIZE_INCREASE_RATIO >= limit:
        limit = int(limit * WAL_SIZE_INCREASE_RATIO)
    return limit


class WalState(enum.Enum):
    OPEN = "open"
    BROKEN = "broken"
    CLOSED = "closed"


_OPEN: Final = WalState.OPEN  # one global lookup on the hot path instead of two


class TasksWal:
    """One worker's write-ahead log of pending tasks. Thread-safe."""

    def __init__(self, env: Env, path: str, prefix: str, fsync_frequency_s: float) -> None:
        self._env = env
        self._path = path
        self._prefix = prefix
        self._fsync_frequency_s = fsync_frequency_s
        self._mutex = threading.Lock()
        # The Env methods of the hot path, bound once (W-14 compares the pid on every call).
        self._write = env.write
        self._getpid = env.getpid
        self._monotonic = env.monotonic
        self._pid = env.getpid()
        self._state = WalState.OPEN
        # Group commit (W-20, W-21): records appended / covered by a completed fsync.
        self._written = 0
        self._durable = 0
        self._syncing = False
        self._sync_failed = False
        self._synced = threading.Condition(self._mutex)
        # W-8: a write fsyncs when the monotonic clock reaches this (the last fsync + f).
        self._sync_due_s = env.monotonic() + fsync_frequency_s
        self._held_fds: list[int] = []  # files kept locked until close (see _discard_copy)
        self.corrupt_records = 0
        claimed = self._claim_orphans()
        try:
            replay = self._replay(claimed)
        except BaseException:
            self._close_fds([fd for _, fd in claimed])
            raise
        self._live: dict[str, bytes] = replay.live  # id -> add line, newline included
        self.corrupt_records = replay.corrupt
        if replay.corrupt:
            log.warning("Detected %d corrupted deferred task record(s) in %s", replay.corrupt,
                        ", ".join(join(path, name) for name, _ in claimed))
        # Implements W-5: ids start above every id seen and above the clock.
        self._ids = id_source(env)
        self._ids.raise_floor(replay.seed_max + 1)
        if claimed:
            self._name, self._fd = self._adopt(claimed)
        else:
            self._name, self._fd = self._create_file()
        self._size = env.fstat(self._fd).size  # the end of the records: where writes go
        self._reserved = self._size  # the end of the space reserved for records (W-25)
        self._reserve_step = env.reserve_bytes
        # W-26: records go through a shared mapping of the reserved space when there is one
        # (``_window`` maps the file from ``_base`` to ``_reserved``); stores leave the
        # descriptor's offset behind, so a write that follows them first seeks to the end.
        self._window: MappedWindow | None = None
        self._base = 0
        self._offset_stale = False
        # Never with f = 0: each record's fsync write-protects the mapped page again, and the
        # next store's fault costs more than the write it saves (measured: see W-26).
        self._mapping = fsync_frequency_s > 0  # and False once a map failed
        self._limit = _limit_after_copy(self._size)

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
                fd = env.open(join(self._path, name), _RW | OpenFlag.CREATE
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

    def _replay(self, claimed: list[tuple[str, int]]) -> WalReplay:
        """Replay every claimed file in name order (W-3, W-15, R-@A..R-@L), on the fast path (W-16)."""
        replay = FastWalReplay()
        for _, fd in claimed:
            end = records_end(self._env, fd, self._env.fstat(fd).size)  # R-@L
            replay.apply_file(chunks_forward(self._env, fd, end))
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

    def _write_fresh_copy(self) -> tuple[str, int]:
        """Implements W-10's first steps (shared with W-3): a new file holding every pending task.

        Creates the file (W-1), writes the seed marker (W-5) and every pending
        task's ``add`` line, and fsyncs it. Raises ``StorageBrokenError`` when the
        WAL must fail-stop; any other ``OSError`` means the copy was durably
        discarded (``_discard_copy``) and the old files are still the WAL.
        """
        env = self._env
        name, fd = self._create_file()
        try:
            # Implements W-5: a marker carrying the current seed keeps ids issued before
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
            log.warning("could not copy the pending tasks to a new WAL file", exc_info=True)
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
            self._state = WalState.BROKEN
            names = ", ".join(name for name, _ in files)
            raise StorageBrokenError(f"could not durably unlink retired WAL file(s) {names}") from exc
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

    # ------------------------------------------------------------------ operations

    @property
    def file_name(self) -> str:
        """The name of the current main file (it changes at rotation)."""
        return self._name

    def add(self, context: bytes, publish_at: int | None, task_id: str | None,
            sync: bool = True) -> str:
        """Append an ``add`` record; arguments were validated by the caller (W-6).

        ``sync=False`` never fsyncs here (C-12): the caller waits with ``sync_through``.
        """
        # The hot path of every enqueue, so written for CPython's cost model (measured in
        # instructions): explicit acquire/release (cheaper than ``with``), Env methods bound
        # at open, the store into the mapped reserved space inlined (W-26: no system call;
        # ``_write_line``, ``_reserve`` and ``_cut_back`` handle the rest), and the fsync-due
        # test one comparison.
        self._mutex.acquire()
        try:
            if self._state is not _OPEN or self._getpid() != self._pid:
                self._check_usable()
            now = self._monotonic()
            if task_id is None:
                task_id = self._ids.next_id(self._pid, now)
            line = encode_add(task_id, publish_at, context)
            start = self._size
            end = start + len(line)
            if end > self._reserved:
                self._reserve(end - start)
            window = self._window
            try:
                if window is not None:  # W-26: the record fits the mapped reserved space
                    window[start - self._base:end - self._base] = line
                else:
                    self._write_line(line)
            except OSError:
                self._cut_back()
                raise
            self._size = end
            self._written += 1
            # Implements W-7 and R-@J: a re-added id replaces the task, keeping its position.
            self._live[task_id] = line
            # Implements W-8: f = 0, or an fsync is due (and none is in flight).
            if sync and (self._fsync_frequency_s == 0
                         or (now >= self._sync_due_s and not self._syncing)):
                self._sync_locked()
            return task_id
        finally:
            self._mutex.release()

    def remove(self, task_id: str, sync: bool = True) -> None:
        """Append a ``rem`` record if the task is pending here, then maybe rotate (W-6, W-9).

        ``task_id`` is a ``str``; the caller leaves its full check (C-7) to this method.
        """
        self._mutex.acquire()  # the hot path: see add
        try:
            if task_id not in self._live:
                # A pending id is valid by construction (checked when it was added or
                # replayed); any other is checked here, before the state (C-7).
                check_task_id(task_id)
                self._check_usable()
                return  # Implements W-6: nothing in this WAL to remove, nothing to write.
            if self._state is not _OPEN or self._getpid() != self._pid:
                self._check_usable()
            line = encode_rem(task_id)
            start = self._size
            end = start + len(line)
            if end > self._reserved:
                self._reserve(end - start)
            window = self._window
            try:
                if window is not None:  # W-26, as in add
                    window[start - self._base:end - self._base] = line
                else:
                    self._write_line(line)
            except OSError:
                self._cut_back()
                raise
            self._size = end
            self._written += 1
            del self._live[task_id]
            # Implements W-8: f = 0, or an fsync is due (and none is in flight).
            if sync and (self._fsync_frequency_s == 0
                         or (self._monotonic() >= self._sync_due_s and not self._syncing)):
                self._sync_locked()
            # Implements W-23: rotation closes the old file, so it waits while an fsync of
            # it is in flight; the size stays over the limit and a later remove rotates.
            # (The state is checked again: waiting for an fsync released the mutex, and
            # close() may have run meanwhile.)
            if (self._size >= self._limit and not self._syncing
                    and self._state is WalState.OPEN):
                self._rotate()
        finally:
            self._mutex.release()

    def pending(self) -> list[PendingTask]:
        """Every task pending in this WAL now, each id once, in first-insertion order (W-7)."""
        with self._mutex:
            self._check_usable()
            # Every live line was checked (CRC and fields) when it was written or replayed,
            # so only its payload field is decoded here; check_invariants re-checks it all.
            return [PendingTask(task_id, context, publish_at)
                    for task_id, (publish_at, context)
                    in zip(self._live, map(live_fields, self._live.values()))]

    def sync(self) -> None:
        """fsync now if anything was written since the last fsync (W-8)."""
        with self._mutex:
            self._check_usable()
            self._sync_locked()

    def written_ticket(self) -> int:
        """The ticket (sequence number) of the last record written to this WAL (W-20)."""
        if self._state is WalState.CLOSED or self._env.getpid() != self._pid:
            self._check_usable()
        return self._written

    def sync_through(self, ticket: int) -> None:
        """Implements W-21: return once every record up to ``ticket`` is durable.

        ``ticket`` was validated by the caller as an int >= 0; a ticket this WAL
        never issued is a ``ValueError``. A ticket already covered returns at once,
        even on a broken WAL; otherwise the call joins the fsync in flight or leads
        the next one, and raises ``StorageBrokenError`` if that fsync failed.
        """
        with self._mutex:
            if ticket > self._written:  # C-15: the argument first, then the state
                raise ValueError(f"ticket {ticket} was never issued by this WAL "
                                 f"(the latest is {self._written})")
            if self._state is WalState.CLOSED or self._env.getpid() != self._pid:
                self._check_usable()
            self._sync_through_locked(ticket)

    def tick(self) -> None:
        """The periodic timer fired: fsync if anything is unsynced (W-8).

        Never raises for a closed WAL: the timer may fire while ``close`` runs.
        """
        with self._mutex:
            if self._state is WalState.OPEN and self._written > self._durable:
                self._sync_locked()

    def close(self) -> None:
        """Wait for an fsync in flight, fsync if usable, then release the file (C-9, W-23).

        Idempotent.
        """
        with self._mutex:
            while self._syncing:
                self._synced.wait()
            if self._state is WalState.CLOSED:
                return
            try:
                if self._state is WalState.OPEN:
                    self._sync_locked()
            finally:
                self._state = WalState.CLOSED
                try:
                    self._unmap()
                finally:
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
            for task_id, line in self._live.items():
                record = decode_wal_line(line[:-1])
                assert isinstance(record, WalAdd) and record.task_id == task_id

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

    def _write_line(self, line: bytes) -> None:
        """Write ``line`` at the end of the records with ``write`` (no mapped window, W-26)."""
        if self._offset_stale:  # records were stored through a window since the last write
            self._env.seek(self._fd, self._size)
            self._offset_stale = False
        done = self._write(self._fd, line)
        if done != len(line):
            self._write_rest(line, done)

    def _write_rest(self, line: bytes, done: int) -> None:
        """A short write of ``line`` (``done`` bytes went out): write the rest (A-6)."""
        if done <= 0:
            raise OSError(f"write returned {done} with {len(line)} bytes left")
        write_all(self._env, self._fd, line[done:])

    def _unmap(self) -> None:
        """Release the mapped window, if any (W-26); its stores stay in the file."""
        window = self._window
        if window is not None:
            self._window = None
            window.close()

    def _reserve(self, size: int) -> None:
        """Implements W-25: reserve space past the records before a write would pass its end.

        ``Env.reserve_bytes`` (``WAL_RESERVE_BYTES`` on the real OS), and at least the
        ``size`` of the record about to be written, from the end of the records.
        Reserving only saves fsync work: when it fails the write goes ahead and grows
        the file as an append would (a full disk then fails the write itself, W-13);
        a filesystem that cannot reserve is not asked again.
        """
        length = max(self._reserve_step, size)
        self._unmap()
        try:
            self._env.allocate(self._fd, self._size, length)
        except OSError as exc:
            if exc.errno in _NO_RESERVE_ERRNOS:
                self._reserved = _NEVER
            return
        self._reserved = self._size + length
        if self._mapping:
            self._map_reserved()

    def _map_reserved(self) -> None:
        """Implements W-26: map the reserved space, from the page the records end in.

        A filesystem or a process that cannot map (``OSError``) makes this WAL write
        its records with ``write`` from then on: mapping only saves system calls.
        """
        base = self._size - self._size % self._env.map_granularity
        try:
            self._window = self._env.map_shared(self._fd, base, self._reserved - base)
        except OSError:
            log.info("mapping the tasks WAL failed; writing its records instead", exc_info=True)
            self._mapping = False
            return
        self._base = base
        self._offset_stale = True

    def _cut_back(self) -> None:
        """Implements W-13: a write failed; cut its partial line back off, or fail-stop.

        Called from the ``except OSError`` of an append, which re-raises the error.
        The cut drops the reserved space too (W-25), and the descriptor's offset is
        moved back to the end of the records, where the next write must go.
        """
        try:
            self._unmap()  # a store past the cut would be past the file's end (SIGBUS)
            self._env.ftruncate(self._fd, self._size)
            if self._reserved != _NEVER:
                self._reserved = self._size
            self._env.seek(self._fd, self._size)
            self._offset_stale = False
        except OSError as exc:
            self._state = WalState.BROKEN
            raise StorageBrokenError("a WAL write failed and its partial line could not be"
                                     " cut off") from exc

    def _sync_locked(self) -> None:
        """Make every record written so far durable (W-8); the mutex is held (see W-21)."""
        self._sync_through_locked(self._written)

    def _sync_through_locked(self, ticket: int) -> None:
        """Implements W-21 (group commit): join the fsync in flight or lead the next one.

        The mutex is held on entry and on return, but not while an fsync runs: a
        follower waits on ``_synced`` (which releases it), a leader releases it
        around its fsync. An fsync in flight may have begun before this ticket's
        record was written, so waiting for it is never enough by itself: the loop
        ends only when ``_durable`` covers the ticket.
        """
        while self._durable < ticket:
            if self._state is not WalState.OPEN:
                if self._sync_failed:
                    raise StorageBrokenError(
                        "fsync of the tasks WAL failed before this write was durable; the "
                        "backend stops")
                self._check_usable()
            if self._syncing:
                self._synced.wait()
            else:
                self._lead_fsync()

    def _lead_fsync(self) -> None:
        """Implements W-20, W-21 and W-12: one fsync covering every record written before it began.

        The target is read, with the descriptor, under the mutex before the fsync
        starts; records appended while it runs get a later ticket and need the
        next fsync. A failed fsync is never retried: the WAL is broken and every
        ticket it did not already cover fails (W-22).
        """
        target, fd = self._written, self._fd
        failure: OSError | None = None
        self._syncing = True
        self._mutex.release()
        try:
            self._env.fsync(fd)
        except OSError as exc:
            failure = exc
        finally:
            self._mutex.acquire()
            self._syncing = False
            self._synced.notify_all()
        if failure is not None:
            # Implements W-12: never retry; the unsynced pages may already be gone.
            self._state = WalState.BROKEN
            self._sync_failed = True
            raise StorageBrokenError("fsync of the tasks WAL failed; the backend stops") from failure
        if target > self._durable:
            self._durable = target
        self._sync_due_s = self._env.monotonic() + self._fsync_frequency_s

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
            self._state = WalState.BROKEN
            raise StorageBrokenError(
                f"copying the pending tasks failed ({cause}) and the copy {name} could not be"
                " durably removed"
            ) from exc
        self._close_fds([fd])

    def _rotate(self) -> None:
        """Implements W-9 and W-10: copy live tasks to a new file, then drop the old one."""
        try:
            name, fd = self._write_fresh_copy()
        except StorageBrokenError:
            self._state = WalState.BROKEN
            raise
        except OSError:
            log.warning("WAL rotation failed; keeping the old file, will retry later", exc_info=True)
            self._limit = int(self._size * WAL_SIZE_INCREASE_RATIO)
            return
        old_name, old_fd = self._name, self._fd
        self._unmap()
        self._name, self._fd = name, fd
        self._size = self._env.fstat(fd).size
        self._reserved = self._size
        self._offset_stale = False  # the copy was written with write: its offset is its end
        self._limit = _limit_after_copy(self._size)
        # The old file is unlinked while still locked, so no booting worker can claim it.
        self._retire([(old_name, old_fd)])
        self._durable = self._written  # W-23: the fsynced copy holds every pending task.
