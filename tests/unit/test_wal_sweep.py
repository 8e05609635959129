"""The adoption sweep and the hand-off file on the real filesystem (spec/wal.md W-30..W-34,
spec/api.md C-27, C-28).

Goal: a running ``Disk`` adopts orphaned WAL files (closed or dead siblings', hand-off
files) without reopening, at most ``files_max`` per call, in name order, never a file a
live process holds, and only unlinks an orphan after an fsync covered its tasks in this
worker's file. Method: real ``Disk``s in ``tmp_path``; ``RecordingEnv`` records the
system calls for the orderings, ``FaultyEnv`` fails a chosen one; every outcome is also
checked by reopening the directory in a new ``Disk``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from deferq._core.errors import StorageBrokenError, StorageClosedError
from deferq._core.names import is_wal_file_name
from deferq._engine.osenv import OS_ENV
from deferq._engine.walorphan import HandoffWal
from deferq.backends import Disk, Nil
from deferq.testing import Memory
from tests.fsenv import FaultyEnv, RecordingEnv

PREFIX = "deferred-"


def open_disk(storage: Path, env: RecordingEnv | None = None, f: float = 0) -> Disk:
    return Disk(path=storage, prefix=PREFIX, fsync_frequency=f, env=env)


def wal_files(storage: Path) -> list[Path]:
    return sorted(p for p in storage.iterdir() if is_wal_file_name(PREFIX, p.name))


def ids(disk: Disk) -> list[str]:
    return [t.task_id for t in disk.pending_tasks()]


def orphans(storage: Path, *groups: list[str]) -> list[Path]:
    """Closed workers' WAL files, one per group of task ids (context = the id's bytes),
    in the order of ``groups``. The workers run at once, so none adopts another's file."""
    disks: list[Disk] = []
    paths: list[Path] = []
    for tasks in groups:
        before = set(wal_files(storage)) if storage.exists() else set()
        disk = open_disk(storage)
        disks.append(disk)
        for task in tasks:
            disk.add_task(task.encode(), task_id=task)
        (path,) = set(wal_files(storage)) - before
        paths.append(path)
    for disk in disks:
        disk.close()
    return paths


def orphan(storage: Path, *tasks: str) -> Path:
    return orphans(storage, list(tasks))[0]


@pytest.mark.spec("W-30", "W-32", "C-27")
def test_a_running_worker_adopts_a_closed_siblings_file_and_unlinks_it(storage: Path) -> None:
    with open_disk(storage) as worker:
        worker.add_task(b"mine", task_id="mine")
        gone = orphan(storage, "a", "b")
        adopted = worker.adopt_orphans()
        assert [(t.task_id, t.context) for t in adopted] == [("a", b"a"), ("b", b"b")]
        assert ids(worker) == ["mine", "a", "b"]
        assert not gone.exists() and len(wal_files(storage)) == 1
        assert worker.adopt_orphans() == []  # nothing left
        worker.remove_task("a")  # an adopted task is this worker's now (W-6)
    with open_disk(storage) as reopened:
        assert ids(reopened) == ["mine", "b"]


@pytest.mark.spec("W-31")
def test_a_sweep_adopts_at_most_files_max_files_oldest_name_first(storage: Path) -> None:
    with open_disk(storage) as worker:
        made = orphans(storage, ["u0"], ["u1"], ["u2"])
        holds = {path: f"u{n}" for n, path in enumerate(made)}
        by_name = sorted(made)
        first = worker.adopt_orphans(files_max=2)
        assert [t.task_id for t in first] == [holds[by_name[0]], holds[by_name[1]]]
        assert [p.exists() for p in by_name] == [False, False, True]
        second = worker.adopt_orphans(files_max=2)
        assert [t.task_id for t in second] == [holds[by_name[2]]]
        assert len(wal_files(storage)) == 1


@pytest.mark.spec("W-30", "D-22", "W-70")
def test_a_sweep_never_adopts_a_file_a_live_worker_holds(storage: Path) -> None:
    with open_disk(storage) as first, open_disk(storage) as second:
        first.add_task(b"1", task_id="one")
        second.add_task(b"2", task_id="two")
        assert first.adopt_orphans() == [] and second.adopt_orphans() == []
        assert ids(first) == ["one"] and ids(second) == ["two"]
        assert len(wal_files(storage)) == 2


@pytest.mark.spec("W-33")
def test_a_task_already_pending_here_is_kept_and_not_returned_again(storage: Path) -> None:
    with open_disk(storage) as worker:
        worker.add_task(b"here", task_id="same")
        gone = orphan(storage, "same", "other")  # as an interrupted adoption leaves it (W-4)
        adopted = worker.adopt_orphans()
        assert [t.task_id for t in adopted] == ["other"]
        assert [(t.task_id, t.context) for t in worker.pending_tasks()] == [
            ("same", b"here"), ("other", b"other")]
        assert not gone.exists()


@pytest.mark.spec("W-32", "D-21", "W-71")
@pytest.mark.parametrize("f", [0, 3600])
def test_the_adopted_tasks_are_fsynced_before_the_orphan_is_unlinked(storage: Path,
                                                                     f: float) -> None:
    env = RecordingEnv()
    with open_disk(storage, env, f=f) as worker:
        mine = wal_files(storage)[0]
        gone = orphan(storage, "a")
        env.clear()
        worker.adopt_orphans()
        fsynced = env.last_index("fsync", str(mine))
        unlinked = env.index("unlink", str(gone))
        assert fsynced < unlinked < env.index("fsync_dir", str(storage), start=unlinked)
        assert env.index("close", str(gone)) > unlinked  # released last (W-4's order)


@pytest.mark.spec("W-32", "W-13")
def test_a_failed_write_adopts_nothing_and_leaves_the_orphan_unchanged(storage: Path) -> None:
    env = FaultyEnv()
    with open_disk(storage, env) as worker:
        worker.add_task(b"mine", task_id="mine")
        mine = wal_files(storage)[0]
        gone = orphan(storage, "a", "b")
        before = gone.read_bytes()
        env.inject("write", path=str(mine))
        with pytest.raises(OSError):
            worker.adopt_orphans()
        assert gone.read_bytes() == before and ids(worker) == ["mine"]
        assert [t.task_id for t in worker.adopt_orphans()] == ["a", "b"]  # usable; next time
    with open_disk(storage) as reopened:
        assert ids(reopened) == ["mine", "a", "b"]


@pytest.mark.spec("W-32", "W-12", "W-72")
def test_a_failed_fsync_breaks_the_wal_and_leaves_the_orphan_for_the_next_worker(
        storage: Path) -> None:
    env = FaultyEnv()
    worker = open_disk(storage, env)
    mine = wal_files(storage)[0]
    gone = orphan(storage, "a")
    env.inject("fsync", path=str(mine))
    with pytest.raises(StorageBrokenError):
        worker.adopt_orphans()
    assert gone.exists()
    with pytest.raises(StorageBrokenError):
        worker.adopt_orphans()
    worker.close()
    with open_disk(storage) as reopened:
        assert ids(reopened) == ["a"]


@pytest.mark.spec("W-30")
def test_a_sweep_raises_the_id_seed_above_the_adopted_ids(storage: Path) -> None:
    with open_disk(storage) as worker:
        orphan(storage, f"9000000000-{os.getpid()}-1")
        worker.adopt_orphans()
        # Seeds are per process (W-28): an earlier test may have raised it further still.
        seed = int(worker.add_task(b"").split("-")[0])
        assert seed >= 9000000001


@pytest.mark.spec("C-27")
@pytest.mark.parametrize("bad", [0, -1, 1025, True, 2.0, "4", None])
def test_adopt_orphans_refuses_a_bad_files_max_by_name(storage: Path, bad: object) -> None:
    with open_disk(storage) as disk, Memory() as memory:
        for backend in (disk, memory):
            with pytest.raises(ValueError, match="files_max"):
                backend.adopt_orphans(bad)  # type: ignore[arg-type]


@pytest.mark.spec("C-27", "C-28")
def test_nil_and_memory_adopt_nothing_and_a_closed_disk_refuses(storage: Path) -> None:
    assert Nil().adopt_orphans() == []
    with Memory() as memory:
        memory.add_task(b"x")
        assert memory.adopt_orphans(1) == []
    disk = open_disk(storage)
    disk.close()
    with pytest.raises(StorageClosedError):
        disk.adopt_orphans()


@pytest.mark.spec("W-34")
def test_a_handoff_file_is_exactly_its_records_and_a_running_worker_adopts_it(
        storage: Path) -> None:
    with open_disk(storage) as worker:
        with HandoffWal(OS_ENV, str(storage), PREFIX) as handoff:
            first = handoff.add_task(b'{"x": 1}')
            second = handoff.add_task(b'{"x": 2}', 1_900_000_000)
            assert wal_files(storage) == [wal_files(storage)[0]]  # nothing written before sync
            handoff.sync()
            (name,) = handoff.file_names
        path = storage / name
        data = path.read_bytes()
        assert data.endswith(b"\n") and b"\0" not in data  # no reserved space (W-25)
        assert data.count(b"\n") == 3  # the seed marker and two adds
        adopted = worker.adopt_orphans()
        assert [(t.task_id, t.context, t.publish_at) for t in adopted] == [
            (first, b'{"x": 1}', None), (second, b'{"x": 2}', 1_900_000_000)]
        assert not path.exists()


@pytest.mark.spec("W-34", "W-73")
def test_a_handoff_whose_fsync_fails_leaves_no_file_and_raises(storage: Path) -> None:
    with open_disk(storage):
        pass
    before = wal_files(storage)
    env = FaultyEnv()
    env.inject("fsync")
    with HandoffWal(env, str(storage), PREFIX) as handoff:
        handoff.add_task(b"x")
        with pytest.raises(OSError):
            handoff.sync()
    assert wal_files(storage) == before


@pytest.mark.spec("W-34", "W-28", "W-74")
def test_a_handoff_generates_ids_above_every_seed_in_the_directory(storage: Path) -> None:
    # A live worker's file (and a closed one's) hold seeds far above the clock, under this
    # pid: a hand-off whose own id source (a fresh Env) ignored them could reissue their ids.
    closed = f"9200000000-{os.getpid()}-1"
    with open_disk(storage) as worker:
        worker.add_task(b"x", task_id=f"9100000000-{os.getpid()}-1")
        orphan(storage, closed)
        with HandoffWal(RecordingEnv(), str(storage), PREFIX) as handoff:
            new = handoff.add_task(b"y")
            handoff.sync()
        assert int(new.split("-")[0]) > 9200000000
        assert {t.task_id for t in worker.adopt_orphans()} == {closed, new}
