"""Engine bugs found by the crash exploration: regression tests (strict xfails while open).

Goal: pin each bug the exploration found (``deferq crash-test --max-ops 3``) to a
minimal, deterministic reproduction, so the fix can be verified: an open bug is a
``strict=True`` xfail (a fix makes this module fail until its marker is dropped), a
fixed one stays as a regression test.
Method: drive ``Disk`` on a ``SimDisk`` by hand through the failing sequence, then boot
the durable image (a power loss that keeps nothing unsynced) and read what a fresh
worker recovers.
"""

from __future__ import annotations

import pytest

from deferq._core.errors import StorageBrokenError
from deferq.backends import Disk
from deferq.crashtest import FaultRule, FsyncEio, SimDisk


@pytest.mark.spec("D-1", "D-5", "W-3")
def test_add_acknowledged_after_adopting_a_wal_whose_fsync_failed_survives_power_loss() -> None:
    disk = SimDisk(0)
    first = Disk(path="/s", fsync_frequency=0, env=disk.process())
    disk.inject(FaultRule(op="fsync", fault=FsyncEio(), path="/s/deferred-0-*"))
    with pytest.raises(StorageBrokenError):
        first.add_task(b"a", task_id="t1")  # the fsync fails; its pages are dropped
    first.close()  # W-12: the broken WAL closes without an fsync
    second = Disk(path="/s", fsync_frequency=0, env=disk.process())  # adopts the WAL
    assert [t.task_id for t in second.pending_tasks()] == ["t1"]  # from the page cache only
    second.add_task(b"b", task_id="t2")  # returns: written and fsynced, so D-1 applies
    rebooted = SimDisk(0, image=disk.durable_image())  # power loss: only what is durable
    third = Disk(path="/s", fsync_frequency=0, env=rebooted.process())
    # The adopted file (t1's dropped line: NUL bytes on disk, R-@K) was replaced at adoption
    # by a fresh copy holding t1, fsynced before it was used (W-3), so both survive.
    assert [t.task_id for t in third.pending_tasks()] == ["t1", "t2"]


@pytest.mark.spec("D-2", "D-3", "W-3")
def test_task_recovered_and_synced_by_an_adopting_worker_survives_power_loss() -> None:
    disk = SimDisk(0)
    first = Disk(path="/s", fsync_frequency=0.5, env=disk.process())
    first.add_task(b"a", task_id="t1")  # acknowledged; the periodic fsync has not run yet
    disk.inject(FaultRule(op="fsync", fault=FsyncEio(), path="/s/deferred-0-*"))
    with pytest.raises(StorageBrokenError):
        first.close()  # the final fsync fails (C-9); the dirty pages are dropped
    second = Disk(path="/s", fsync_frequency=0.5, env=disk.process())  # adopts the WAL
    assert [t.task_id for t in second.pending_tasks()] == ["t1"]  # "recovered"
    second.sync()
    second.close()  # returns: its open copied t1 to a fresh file and fsynced that (W-3)
    rebooted = SimDisk(0, image=disk.durable_image())  # power loss
    third = Disk(path="/s", fsync_frequency=0.5, env=rebooted.process())
    assert "t1" in [t.task_id for t in third.pending_tasks()]  # D-2: "the WAL's next fsync has run"
