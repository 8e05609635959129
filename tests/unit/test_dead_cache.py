"""The dead-task store's index cache: deep pages in a fresh process (S-65..S-74, F-60).

Goal: a page at a deep offset read by a process with no index of its own comes from the
cache beside the store when the cache is right, and is exactly the scan's page whatever
the cache holds: torn, truncated, planted, stale after a compaction, out of date by more
than its tail limit, or lying about a record with a valid CRC of its own. Building it
happens in lock steps, writing it never fails a read, and a read through it holds memory
bounded by the page, not by the store. Method: real files in ``tmp_path``; the store's
own view (``DeadStoreView``, as the CLI opens it) with its cache settings lowered where
a test needs many pages; ``RecordingEnv`` counts reads and lock holds; the real CLI runs
in subprocesses for the fresh-process rows.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import struct
import subprocess
import sys
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from deferq._cli.dead import DeadStoreView
from deferq._core.deadcodec import encode_dead
from deferq._core.names import dead_cache_name, dead_data_name
from deferq._core.types import DeadTask
from deferq._engine import deadfold as _deadfold
from deferq._engine import deadpages as _deadpages
from deferq._engine.deadcache import CachedIndex
from deferq._engine.deadindex import DeadIndex
from deferq._engine.deadstore import DeadTaskStore
from deferq._engine.osenv import DirEnv
from deferq._runtime.operator import Operator, dead_stats
from deferq.backends import Disk

PREFIX = "deferred-"
DATA = dead_data_name(PREFIX)
CACHE = dead_cache_name(PREFIX)


def dead(task_id: str, variant: int = 0) -> DeadTask:
    return DeadTask(id=task_id, task_class="job.T", attempts=1 + variant % 3, enqueued_at=1,
                    failed_at=2, exception_class="ValueError", exception_message=f"m{variant}",
                    backtrace=("f",), context=b"ctx-" + task_id.encode())


def make_store(tmp_path: Path, ids: list[str]) -> Path:
    """A store written as a worker would leave it: the data file and its lock file."""
    store = tmp_path / "store"
    store.mkdir(mode=0o700, parents=True)
    (store / DATA).write_bytes(b"".join(encode_dead(dead(i, n)) for n, i in enumerate(ids)))
    (store / "deferred-dead_tasks.lock").touch(mode=0o600)
    return store


def scan_page(store: Path, offset: int, limit: int) -> list[str]:
    """The page of S-6 by the scan: a store whose cache offset is never reached."""
    view = DeadStoreView(str(store), PREFIX, read_only=True)
    try:
        assert view._store is not None
        view._store._cache_offset_min = 10**9
        return [t.id for t in view.iter_dead_tasks(offset=offset, limit=limit)]
    finally:
        view.close()


def cold_page(store: Path, offset: int, limit: int) -> tuple[list[str], int]:
    """A page read by a fresh view, as a CLI call does, and how many builds it ran."""
    view = DeadStoreView(str(store), PREFIX, read_only=True)
    builds: list[int] = []
    try:
        assert view._store is not None
        inner = view._store._build_in_steps

        def counted(start: DeadIndex | None = None) -> DeadIndex | None:
            if start is None:  # a build of the whole file, not a merge's tail (S-85)
                builds.append(1)
            return inner(start)

        view._store._build_in_steps = counted  # type: ignore[method-assign]
        return [t.id for t in view.iter_dead_tasks(offset=offset, limit=limit)], len(builds)
    finally:
        view.close()


@contextlib.contextmanager
def compacting_at(monkeypatch: pytest.MonkeyPatch, store: Path, hold: int,
                  ids: list[str]) -> Iterator[None]:
    """Another worker removes ``ids`` (a compaction) just before the reader's ``hold``-th
    hold of the locks."""
    holds = [0]
    real = DeadTaskStore._locked
    disk = Disk(path=store, prefix=PREFIX, fsync_frequency=0)

    def compact_once(self: DeadTaskStore, operation: str) -> object:
        holds[0] += 1
        if holds[0] == hold and self is not disk._dead:
            assert disk.remove_dead_tasks(ids) == len(ids)
        return real(self, operation)

    monkeypatch.setattr(DeadTaskStore, "_locked", compact_once)
    try:
        yield
    finally:
        monkeypatch.setattr(DeadTaskStore, "_locked", real)
        disk.close()
    assert holds[0] > hold, "the reader ended before the compaction"


IDS = [f"t{n}" for n in range(3000)] + [f"t{n}" for n in range(0, 3000, 5)]  # 600 re-added


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return make_store(tmp_path, IDS)


@pytest.mark.spec("S-65", "S-72", "S-71", "F-60")
def test_the_first_deep_page_builds_the_cache_and_the_next_fresh_reader_uses_it(
        store: Path) -> None:
    assert not (store / CACHE).exists()
    page, builds = cold_page(store, 2000, 50)
    assert page == scan_page(store, 2000, 50) and len(page) == 50
    assert builds == 1 and (store / CACHE).is_file()
    assert not (store / (CACHE + ".tmp")).exists()
    for offset in (1000, 1999, 2950, 2990, 3000):
        page, builds = cold_page(store, offset, 50)
        assert page == scan_page(store, offset, 50)
        assert builds == 0, offset


@pytest.mark.spec("S-65", "S-36")
def test_a_page_below_the_cache_offset_neither_reads_nor_writes_the_cache(store: Path) -> None:
    page, builds = cold_page(store, 999, 10)
    assert page == scan_page(store, 999, 10) and builds == 0
    assert not (store / CACHE).exists()


@pytest.mark.spec("S-68", "S-69", "S-74")
def test_records_added_since_the_cache_are_its_tail_and_supersede_their_cached_places(
        store: Path, caplog: pytest.LogCaptureFixture) -> None:
    cold_page(store, 1500, 10)  # writes the cache
    before = (store / CACHE).read_bytes()
    disk = Disk(path=store, prefix=PREFIX, fsync_frequency=0)
    try:
        for n, task_id in enumerate(["t10", "t2999", "new-1", "t1500", "new-2", "t10"]):
            disk._dead.add(dead(task_id, 100 + n))
    finally:
        disk.close()
    with open(store / DATA, "ab") as f:
        f.write(b"0123abcd:damaged line\npartial")  # a damaged line, then a torn tail
    for offset in (1000, 1001, 1500, 2990, 2996, 3000):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="deferq"):
            page, builds = cold_page(store, offset, 7)
        assert page == scan_page(store, offset, 7), offset
        assert builds == 0
        # S-74: the damaged line and the torn tail lie after every page of these offsets.
        assert "Detected 2 corrupted" in caplog.text
    assert (store / CACHE).read_bytes() == before  # the tail is read, the cache not rewritten


@pytest.mark.spec("S-85", "S-71", "S-69")
def test_a_tail_over_the_read_limit_is_merged_into_the_cache_a_build_would_write(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(DeadTaskStore, "_cache_tail_max", 20_000)
    store = make_store(tmp_path, IDS)
    cold_page(store, 1500, 10)
    disk = Disk(path=store, prefix=PREFIX, fsync_frequency=0)
    try:
        for n in range(400):  # about 60 KB: over the read limit, under the merge limit
            disk._dead.add(dead(f"t{n * 7}" if n % 3 else f"late-{n}", 200 + n))
    finally:
        disk.close()
    with open(store / DATA, "ab") as f:
        f.write(b"0123abcd:damaged line\n")
    page, builds = cold_page(store, 1500, 10)
    assert page == scan_page(store, 1500, 10) and builds == 0
    merged = (store / CACHE).read_bytes()
    (store / CACHE).unlink()
    page, builds = cold_page(store, 1500, 10)
    assert builds == 1 and (store / CACHE).read_bytes() == merged
    for offset in (1000, 2900, 3300):
        assert cold_page(store, offset, 10) == (scan_page(store, offset, 10), 0)


@pytest.mark.spec("S-68")
def test_a_tail_longer_than_the_merge_limit_rebuilds_the_cache(
        store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cold_page(store, 1500, 10)
    first = CachedIndex.open(DirEnv(str(store)), str(store / CACHE), os.path.getsize(store / DATA))
    assert first is not None
    end = first.end
    first.close()
    monkeypatch.setattr(DeadTaskStore, "_cache_tail_max", 100 * 1024)
    monkeypatch.setattr(DeadTaskStore, "_cache_merge_max", 512 * 1024)
    with open(store / DATA, "ab") as f:
        f.write(b"".join(encode_dead(dead(f"late-{n}")) for n in range(4000)))
    assert os.path.getsize(store / DATA) - end > 512 * 1024
    page, builds = cold_page(store, 5000, 10)  # deeper than the newest quarter (S-90)
    assert page == scan_page(store, 5000, 10) and builds == 1
    again = CachedIndex.open(DirEnv(str(store)), str(store / CACHE), os.path.getsize(store / DATA))
    assert again is not None and again.end == os.path.getsize(store / DATA)
    again.close()


def damaged_caches(cache: bytes) -> dict[str, bytes]:
    header = struct.calcsize("=8sIQQqQQIQQ")
    return {
        "empty": b"",
        "torn": cache[:len(cache) // 2],
        "one byte flipped": cache[:header + 3] + bytes([cache[header + 3] ^ 1]) + cache[header + 4:],
        "wrong magic": b"X" + cache[1:],
        "garbage": os.urandom(len(cache)),
        "longer": cache + b"\0" * 8,
    }


@pytest.mark.spec("S-66")
@pytest.mark.parametrize("kind", ["empty", "torn", "one byte flipped", "wrong magic", "garbage",
                                  "longer"])
def test_a_damaged_cache_is_ignored_and_rebuilt(store: Path, kind: str) -> None:
    cold_page(store, 1500, 10)
    (store / CACHE).write_bytes(damaged_caches((store / CACHE).read_bytes())[kind])
    page, builds = cold_page(store, 1500, 10)
    assert page == scan_page(store, 1500, 10) and builds == 1
    assert CachedIndex.open(DirEnv(str(store)), str(store / CACHE), os.path.getsize(store / DATA)) is not None


def recrc(cache: bytearray) -> bytes:
    cache[-4:] = struct.pack("=I", zlib.crc32(bytes(cache[:-4])))
    return bytes(cache)


@pytest.mark.spec("S-70")
@pytest.mark.parametrize("field", ["offset", "length", "swapped"])
def test_a_cache_with_a_valid_crc_that_names_the_wrong_record_is_not_believed(
        store: Path, field: str) -> None:
    """A cache whose own CRC holds but whose entry names another record, a cut record or
    another id: the read notices before decoding and answers as the scan does."""
    cold_page(store, 1500, 10)
    cache = bytearray((store / CACHE).read_bytes())
    header = struct.calcsize("=8sIQQqQQIQQ")
    places = struct.unpack_from("=Q", cache, header - 16)[0]
    place = places - 1 - 1500  # the first place of the page (no tail, 600 superseded)
    if field == "offset":
        at = header + 8 * place
        struct.pack_into("=q", cache, at, struct.unpack_from("=q", cache, at - 8)[0])
    elif field == "length":
        at = header + 8 * places + 8 * place
        struct.pack_into("=q", cache, at, struct.unpack_from("=q", cache, at)[0] - 1)
    else:  # two places swap records: each a valid record, each another id than its hash's
        for column in (header, header + 8 * places):
            a, b = column + 8 * place, column + 8 * (place - 1)
            first, second = cache[a:a + 8], cache[b:b + 8]
            cache[a:a + 8], cache[b:b + 8] = second, first
    (store / CACHE).write_bytes(recrc(cache))
    page, _ = cold_page(store, 1500, 10)
    assert page == scan_page(store, 1500, 10)


@pytest.mark.spec("S-67", "S-9")
def test_a_cache_written_before_a_compaction_is_not_used_after_it(store: Path) -> None:
    cold_page(store, 1500, 10)
    disk = Disk(path=store, prefix=PREFIX, fsync_frequency=0)
    try:
        assert disk.remove_dead_tasks(["t5", "t6", "t1200"]) == 3
    finally:
        disk.close()
    page, builds = cold_page(store, 1500, 10)
    assert page == scan_page(store, 1500, 10) and builds == 1


@pytest.mark.spec("S-67")
def test_a_cache_of_another_file_with_the_same_bytes_at_the_end_is_not_used(
        tmp_path: Path) -> None:
    """The data file replaced by a copy (a new inode) that another program shortened."""
    store = make_store(tmp_path, IDS)
    cold_page(store, 1500, 10)
    lines = (store / DATA).read_bytes().splitlines(keepends=True)
    (store / "copy").write_bytes(b"".join(lines[:100] + lines[200:]))
    os.rename(store / "copy", store / DATA)
    page, builds = cold_page(store, 1500, 10)
    assert page == scan_page(store, 1500, 10) and builds == 1


@pytest.mark.spec("S-66", "F-27")
def test_a_cache_name_that_is_a_symbolic_link_is_never_followed(
        store: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cold_page(store, 1500, 10)
    os.rename(store / CACHE, tmp_path / "planted")
    os.symlink(tmp_path / "planted", store / CACHE)
    with caplog.at_level(logging.WARNING, logger="deferq"):
        page, builds = cold_page(store, 1500, 10)
    assert page == scan_page(store, 1500, 10)
    assert "Ignoring the dead-task index cache" in caplog.text
    assert builds == 1  # read by building; the rename of S-71 then replaced the link
    assert (store / CACHE).is_file() and not (store / CACHE).is_symlink()


@pytest.mark.spec("S-71", "S-32")
def test_a_cache_that_cannot_be_written_is_logged_and_the_read_succeeds(
        store: Path, caplog: pytest.LogCaptureFixture) -> None:
    (store / (CACHE + ".tmp")).mkdir()  # the staging name is taken by a directory
    before = sorted(os.listdir(store))
    with caplog.at_level(logging.INFO, logger="deferq"):
        page, builds = cold_page(store, 1500, 10)
    assert page == scan_page(store, 1500, 10) and builds == 1
    assert "Could not write the dead-task index cache" in caplog.text
    assert sorted(os.listdir(store)) == before  # nothing else created by a read-only view


@pytest.mark.spec("S-73", "S-27")
def test_the_build_holds_the_locks_in_steps(store: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_deadpages, "DEAD_READ_STEP_BYTES", 64 * 1024)
    holds = []
    real = DeadTaskStore._locked

    def counted(self: DeadTaskStore, operation: str) -> object:
        holds.append(operation)
        return real(self, operation)

    monkeypatch.setattr(DeadTaskStore, "_locked", counted)
    page, builds = cold_page(store, 1500, 10)
    assert page == scan_page(store, 1500, 10) and builds == 1
    size = os.path.getsize(store / DATA)
    assert len(holds) >= size // (64 * 1024)  # one hold per step, at least


@pytest.mark.spec("S-73")
def test_a_compaction_between_build_steps_starts_the_build_over(
        store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_deadpages, "DEAD_READ_STEP_BYTES", 256 * 1024)
    with compacting_at(monkeypatch, store, 3, ["t1"]):  # between two steps of the build
        page, builds = cold_page(store, 1500, 10)
    assert page == scan_page(store, 1500, 10) and builds == 1


@pytest.mark.slow
@pytest.mark.spec("D-31", "D-14", "S-65")
def test_a_page_through_the_cache_holds_memory_bounded_by_the_page(tmp_path: Path) -> None:
    """The peak of a cold deep page through the cache does not grow with the store."""
    peaks = []
    for n in (5_000, 40_000):
        store = make_store(tmp_path / str(n), [f"id-{i}" for i in range(n)])
        cold_page(store, n - 100, 50)  # builds and writes the cache
        tracemalloc.start()
        try:
            page, builds = cold_page(store, n - 100, 50)
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
        assert builds == 0 and page == [f"id-{i}" for i in range(99, 49, -1)]
    assert peaks[1] < 1.5 * peaks[0] + 64 * 1024, peaks


@pytest.mark.spec("S-72", "S-65", "Q-90")
def test_the_cli_reads_deep_pages_through_the_cache_in_fresh_processes(store: Path) -> None:
    def dead_list(offset: int) -> list[str]:
        done = subprocess.run(
            [sys.executable, "-m", "deferq", "dead", "list", "--path", str(store),
             "--offset", str(offset), "--limit", "5", "--json"],
            capture_output=True, text=True, check=False, timeout=120)
        assert done.returncode == 0, done.stderr
        return [t["id"] for t in json.loads(done.stdout)]

    assert dead_list(2500) == scan_page(store, 2500, 5)
    cache = (store / CACHE).stat()
    assert dead_list(1000) == scan_page(store, 1000, 5)
    assert (store / CACHE).stat().st_mtime_ns == cache.st_mtime_ns  # read, not rebuilt


# ----------------------------------------------------------------------------- stats (S-86..S-88)


def stats_of(store: Path) -> tuple[dict[str, object], dict[str, object] | None, int]:
    """``deferq stats``'s counts as the CLI gets them, the fold's own answer (None: it fell
    back to the stepped read) and how many builds the call ran."""
    view = DeadStoreView(str(store), PREFIX, read_only=True)
    builds: list[int] = []
    folds: list[dict[str, object] | None] = []
    try:
        assert view._store is not None
        inner, fold = view._store._build_in_steps, view._store.fold_tasks

        def counted(start: DeadIndex | None = None) -> DeadIndex | None:
            if start is None:  # a build of the whole file, not a merge's tail (S-85)
                builds.append(1)
            return inner(start)

        def watched(f: Callable[[Iterator[DeadTask]], dict[str, object]]
                    ) -> dict[str, object] | None:
            folds.append(fold(f))
            return folds[-1]

        view._store._build_in_steps = counted  # type: ignore[method-assign]
        view._store.fold_tasks = watched  # type: ignore[method-assign, assignment]
        return Operator(view).dead_stats(), folds[0], len(builds)
    finally:
        view.close()


def stepped_stats(store: Path) -> dict[str, object]:
    view = DeadStoreView(str(store), PREFIX, read_only=True)
    try:
        return dead_stats(view.iter_dead_tasks())
    finally:
        view.close()


@pytest.mark.spec("S-86", "S-71", "Q-90")
def test_stats_count_through_the_cache_what_the_stepped_read_counts(store: Path) -> None:
    with open(store / DATA, "ab") as f:
        f.write(b"0123abcd:damaged line\n")
    want = stepped_stats(store)
    counts, folded, builds = stats_of(store)  # no cache yet: builds and writes it
    assert counts == want and folded == want and builds == 1
    disk = Disk(path=store, prefix=PREFIX, fsync_frequency=0)
    try:
        for n, task_id in enumerate(["t1", "new-1", "t2999"]):  # a tail, superseding two
            disk._dead.add(DeadTask(id=task_id, task_class="job.Other", attempts=1,
                                    enqueued_at=1, failed_at=2, exception_class="KeyError",
                                    exception_message=str(n), backtrace=(), context=b""))
    finally:
        disk.close()
    counts, folded, builds = stats_of(store)
    assert counts == stepped_stats(store) == folded and builds == 0
    assert counts["dead_tasks"] == 3001


@pytest.mark.spec("S-87")
def test_a_compaction_during_the_count_starts_it_over(
        store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stats_of(store)  # the cache
    monkeypatch.setattr(_deadfold, "DEAD_READ_STEP_BYTES", 64 * 1024)
    with compacting_at(monkeypatch, store, 4, ["t7", "t2000"]):  # between two count steps
        counts, folded, builds = stats_of(store)
    assert folded is not None and builds == 1  # the compaction made the cache stale
    assert counts == stepped_stats(store) and counts["dead_tasks"] == 2998


@pytest.mark.spec("S-87", "S-32")
def test_stats_where_no_cache_can_be_written_count_in_steps_without_building(
        store: Path) -> None:
    (store / (CACHE + ".tmp")).mkdir()  # as on a read-only mount: the cache cannot be written
    counts, folded, builds = stats_of(store)
    assert folded is None and builds == 0
    assert counts == stepped_stats(store) and not (store / CACHE).exists()


@pytest.mark.spec("S-87", "S-70")
def test_a_record_the_cache_misnames_ends_the_count_through_it(store: Path) -> None:
    stats_of(store)
    cache = bytearray((store / CACHE).read_bytes())
    header = struct.calcsize("=8sIQQqQQIQQ")
    places = struct.unpack_from("=Q", cache, header - 16)[0]
    a, b = header + 8 * 5, header + 8 * 6  # two offsets swapped, the CRC made right
    cache[a:a + 8], cache[b:b + 8] = cache[b:b + 8], cache[a:a + 8]
    assert places > 6
    (store / CACHE).write_bytes(recrc(cache))
    counts, folded, _ = stats_of(store)
    assert folded is None and counts == stepped_stats(store)


@pytest.mark.slow
@pytest.mark.spec("S-88", "D-31")
def test_a_count_through_the_cache_holds_memory_bounded_by_a_step(tmp_path: Path) -> None:
    peaks = []
    for n in (10_000, 40_000):  # both over one step (1 MiB) of records
        store = make_store(tmp_path / str(n), [f"id-{i}" for i in range(n)])
        stats_of(store)  # builds and writes the cache
        tracemalloc.start()
        try:
            counts, folded, builds = stats_of(store)
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
        assert builds == 0 and folded is not None and counts["dead_tasks"] == n
    assert peaks[1] < 1.5 * peaks[0] + 256 * 1024, peaks


class CountingReads(DirEnv):
    """The storage directory's Env, counting the bytes ``pread`` returned."""

    read = 0

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        data = super().pread(fd, size, offset)
        self.read += len(data)
        return data


@pytest.mark.spec("S-89", "S-66")
def test_a_planted_cache_larger_than_its_data_file_could_need_is_refused_unread(
        store: Path) -> None:
    """A 4 GiB (sparse) cache whose header's counts match its size: refused by its counts
    against the data file's size, before its CRC pass would read it all."""
    header = struct.Struct("=8sIQQqQQIQQ")
    places = (4 << 30) // 20
    fields = header.pack(b"DQDIDX01", 0x01020304, 0, 0, 0, places * 20, 0, 0, places, 0)
    with open(store / CACHE, "wb") as f:
        f.write(fields)
        f.truncate(header.size + 20 * places + 4)
    env = CountingReads(str(store))
    try:
        assert CachedIndex.open(env, str(store / CACHE), os.path.getsize(store / DATA)) is None
    finally:
        env.close_directory()
    assert env.read <= header.size
    page, builds = cold_page(store, 1500, 10)
    assert page == scan_page(store, 1500, 10) and builds == 1


@pytest.mark.spec("S-90")
def test_a_page_in_the_newest_quarter_is_scanned_and_a_deeper_one_builds(
        tmp_path: Path) -> None:
    store = make_store(tmp_path, [f"id-{i}" for i in range(20_000)])
    page, builds = cold_page(store, 1500, 50)  # about 8 % of the file from its end
    assert page == scan_page(store, 1500, 50) and builds == 0
    assert not (store / CACHE).exists()
    page, builds = cold_page(store, 6000, 50)  # about 30 %: a build, and the cache for later
    assert page == scan_page(store, 6000, 50) and builds == 1
    assert (store / CACHE).is_file()
