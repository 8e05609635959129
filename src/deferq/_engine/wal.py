"""The tasks WAL: one append-only file per worker process (spec/wal.md).

This module holds ``TasksWal``: opening (replay and adoption), the append path, rotation and
closing. Its other jobs are its parts (``walbase`` says why they are mixins): the files
(``walfiles``), the space records go into (``walspace``), durability (``walsync``) and the
adoption sweep (``walsweep``).

Theory of operation. At open, a worker claims every WAL file of its prefix
that no live process holds (LOCK_EX | LOCK_NB, W-27): orphans of dead workers.
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

import logging
from typing import Final

from deferq._core.errors import StorageBrokenError
from deferq._core.limits import (
    WAL_SIZE_INCREASE_RATIO,
    WAL_SIZE_LIMIT_BYTES,
)
from deferq._core.recovery import live_fields
from deferq._core.taskid import check_task_id
from deferq._core.types import PendingTask
from deferq._core.walcodec import WalAdd, decode_wal_line, encode_add, encode_rem, encode_rems
from deferq._engine.env import Env, MappedWindow
from deferq._engine.ids import id_source
from deferq._engine.io import join
from deferq._engine.walbase import OPEN, WalState
from deferq._engine.walsweep import WalSweep

log = logging.getLogger("deferq")


def _limit_after_copy(size: int) -> int:
    """Implements W-9: the size limit of a fresh copy of ``size`` bytes (rotation or adoption)."""
    limit = WAL_SIZE_LIMIT_BYTES
    while size * WAL_SIZE_INCREASE_RATIO >= limit:
        limit = int(limit * WAL_SIZE_INCREASE_RATIO)
    return limit


_OPEN: Final = OPEN  # a module global: one lookup on the hot path


class TasksWal(WalSweep):
    """One worker's write-ahead log of pending tasks. Thread-safe.

    Its parts: ``WalFiles`` (files), ``WalSpace`` (where records go), ``WalSync``
    (durability), ``WalSweep`` (adopting orphans while open); this class opens the WAL, appends and removes records, rotates, and closes.
    """

    def __init__(self, env: Env, path: str, prefix: str, fsync_frequency_s: float) -> None:
        self._env = env
        self._path = path
        self._prefix = prefix
        self._fsync_frequency_s = fsync_frequency_s
        self._mutex = env.mutex()  # M-15: a plain threading.Lock on the OS
        # The Env methods of the hot path, bound once (W-14 compares the pid on every call).
        self._write = env.write
        self._getpid = env.getpid
        self._monotonic = env.monotonic
        self._pid = env.getpid()
        self._state = WalState.OPEN
        self._broken_reason = ""
        # Group commit (W-20, W-21): records appended / covered by a completed fsync.
        self._written = 0
        self._durable = 0
        self._syncing = False
        self._sync_failed = False
        self._synced = env.condition(self._mutex)
        # W-8: a write fsyncs when the monotonic clock reaches this (the last fsync + f).
        self._sync_due_s = env.monotonic() + fsync_frequency_s
        self._held_fds: list[int] = []  # files kept locked until close (see _discard_copy)
        self.corrupt_records = 0
        self._live: dict[str, bytes] = {}  # id -> add line, newline included
        self._ids = id_source(env)
        adopted = self._adopt_orphans()
        if adopted is not None:
            self._name, self._fd = adopted
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
            except OSError as exc:
                self._cut_back(exc)
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
            except OSError as exc:
                self._cut_back(exc)
                raise
            self._size = end
            self._written += 1
            del self._live[task_id]
            self._after_removal(sync)
        finally:
            self._mutex.release()

    def _after_removal(self, sync: bool) -> None:
        """The fsync and the rotation a removal may make; the mutex is held."""
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

    def remove_many(self, task_ids: list[str], sync: bool = True) -> int:
        """Implements W-79: ``remove`` of each id, the records of those pending here written
        in one append; return how many there were. Ids are ``str``, checked here (C-7)."""
        self._mutex.acquire()  # the hot path of a batch of successes: see add
        try:
            live = self._live
            for task_id in task_ids:  # C-7: every argument before the state and any I/O
                if task_id not in live:
                    check_task_id(task_id)
            if self._state is not _OPEN or self._getpid() != self._pid:
                self._check_usable()
            ids = [task_id for task_id in dict.fromkeys(task_ids) if task_id in live]
            if not ids:
                return 0  # Implements W-6 for each: nothing pending here, nothing written.
            self._append(encode_rems(ids))  # W-13: a failure leaves none of them
            self._written += len(ids)
            for task_id in ids:
                del live[task_id]
            self._after_removal(sync)
            return len(ids)
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
                    self._replace_if_nameless()  # W-80: a queue's stop may come before a sweep
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

    def _rotate(self) -> None:
        """Implements W-9 and W-10: copy live tasks to a new file, then drop the old one."""
        try:
            name, fd = self._write_fresh_copy()
        except StorageBrokenError as exc:
            self._break(exc)
            raise
        except OSError as exc:
            self._limit = int(self._size * WAL_SIZE_INCREASE_RATIO)
            # The error says what failed and where (``_write_fresh_copy`` names the file):
            # no traceback, which an operator's command would print as if it had crashed.
            log.warning("WAL rotation failed (%s); keeping %s, will retry once it holds %d bytes",
                        exc, join(self._path, self._name), self._limit)
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
