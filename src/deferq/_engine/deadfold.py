"""The whole dead-task store read through the index cache, in lock steps (S-86..S-88).

Rules: ``deferq stats`` folds every dead task of the store into counts. Through the index
cache (``deadcache.py``) it needs no set of the ids met: the cache lists each id's latest
record once, and the tail read with it says which cached places it supersedes (S-69). So
the read holds one step of records, the tail's index and one chunk of the cache, whatever
the store's size (S-88).

Theory of operation: the first hold of the locks makes sure a usable cache exists (as a
deep page does: read, merge, or build it, S-72, S-85), opens it, indexes the tail and
notes the file it describes. Every later step takes the locks, opens the data file by
path (S-3), checks it is that file (S-45's checks, against the tail's end), reads at most
``DEAD_READ_STEP_BYTES`` of records, closes it and releases the locks; the records are
checked (S-70) and decoded outside the locks. A step that finds another file (a
compaction) raises ``Compacted``: a fold cannot skip what it already counted, so it
starts over (S-87). Why a module of its own: the page of ``deadpages.py`` is one hold of
the locks; this is a loop of holds with state carried between them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypeVar

from deferq._core.deadcodec import decode_dead_record
from deferq._core.frame import BadLine
from deferq._core.limits import (
    DEAD_READ_RESTARTS_MAX,
    DEAD_READ_STEP_BYTES,
    FILE_MODE,
    READ_CHUNK_BYTES,
)
from deferq._core.types import DeadTask
from deferq._engine.deadindex import DeadIndex, index_matches
from deferq._engine.deadstream import Compacted
from deferq._engine.env import Env, FileStat, OpenFlag
from deferq._engine.lazylog import Log

log = Log("deferq")
R = TypeVar("R")

if TYPE_CHECKING:
    from deferq._engine.deadcache import CachedIndex, PageRecord

Locked = Callable[[str], contextlib.AbstractContextManager[None]]


class CacheLied(Exception):
    """A record read through the cache is not the one it names (S-70): stop using it."""


class CacheSnapshot:
    """The listing of one data file as its cache and tail describe it, read in steps."""

    def __init__(self, env: Env, data: str, lock_fd: int, locked: Locked, cache: CachedIndex,
                 tail: DeadIndex, superseded: set[int]) -> None:
        self._env = env
        self._data = data
        self._lock_fd = lock_fd
        self._locked = locked
        self._cache = cache
        self._tail = tail
        self._superseded = superseded
        fresh = tail.end > cache.end
        self._identity = (cache.device, cache.inode, cache.lock_ctime_ns, tail.end,
                          tail.check_start if fresh else cache.check_start,
                          tail.check_crc if fresh else cache.check_crc)
        self.corrupt = sum(d.faults for d in tail.damage) + sum(
            d.faults for d in cache.damage())
        self.undecodable: list[str] = []

    def _records(self) -> Iterator[PageRecord]:
        """Every place newest first: the tail's, then the cache's it does not supersede."""
        from deferq._engine.deadcache import PageRecord
        tail = self._tail
        for position in tail.newest(0):
            yield PageRecord(tail.offs[position], tail.lens[position], tail.ids[position], 0)
        per_chunk = READ_CHUNK_BYTES // 8
        top = self._cache.places
        while top > 0:
            first = max(0, top - per_chunk)
            offs, lens, hashes = self._cache.spans(first, top - first)
            for i in range(top - first - 1, -1, -1):
                if first + i not in self._superseded:
                    yield PageRecord(offs[i], lens[i], None, hashes[i])
            top = first

    def _steps(self) -> Iterator[list[PageRecord]]:
        step: list[PageRecord] = []
        size = 0
        for record in self._records():
            step.append(record)
            size += record.length
            if size >= DEAD_READ_STEP_BYTES:
                yield step
                step, size = [], 0
        if step:
            yield step

    def tasks(self) -> Iterator[DeadTask]:
        """Implements S-86, S-87: each task once, newest first; ``Compacted`` if the file changed."""
        from deferq._engine.deadcache import StaleCache, read_page
        env = self._env
        tail_ids = self._tail.latest
        for step in self._steps():
            with self._locked("read tasks from"):
                try:
                    fd = env.open(self._data, OpenFlag.READ)
                except FileNotFoundError:
                    raise Compacted from None
                try:
                    if not index_matches(env, fd, env.fstat(fd), env.fstat(self._lock_fd).ctime_ns,
                                         self._identity):
                        raise Compacted
                    try:
                        records = list(read_page(env, fd, step, tail_ids))
                    except StaleCache:
                        raise CacheLied from None
                finally:
                    env.close(fd)
            for task_id, payload in records:
                task = decode_dead_record(task_id, payload)
                if isinstance(task, BadLine):
                    self.undecodable.append(task_id)
                else:
                    yield task

    def close(self) -> None:
        self._cache.close()


class DeadFold:
    """The whole-store fold of ``DeadTaskStore`` through the index cache (S-86..S-88).

    A mixin, as ``deadpages.DeadDeepPages``: it reads through the store's locks, reporting
    and cache upkeep (``_merge_in_steps``, ``_build_in_steps``, ``_install``).
    """

    _env: Env
    _data: str
    _cache: str
    _lock_fd: int
    _index_class: type[DeadIndex]
    _cache_tail_max: int

    if TYPE_CHECKING:  # defined by DeadTaskStore, DeadReads and DeadDeepPages
        def _locked(self, operation: str) -> contextlib.AbstractContextManager[None]: ...
        def _open_data(self, flags: OpenFlag) -> int | None: ...
        def _check_usable(self) -> None: ...
        def _report(self, corrupt: int, undecodable: list[str]) -> None: ...
        def _merge_in_steps(self) -> bool: ...
        def _build_in_steps(self, start: DeadIndex | None = None) -> DeadIndex | None: ...
        def _install(self, built: DeadIndex,
                     then: Callable[[int, FileStat], R | None]) -> R | None: ...
        def _held_file(self) -> contextlib.AbstractContextManager[
            tuple[int, FileStat, int] | None]: ...
        def _open_cache(self, data_size: int) -> CachedIndex | None: ...

    def fold_tasks(self, fold: Callable[[Iterator[DeadTask]], R]) -> R | None:
        """Implements S-86, S-87: ``fold`` over every dead task, read through the cache.

        None when no cache can be used (none can be written, or a record it names fails
        its checks): the caller then reads in lock steps (S-27). A compaction during the
        read starts the fold over, at most ``DEAD_READ_RESTARTS_MAX`` times.
        """
        self._check_usable()
        for _ in range(DEAD_READ_RESTARTS_MAX):
            snapshot = self._open_snapshot()
            if snapshot is None:
                return None
            try:
                result = fold(snapshot.tasks())
            except Compacted:
                continue
            except CacheLied:
                return None
            finally:
                snapshot.close()
            self._report(snapshot.corrupt, snapshot.undecodable)
            return result
        return None

    def _open_snapshot(self) -> CacheSnapshot | None:
        """Implements S-86: a usable cache with a short tail, merged (S-85) or built (S-73)
        first when needed and possible; None when there is none."""
        snapshot = self._try_snapshot()
        if snapshot is None and self._merge_in_steps():
            snapshot = self._try_snapshot()
        if snapshot is None and self._cache_writable():
            built = self._build_in_steps()
            if built is not None and self._install(built, lambda fd, stat: True):
                snapshot = self._try_snapshot()
        return snapshot

    def _try_snapshot(self) -> CacheSnapshot | None:
        """One hold of the locks: the cache opened and checked, its tail (at most
        ``_cache_tail_max`` bytes) indexed, the places it supersedes found."""
        from deferq._engine.deadcache import superseded_places

        env = self._env
        with self._held_file() as held:
            if held is None:
                return None
            fd, stat, lock_ctime = held
            cache = self._open_cache(stat.size)
            if cache is None:
                return None
            if not (cache.usable(env, fd, stat, lock_ctime)
                    and stat.size - cache.end <= self._cache_tail_max):
                cache.close()
                return None
            try:
                tail = self._index_class(stat, lock_ctime)
                tail.end = cache.end
                tail.extend(env, fd, stat.size)
                snapshot = CacheSnapshot(env, self._data, self._lock_fd, self._locked, cache,
                                         tail, superseded_places(env, fd, cache, tail))
            except BaseException:
                cache.close()
                raise
            snapshot.corrupt += stat.size > tail.end  # a torn tail (R-@F)
            return snapshot

    def _cache_writable(self) -> bool:
        """Whether the cache's staging file can be created (not on a read-only mount)."""
        tmp = self._cache + ".tmp"
        try:
            self._env.close(self._env.open(tmp, OpenFlag.WRITE | OpenFlag.CREATE, FILE_MODE))
            self._env.unlink(tmp)
        except OSError:
            return False
        return True
