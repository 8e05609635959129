"""The dead-task store's reads: ``list`` and ``find`` (spec/dead-tasks.md S-6, S-7, S-10..S-13).

Rules: every read runs under the store's locks (``_locked``, L-1..L-3) and opens the
data file by path for that one operation (S-3); nothing here writes the data file.

Theory of operation: a read uses the per-process index (``deadindex.DeadIndex``)
once one is built and ``_checked_index`` has checked it against the file just
opened (S-10); otherwise it reads backwards from the newest end in bounded chunks
(S-6; ``find`` through ``NeedleScan``, S-13). Scans count the bytes they read, and
when those reach the file's size the next read builds the index (S-11). Damage is
counted as the line-by-line scan would count it and reported once per call (S-7,
S-12). The scan itself is ``deadstream.newest_first`` (S-31); ``iter_tasks`` is the
operators' long read, which holds the locks only in bounded steps (S-27..S-30).

``DeadReads`` is a mixin of ``deadstore.DeadTaskStore``, not a separate object: the
index is shared state of one store (adds extend it, compaction drops it), and the
crash catalogue's mutants override ``_locked`` and ``_index_class`` on the store, so
the reads must reach them through ``self``. The attributes and methods declared
below without a body are the store's (``deadstore.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from deferq._core.deadcodec import decode_dead_payload, decode_dead_record
from deferq._core.frame import BadLine
from deferq._core.limits import LINE_BYTES_MAX
from deferq._core.types import DeadTask
from deferq._engine.deadindex import (
    DeadIndex,
    NeedleScan,
    RecordReader,
    StaleIndex,
    dead_line,
)
from deferq._engine.deadstream import (
    SteppedBlocks,
    Tally,
    newest_first,
    pread_blocks,
    records_end,
    stepped_tasks,
)
from deferq._engine.env import Env, FileStat, OpenFlag
from deferq._engine.lazylog import Log

log = Log("deferq")  # logging itself on the first message (lazylog.py)


class DeadReads:
    """The reads of ``DeadTaskStore`` and the index they keep (S-6, S-7, S-10..S-13)."""

    # The store's state (deadstore.DeadTaskStore.__init__ / _init_process_state).
    _env: Env
    _data: str
    _lock_fd: int
    _index: DeadIndex | None
    _cold_bytes: int  # bytes read by scans since the index was last dropped (S-11)
    _index_class: type[DeadIndex]
    # Undecodable records this store has logged (S-43), for a caller that reports them.
    undecodable_logged: int = 0

    if TYPE_CHECKING:  # defined by DeadTaskStore
        def _locked(self, operation: str) -> contextlib.AbstractContextManager[None]: ...
        def _check_usable(self) -> None: ...
        def _open_data(self, flags: OpenFlag) -> int | None: ...
        def _deep_offset(self, offset: int, limit: int | None) -> bool: ...
        def _deep_page(self, offset: int, limit: int) -> list[DeadTask] | None: ...
        def _cached_list(self, fd: int, stat: FileStat, offset: int,
                         limit: int) -> list[DeadTask] | None: ...

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

    # ------------------------------------------------------------------ list and find

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
                if self._deep_offset(offset, limit):
                    assert limit is not None
                    page = self._cached_list(fd, stat, offset, limit)  # S-66
                    if page is not None:
                        return page
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
        """Implements S-43, S-7: one error per undecodable record, one warning for the damage."""
        self.undecodable_logged += len(undecodable)
        for task_id in undecodable:
            log.error("Can't deserialize the dead-lettered task with id %s", task_id)
        if corrupt:
            log.warning("Detected %d corrupted dead-lettered task record(s) in %s",
                        corrupt, self._data)

    def _list_indexed(self, index: DeadIndex, fd: int, size: int, offset: int,
                      limit: int | None) -> list[DeadTask]:
        """Implements S-11, S-12, S-33, S-34: the page of S-6 read through the index.

        The index holds only records with a valid frame, so the offset is a count of its
        latest positions (no read); each of the ``limit`` positions after it is decoded,
        and one that does not decode leaves its place in the page empty.
        """
        out: list[DeadTask] = []
        undecodable: list[str] = []
        stop = 0  # a scan that does not fill the page reads the whole file
        reader = RecordReader(index, self._env, fd)
        left = len(index.offs) if limit is None else limit
        for position in index.newest(offset):
            task = decode_dead_record(index.ids[position], reader.read(position, left))
            if isinstance(task, BadLine):
                undecodable.append(index.ids[position])
            else:
                out.append(task)
            left -= 1
            if limit is not None and not left:
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
        """The page of S-6 newest first, read backwards in chunks under the lock.

        The first ``offset`` latest records with a valid frame are skipped without
        decoding their payloads, so only their ids are held (D-14, S-33); the next
        ``limit`` are decoded and those that decode returned (S-34). Stops reading as
        soon as the page is complete.
        """
        tally = Tally(skip=offset, take=-1 if limit is None else limit)
        end = records_end(self._env, fd, size)
        tally.corrupt += size > end  # a torn tail (R-@F)
        out = list(newest_first(pread_blocks(self._env, fd, end), end, tally))
        self._cold_bytes += size - (size if tally.low < 0 else tally.low)
        self._report(tally.corrupt, tally.undecodable)
        return out

    def iter_tasks(self, offset: int = 0, limit: int | None = None) -> Iterator[DeadTask]:
        """Implements S-27..S-30: every dead task newest first, read in lock steps.

        The locks are held only inside each step (at most ``DEAD_READ_STEP_BYTES``
        read), never while the caller works on a task; memory is one step and the ids
        met. Damage is reported once, when the iterator ends or is closed (S-7).
        """
        self._check_usable()
        if self._deep_offset(offset, limit):  # S-72
            assert limit is not None
            page = self._deep_page(offset, limit)
            if page is not None:
                return iter(page)
        return stepped_tasks(
            lambda: SteppedBlocks(self._env, self._data, self._lock_fd, self._locked),
            Tally(skip=offset, take=-1 if limit is None else limit),
            lambda tally: self._report(tally.corrupt, tally.undecodable))


def _needle(task_id: str) -> bytes:
    """The body prefix of ``task_id``'s records: find's filter before any CRC work (S-7)."""
    return b"dead_task:" + task_id.encode("utf-8") + b":"
