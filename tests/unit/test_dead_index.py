"""The dead-task store's per-process index, cold find and streaming compaction (S-10..S-13, S-15).

Goal: the index is used only while it describes the data file (S-10): it is extended in
place after appends by this or another process, and dropped after a compaction by
another process, a cut into its bytes, or a file replaced under a reused inode number;
warm reads touch only the records they return (S-11); it is built only by a full list or
after scans have read a file's worth of bytes; a cold find reads each byte once (S-13);
a remove is one compaction in bounded memory whatever the number of ids (S-15).
Method: ``Disk`` on a real directory with ``tests.fsenv.RecordingEnv`` (bytes read,
calls made); a second ``Disk`` on the same directory is "another process" (its own lock
file description, A-8); an env wrapper that reports one constant inode number and lock
ctime stands for a filesystem that reuses inode numbers within one clock tick.
"""

from __future__ import annotations

import os
import tracemalloc
from dataclasses import replace
from pathlib import Path

import pytest

from deferq._engine.env import FileStat
from deferq._core.deadcodec import encode_dead
from deferq._core.limits import READ_CHUNK_BYTES
from deferq._core.types import DeadTask
from deferq.backends import Disk
from tests.fsenv import RecordingEnv

PREFIX = "deferred-"
DATA = "deferred-dead_tasks-0"
TMP = "deferred-dead_tasks-0.tmp"


def dead(task_id: str, message: str = "gave up") -> DeadTask:
    return DeadTask(id=task_id, task_class="job.T", attempts=3, enqueued_at=1, failed_at=2,
                    exception_class="ValueError", exception_message=message, backtrace=("f",),
                    context=b"ctx-" + task_id.encode())


def open_disk(storage: Path, env: RecordingEnv | None = None) -> Disk:
    return Disk(path=storage, prefix=PREFIX, fsync_frequency=0, env=env)


def add(disk: Disk, *ids: str) -> None:
    for task_id in ids:
        disk._dead.add(dead(task_id))


def ids_of(disk: Disk, **kwargs: int | None) -> list[str]:
    return [t.id for t in disk.list_dead_tasks(**kwargs)]  # type: ignore[arg-type]


def write_store(storage: Path, ids: list[str]) -> int:
    storage.mkdir(parents=True, exist_ok=True)
    data = b"".join(encode_dead(dead(i)) for i in ids)
    (storage / DATA).write_bytes(data)
    return len(data)


class SameInodeEnv(RecordingEnv):
    """Reports inode 7 for every file and a fixed ctime: inode reuse within one tick."""

    def fstat(self, fd: int) -> FileStat:
        return super().fstat(fd)._replace(inode=7, ctime_ns=1)


# ----------------------------------------------------------------------------- S-10


@pytest.mark.spec("S-10", "S-11", "D-11", "S-45", "S-46")
def test_appends_by_another_process_extend_the_index_in_place(storage: Path) -> None:
    env = RecordingEnv()
    with open_disk(storage, env) as mine, open_disk(storage) as other:
        add(mine, *[f"t{n}" for n in range(200)])
        assert len(ids_of(mine, limit=None)) == 200 and mine._dead._index is not None
        index = mine._dead._index
        add(other, "new")
        env.clear()
        found = mine.find_dead_task("new")
        assert found is not None and found.context == b"ctx-new"
        assert mine._dead._index is index  # extended, not rebuilt
        line = len(encode_dead(dead("new")))
        assert env.bytes_read(str(storage / DATA)) < 4 * line + READ_CHUNK_BYTES // 8


@pytest.mark.spec("S-10", "D-11", "S-45")
def test_a_compaction_by_another_process_drops_the_index_even_when_the_file_grew_back(
        storage: Path) -> None:
    with open_disk(storage) as mine, open_disk(storage) as other:
        add(mine, "a", "b", "c")
        assert ids_of(mine, limit=None) == ["c", "b", "a"]
        assert other.remove_dead_tasks(["a"]) == 1
        add(other, "d", "e")  # the file is now larger than what mine indexed
        found = mine.find_dead_task("d")
        assert found is not None and found.id == "d"
        assert mine.find_dead_task("a") is None
        assert ids_of(mine, limit=None) == ["e", "d", "c", "b"]


@pytest.mark.spec("S-10", "S-45")
def test_with_a_reused_inode_number_the_checked_bytes_still_catch_the_new_file(
        storage: Path) -> None:
    env = SameInodeEnv()
    with open_disk(storage, env) as mine, open_disk(storage, SameInodeEnv()) as other:
        add(mine, "a", "b", "c")
        assert ids_of(mine, limit=None) == ["c", "b", "a"]
        assert other.remove_dead_tasks(["a"]) == 1
        add(other, "d", "e")
        assert mine.find_dead_task("d") is not None
        assert mine.find_dead_task("a") is None
        assert ids_of(mine, limit=None) == ["e", "d", "c", "b"]


@pytest.mark.spec("S-10", "R-@F", "S-45")
def test_a_cut_into_the_indexed_bytes_drops_the_index(storage: Path) -> None:
    with open_disk(storage) as mine:
        add(mine, "a", "b", "c")
        assert ids_of(mine, limit=None) == ["c", "b", "a"]
        data = (storage / DATA).read_bytes()
        (storage / DATA).write_bytes(data[: data.rindex(b"\n", 0, len(data) - 1) + 5])
        assert ids_of(mine, limit=None) == ["b", "a"]  # "c" is now a torn tail
        assert mine.find_dead_task("c") is None


@pytest.mark.spec("S-10", "S-4", "S-46", "S-47")
def test_our_own_adds_and_a_torn_tail_are_folded_into_the_index(storage: Path) -> None:
    with open_disk(storage) as mine:
        add(mine, "a")
        assert ids_of(mine, limit=None) == ["a"]
        index = mine._dead._index
        with open(storage / DATA, "ab") as handle:
            handle.write(b"torn")
        assert ids_of(mine, limit=None) == ["a"]
        add(mine, "b")  # cuts the torn tail, appends, extends the index
        assert mine._dead._index is index and index is not None and index.ids == ["a", "b"]
        assert ids_of(mine, limit=None) == ["b", "a"]


# ----------------------------------------------------------------------------- S-11


@pytest.mark.spec("S-11", "D-18", "S-49", "S-50")
def test_warm_reads_touch_only_the_records_they_return(storage: Path) -> None:
    ids = [f"task-{n}" for n in range(3000)]
    size = write_store(storage, ids)
    env = RecordingEnv()
    data = str(storage / DATA)
    with open_disk(storage, env) as disk:
        assert len(ids_of(disk, limit=None)) == 3000
        assert env.bytes_read(data) >= size  # the full list built the index
        for task_id in ("task-0", "task-1500", "absent"):
            env.clear()
            found = disk.find_dead_task(task_id)
            assert (found is None) == (task_id == "absent")
            assert env.bytes_read(data) <= 2 * len(encode_dead(dead("task-1500")))
        env.clear()
        assert ids_of(disk, offset=2990, limit=5) == [f"task-{n}" for n in range(9, 4, -1)]
        assert env.bytes_read(data) <= 7 * len(encode_dead(dead("task-1500")))
        assert disk._dead._index is not None and disk._dead._index.memory_items() == 3000


@pytest.mark.spec("S-11", "S-13", "D-14", "S-52")
def test_the_index_is_built_only_by_a_full_list_or_after_a_file_of_scanning(
        storage: Path) -> None:
    ids = [f"task-{n}" for n in range(1010)]
    size = write_store(storage, ids)
    env = RecordingEnv()
    data = str(storage / DATA)
    with open_disk(storage, env) as disk:
        env.clear()
        assert disk.find_dead_task("absent") is None
        assert env.bytes_read(data) == size  # S-13: each byte once
        assert disk._dead._index is None
        assert disk.find_dead_task("task-3") is not None  # a file's worth was scanned: build
        assert disk._dead._index is not None
    with open_disk(storage) as disk:
        assert len(ids_of(disk, limit=50)) == 50
        assert ids_of(disk, offset=500, limit=5) == [f"task-{n}" for n in range(509, 504, -1)]
        assert disk._dead._index is None  # reads that scanned less than a file: no index
        assert len(ids_of(disk, limit=None)) == 1010
        assert disk._dead._index is not None


@pytest.mark.spec("S-11", "S-9", "S-47")
def test_our_own_compaction_drops_the_index_and_reads_stay_right(storage: Path) -> None:
    with open_disk(storage) as disk:
        add(disk, "a", "b", "c")
        assert ids_of(disk, limit=None) == ["c", "b", "a"]
        assert disk.remove_dead_tasks(["b"]) == 1
        assert disk._dead._index is None
        assert ids_of(disk, limit=None) == ["c", "a"]
        assert disk.remove_dead_tasks(["zz"]) == 0
        assert disk._dead._index is not None  # nothing was compacted: still valid
        assert ids_of(disk, limit=None) == ["c", "a"]


# ----------------------------------------------------------------------------- S-15


@pytest.mark.spec("S-15", "S-5")
def test_removing_a_thousand_ids_is_one_compaction(storage: Path) -> None:
    ids = [f"task-{n}" for n in range(3000)]
    write_store(storage, ids)
    env = RecordingEnv()
    gone = set(ids[::3])
    with open_disk(storage, env) as disk:
        env.clear()
        assert disk.remove_dead_tasks(gone) == 1000
        tmp = str(storage / TMP)
        assert len(env.calls_of("open", tmp)) == 1 and len(env.calls_of("fsync", tmp)) == 1
        assert len(env.calls_of("rename")) == 1
        assert len(env.calls_of("open", str(storage / DATA))) == 1
        assert ids_of(disk, limit=None) == [i for i in reversed(ids) if i not in gone]


@pytest.mark.slow
@pytest.mark.spec("S-15", "D-14")
def test_compaction_memory_does_not_grow_with_the_store(storage: Path) -> None:
    peaks = []
    for count in (2_000, 20_000):
        path = storage / str(count)
        write_store(path, [f"task-{n}" for n in range(count)])
        with open_disk(path) as disk:
            tracemalloc.start()
            try:
                assert disk.remove_dead_tasks(["task-1"]) == 1
                peaks.append(tracemalloc.get_traced_memory()[1])
            finally:
                tracemalloc.stop()
    size = os.path.getsize(storage / "20000" / DATA)
    assert peaks[1] < 3 * 1024 * 1024 < size
    assert peaks[1] < 2 * peaks[0] + 512 * 1024
