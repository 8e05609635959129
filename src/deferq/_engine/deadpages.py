"""Deep pages of the dead-task store: through the index cache, or by building it
(spec/dead-tasks.md S-65..S-74, S-85, S-89, S-90).

Rules: a page at ``offset`` of ``DEAD_CACHE_OFFSET_MIN`` places or more is read, under
the store's locks, through the per-process index when one is usable (S-11), else
through the index cache (``deadcache.py``) when it is usable and its tail is short
(S-66..S-70); else, when the page lies in the newest quarter of the file, by the
stepped scan (S-90); else the cache's tail is merged into a new cache when it is 1 to
8 MiB long (S-85), or the index is built in lock steps of ``DEAD_READ_STEP_BYTES``,
the cache written and the page read through the new index (S-72, S-73). The result is
always the page the scan of S-6 returns on the same file (S-11, S-65).

Theory of operation: every other read is unchanged: the newest pages are cheaper to
scan than to look up, and a shallow page costs a scan of the few records before it.
Why a mixin of ``deadstore.DeadTaskStore``: it shares the store's index, locks and
reporting with ``deadreads.DeadReads`` (whose methods it calls through ``self``), and
the crash catalogue's mutants reach it through the same overrides.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

from deferq._core.deadcodec import decode_dead_record
from deferq._core.frame import BadLine
from deferq._core.limits import (
    DEAD_CACHE_MERGE_BYTES_MAX,
    DEAD_CACHE_OFFSET_MIN,
    DEAD_CACHE_SCAN_SHARE,
    DEAD_CACHE_TAIL_BYTES_MAX,
    DEAD_READ_RESTARTS_MAX,
    DEAD_READ_STEP_BYTES,
    READ_CHUNK_BYTES,
)
from deferq._core.types import DeadTask
from deferq._engine.deadindex import DeadIndex, StaleIndex
from deferq._engine.env import Env, FileStat, OpenFlag
from deferq._engine.lazylog import Log

log = Log("deferq")
R = TypeVar("R")

if TYPE_CHECKING:
    from deferq._engine.deadcache import CachedIndex


class DeadDeepPages:
    """The deep pages of ``DeadTaskStore`` and the cache's upkeep (S-65..S-74, S-85, S-90)."""

    _env: Env
    _data: str
    _cache: str  # the index cache's path (F-60)
    _lock_fd: int
    _index: DeadIndex | None
    _index_class: type[DeadIndex]
    #: The least offset read through the cache (tests lower it to reach every path).
    _cache_offset_min: int = DEAD_CACHE_OFFSET_MIN
    #: The most bytes appended since the cache was written that a read indexes itself (S-68).
    _cache_tail_max: int = DEAD_CACHE_TAIL_BYTES_MAX
    #: The most such bytes a read merges into a new cache rather than building one (S-85).
    _cache_merge_max: int = DEAD_CACHE_MERGE_BYTES_MAX
    #: A page whose records lie in the newest 1/share of the file is scanned, not built (S-90).
    _cache_scan_share: int = DEAD_CACHE_SCAN_SHARE

    if TYPE_CHECKING:  # defined by DeadTaskStore and DeadReads
        def _locked(self, operation: str) -> contextlib.AbstractContextManager[None]: ...
        def _open_data(self, flags: OpenFlag) -> int | None: ...
        def _check_usable(self) -> None: ...
        def _drop_index(self) -> None: ...
        def _report(self, corrupt: int, undecodable: list[str]) -> None: ...
        def _checked_index(self, fd: int, stat: FileStat, *,
                           build: bool = False) -> DeadIndex | None: ...
        def _list_indexed(self, index: DeadIndex, fd: int, size: int, offset: int,
                          limit: int | None) -> list[DeadTask]: ...

    def _deep_offset(self, offset: int, limit: int | None) -> bool:
        return limit is not None and limit > 0 and offset >= self._cache_offset_min

    # ------------------------------------------------------------------ the cache

    def _save_cache(self, parts: Iterator[bytes]) -> bool:
        """Implements S-71: write a cache, best effort, under the locks; whether it was."""
        from deferq._engine.deadcache import (
            write_cache,  # loaded by the deep reads only
        )

        try:
            write_cache(self._env, self._cache, parts)
        except OSError as exc:
            log.info("Could not write the dead-task index cache %s: %s", self._cache, exc)
            with contextlib.suppress(OSError):
                self._env.unlink(self._cache + ".tmp")
            return False
        return True

    def _open_cache(self, data_size: int) -> CachedIndex | None:
        """Implements S-66, S-89: the cache, checked on its own; None when it cannot be used
        (an entry that is not ours or not a regular file is ignored with a warning)."""
        from deferq._engine.deadcache import CachedIndex

        try:
            return CachedIndex.open(self._env, self._cache, data_size)
        except OSError as exc:  # not a regular file, not ours, unreadable (F-27)
            log.warning("Ignoring the dead-task index cache %s: %s", self._cache, exc)
            return None

    def _cached_list(self, fd: int, stat: FileStat, offset: int,
                     limit: int) -> list[DeadTask] | None:
        """Implements S-66..S-70: the page read through the cache, or None when it is unusable."""
        # Loaded here: the commands that never read a deep page (most) do not pay for it.
        from deferq._engine.deadcache import (
            StaleCache,
            page_records,
            read_page,
            superseded_places,
        )

        env = self._env
        cache = self._open_cache(stat.size)
        if cache is None:
            return None
        try:
            lock_ctime = env.fstat(self._lock_fd).ctime_ns
            if not cache.usable(env, fd, stat, lock_ctime):
                return None
            if stat.size - cache.end > self._cache_tail_max:
                return None  # S-68: too long to index in this hold: merge or build first
            tail = self._index_class(stat, lock_ctime)
            tail.end = cache.end
            tail.extend(env, fd, stat.size)
            superseded = superseded_places(env, fd, cache, tail)
            records, stop = page_records(cache, tail, superseded, offset, limit)
            out: list[DeadTask] = []
            undecodable: list[str] = []
            for task_id, payload in read_page(env, fd, records, tail.latest):
                task = decode_dead_record(task_id, payload)
                if isinstance(task, BadLine):
                    undecodable.append(task_id)
                else:
                    out.append(task)
            key = 0 if stop is None else stop
            corrupt = (1 if stat.size > tail.end else 0) + sum(
                damage.faults for damage in tail.damage_from(key)) + sum(
                damage.faults for damage in cache.damage() if damage.key >= key)
        except StaleCache:
            return None
        finally:
            cache.close()
        self._report(corrupt, undecodable)
        return out

    # ------------------------------------------------------------------ a deep page

    def _held_file(self) -> contextlib.AbstractContextManager[Held | None]:
        """Both locks (L-1..L-3) and the data file opened by path (S-3), closed on exit:
        (its descriptor, its stat, the lock file's ctime), or None when it is missing."""
        return _HeldFile(self)

    def _deep_page(self, offset: int, limit: int) -> list[DeadTask] | None:
        """Implements S-72: the page through the index or the cache, building both if needed.

        None when the data file is missing or the build could not finish (the caller
        then reads the page in lock steps, S-27).
        """
        with self._held_file() as held:
            if held is None:
                return None
            fd, stat, _ = held
            index = self._checked_index(fd, stat)
            if index is not None:
                try:
                    return self._list_indexed(index, fd, stat.size, offset, limit)
                except StaleIndex:
                    self._drop_index()
            page = self._cached_list(fd, stat, offset, limit)
            if page is not None:
                return page
            near = self._near_the_end(fd, stat.size, offset + limit)
        if near:
            return None  # S-90: a scan to the page reads less than a build: no cache for it
        if self._merge_in_steps():  # S-85: a usable cache with a long tail
            with self._held_file() as held:
                page = None if held is None else self._cached_list(held[0], held[1], offset,
                                                                   limit)
            if page is not None:
                return page
        built = self._build_in_steps()
        if built is None:
            return None

        def read(fd: int, stat: FileStat) -> list[DeadTask] | None:
            try:
                return self._list_indexed(built, fd, stat.size, offset, limit)
            except StaleIndex:
                self._drop_index()
                return None

        return self._install(built, read)

    def _near_the_end(self, fd: int, size: int, places: int) -> bool:
        """Implements S-90: whether ``places`` records, at the size of the newest ones, take
        less than ``1 / _cache_scan_share`` of the file (so the scan of S-27 to them reads
        little of it); never with a share of 0."""
        share = self._cache_scan_share
        if not share:
            return False
        length = min(READ_CHUNK_BYTES, size)
        newest = self._env.pread(fd, length, size - length)
        lines = newest.count(b"\n")
        return lines > 0 and places * len(newest) * share < lines * size

    def _install(self, built: DeadIndex,
                 then: Callable[[int, FileStat], R | None]) -> R | None:
        """Make ``built`` this store's index and write its cache (S-71), in one hold of the
        locks after checking and extending it (S-45, S-46); then ``then`` in that hold."""
        from deferq._engine.deadcache import cache_chunks

        with self._held_file() as held:
            if held is None:
                return None
            fd, stat, lock_ctime = held
            if not built.usable(self._env, fd, stat, lock_ctime):
                return None
            built.extend(self._env, fd, stat.size)
            self._index = built
            self._save_cache(cache_chunks(built))
            return then(fd, stat)

    def _build_in_steps(self, start: DeadIndex | None = None) -> DeadIndex | None:
        """Implements S-73: the index of the whole file, built forward in lock steps.

        Each step checks the file as S-45 says and indexes at most about
        ``DEAD_READ_STEP_BYTES`` more (twice that after a step that found no newline);
        a failed check starts over, at most ``DEAD_READ_RESTARTS_MAX`` times. With
        ``start`` (a tail, S-85) it extends that index instead, and a failed check ends it.
        """
        env = self._env
        for _ in range(DEAD_READ_RESTARTS_MAX):
            index = start
            step = DEAD_READ_STEP_BYTES
            while True:
                with self._held_file() as held:
                    if held is None:
                        return None
                    fd, stat, lock_ctime = held
                    if index is None:
                        index = self._index_class(stat, lock_ctime)
                    elif not index.usable(env, fd, stat, lock_ctime):
                        if start is not None:
                            return None
                        break  # compacted or replaced meanwhile: start over
                    before = index.end
                    target = min(stat.size, before + step)
                    index.extend(env, fd, target)
                    if target == stat.size:
                        return index
                    step = DEAD_READ_STEP_BYTES if index.end > before else 2 * step
        return None

    def _merge_in_steps(self) -> bool:
        """Implements S-85: merge a tail of ``_cache_tail_max`` to ``_cache_merge_max`` bytes
        into a new cache, the tail indexed in lock steps (S-73); whether a cache was written.
        """
        from deferq._engine.deadcache import merged_chunks, superseded_places

        env = self._env
        with self._held_file() as held:
            if held is None:
                return False
            fd, stat, lock_ctime = held
            cache = self._open_cache(stat.size)
            if cache is None:
                return False
            if not (cache.usable(env, fd, stat, lock_ctime)
                    and self._cache_tail_max < stat.size - cache.end <= self._cache_merge_max):
                cache.close()
                return False
        try:
            tail = self._index_class(stat, lock_ctime)
            tail.end, tail.check_start, tail.check_crc = (cache.end, cache.check_start,
                                                          cache.check_crc)
            if self._build_in_steps(tail) is None:
                return False
            with self._held_file() as held:
                if held is None:
                    return False
                fd, stat, lock_ctime = held
                if not (cache.usable(env, fd, stat, lock_ctime)
                        and tail.usable(env, fd, stat, lock_ctime)):
                    return False
                tail.extend(env, fd, stat.size)
                return self._save_cache(merged_chunks(
                    cache, tail, superseded_places(env, fd, cache, tail)))
        finally:
            cache.close()


Held = tuple[int, FileStat, int]  # the data file's descriptor, its stat, the lock file's ctime


class _HeldFile:
    """``DeadDeepPages._held_file``: a class, not a generator, as it runs once per step."""

    __slots__ = ("_fd", "_locks", "_store")

    def __init__(self, store: DeadDeepPages) -> None:
        self._store = store
        self._locks = store._locked("read tasks from")
        self._fd: int | None = None

    def __enter__(self) -> Held | None:
        self._locks.__enter__()
        try:
            store = self._store
            fd = self._fd = store._open_data(OpenFlag.READ)
            if fd is None:
                return None
            env = store._env
            return fd, env.fstat(fd), env.fstat(store._lock_fd).ctime_ns
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        try:
            if self._fd is not None:
                self._store._env.close(self._fd)
                self._fd = None
        finally:
            self._locks.__exit__(kind, value, traceback)
