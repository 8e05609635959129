"""A compaction that fails removes its staging file (spec/dead-tasks.md S-16).

Goal: when ``remove_dead_tasks`` fails while writing or fsyncing the staging file
(ENOSPC, EIO), the partial ``.tmp`` must not stay behind: on a full disk it would keep
the space it took and every later add would fail too. The original error still reaches
the caller, even when the unlink of the staging file fails as well; the data file is
byte-identical and the store stays usable (S-8). Method: the simulated disk with
``FaultRule`` faults on the staging file's ``write`` and ``fsync``, and the real
filesystem through ``tests.fsenv.FaultyEnv`` (a short write, then ENOSPC, as a disk
filling up mid-copy does).
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from deferq._core.errors import StorageBrokenError
from deferq.backends import Disk
from deferq.crashtest import Eio, Enospc, FaultRule, FsyncEio, SimDisk
from deferq.crashtest._faults import Fault
from tests.fsenv import FaultyEnv

PREFIX = "deferred-"
DATA = "/s/deferred-dead_tasks-0"
TMP = "/s/deferred-dead_tasks-0.tmp"


def add(disk: Disk, task_id: str) -> str:
    return disk.add_dead_task(task_id, b"ctx-" + task_id.encode(), ValueError("boom"),
                              task_class="app.Task", attempts=1)


def listed(disk: Disk) -> list[str]:
    return sorted(task.id for task in disk.list_dead_tasks())


@pytest.mark.spec("S-16", "S-8")
@pytest.mark.parametrize(("op", "fault", "code"), [
    ("write", Enospc(), errno.ENOSPC),
    ("write", Eio(), errno.EIO),
    ("fsync", Enospc(), errno.ENOSPC),
    ("fsync", FsyncEio(), errno.EIO),
])
def test_on_a_simulated_disk_a_failed_compaction_leaves_no_staging_file(
        op: str, fault: Fault, code: int) -> None:
    sim = SimDisk(3)
    disk = Disk(path="/s", prefix=PREFIX, fsync_frequency=0, env=sim.process())
    try:
        for task_id in ("a", "b", "c"):
            add(disk, task_id)
        before = sim.read(DATA)
        sim.inject(FaultRule(op=op, fault=fault, path=TMP))
        with pytest.raises(OSError) as info:
            disk.remove_dead_tasks(["b"])
        assert info.value.errno == code  # the original error, not one of the cleanup
        assert not isinstance(info.value, StorageBrokenError)
        assert not sim.exists(TMP)
        assert sim.read(DATA) == before
        add(disk, "d")  # the store is usable and the space is free again
        assert listed(disk) == ["a", "b", "c", "d"]
        assert disk.remove_dead_tasks(["b"]) == 1
        assert listed(disk) == ["a", "c", "d"]
        assert not sim.exists(TMP)
    finally:
        disk.close()


@pytest.mark.spec("S-16")
def test_on_a_simulated_disk_a_failed_unlink_of_the_staging_file_does_not_hide_the_error(
        caplog: pytest.LogCaptureFixture) -> None:
    sim = SimDisk(4)
    disk = Disk(path="/s", prefix=PREFIX, fsync_frequency=0, env=sim.process())
    try:
        add(disk, "a")
        add(disk, "b")
        before = sim.read(DATA)
        sim.inject(FaultRule(op="write", fault=Enospc(), path=TMP))
        sim.inject(FaultRule(op="unlink", fault=Eio(), path=TMP))
        with pytest.raises(OSError) as info:
            disk.remove_dead_tasks(["a"])
        assert info.value.errno == errno.ENOSPC
        assert "could not remove the staging file" in caplog.text
        assert sim.read(DATA) == before
        # The next compaction truncates the leftover and succeeds.
        assert disk.remove_dead_tasks(["a"]) == 1
        assert listed(disk) == ["b"]
        assert not sim.exists(TMP)
    finally:
        disk.close()


@pytest.mark.spec("S-16", "S-8")
@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EIO])
def test_on_the_real_filesystem_a_copy_that_fills_the_disk_leaves_no_staging_file(
        storage: Path, error: int) -> None:
    env = FaultyEnv()
    tmp = storage / "deferred-dead_tasks-0.tmp"
    data = storage / "deferred-dead_tasks-0"
    with Disk(path=storage, prefix=PREFIX, fsync_frequency=0, env=env) as disk:
        for task_id in ("a", "b", "c"):
            add(disk, task_id)
        before = data.read_bytes()
        # A disk filling up mid-copy: part of the survivors is written, then the error.
        env.inject("write", short_bytes=7, path=str(tmp))
        env.inject("write", nth=2, error=error, path=str(tmp))
        with pytest.raises(OSError) as info:
            disk.remove_dead_tasks(["b"])
        assert info.value.errno == error
        assert not tmp.exists()
        assert data.read_bytes() == before
        add(disk, "d")
        assert disk.remove_dead_tasks(["b"]) == 1
        assert listed(disk) == ["a", "c", "d"]


@pytest.mark.spec("S-16", "S-8")
def test_on_the_real_filesystem_a_failed_fsync_of_the_staging_file_removes_it(
        storage: Path) -> None:
    env = FaultyEnv()
    tmp = storage / "deferred-dead_tasks-0.tmp"
    data = storage / "deferred-dead_tasks-0"
    with Disk(path=storage, prefix=PREFIX, fsync_frequency=0, env=env) as disk:
        add(disk, "a")
        add(disk, "b")
        before = data.read_bytes()
        env.inject("fsync", error=errno.EIO, path=str(tmp))
        with pytest.raises(OSError) as info:
            disk.remove_dead_tasks(["a"])
        assert info.value.errno == errno.EIO
        assert not tmp.exists()
        assert data.read_bytes() == before
        assert not env.calls_of("rename")
