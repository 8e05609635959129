"""Generated ids never repeat, whatever ids callers supply (spec/wal.md W-28, spec/api.md C-24).

Goal: a caller's id with a long numeric head must not push later generated seeds past what
a reader parses back, so that a restart under the same pid (pid 1 in a container) never
issues an id again and one dead task never silently replaces another. Method: real ``Disk``s
on a real directory; each "process" is its own ``Env`` (its own id source) with the real,
hence the same, pid, which is exactly a container restart.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from deferq import LimitExceededError
from deferq._core.limits import INT_FIELD_MAX, SEED_CALLER_MAX
from deferq._core.names import wal_file_name
from deferq._core.walcodec import encode_add
from deferq.backends import Disk
from deferq.testing import Memory
from tests.fsenv import ManualClock, RecordingEnv


def _process(storage: Path) -> Disk:
    """A worker started afresh: a new Env (a new id source) under this same pid."""
    return Disk(path=storage, env=RecordingEnv(ManualClock()), fsync_frequency=0)


@pytest.mark.spec("W-28")
def test_a_long_numeric_caller_id_never_makes_a_restart_repeat_a_generated_id(
        storage: Path) -> None:
    with _process(storage) as first:
        first.add_task(b"order", 2_000_000_000, task_id="999999999999-order")  # stays pending
    generated: list[str] = []
    for run in range(3):
        with _process(storage) as disk:
            task_id = disk.add_task(b"job %d" % run)
            generated.append(task_id)
            disk.add_dead_task(task_id, b"job %d" % run, RuntimeError(f"run {run}"),
                               task_class="Job", attempts=1)
            disk.remove_task(task_id)
    assert len(set(generated)) == 3, generated
    with Disk(path=storage) as disk:
        assert sorted(t.id for t in disk.list_dead_tasks()) == sorted(generated)


@pytest.mark.spec("C-24")
@pytest.mark.parametrize("backend", ["disk", "memory"])
def test_a_caller_id_whose_seed_leaves_no_room_is_refused_naming_it(storage: Path,
                                                                    backend: str) -> None:
    store: Disk | Memory = Disk(path=storage) if backend == "disk" else Memory()
    with store:
        for head in (SEED_CALLER_MAX + 1, INT_FIELD_MAX):
            with pytest.raises(ValueError, match=f"invalid task_id '{head}-x': it has the seed"):
                store.add_task(b"", task_id=f"{head}-x")
        assert store.pending_tasks() == []
        # At the bound, or past what a seed can be (not a seed at all), the id is stored.
        for task_id in (f"{SEED_CALLER_MAX}-x", f"{2**63}-x", "9" * 30):
            assert store.add_task(b"", task_id=task_id) == task_id
        assert len(store.pending_tasks()) == 3


@pytest.mark.spec("W-69")
def test_a_seed_pushed_past_64_bits_by_an_old_record_stops_generation_with_a_clear_error(
        storage: Path) -> None:
    # A file an earlier version could write: a caller's id at the largest seed there is.
    storage.mkdir(parents=True)
    name = wal_file_name("deferred-", "20260807", 4242, 1)
    (storage / name).write_bytes(encode_add(f"{INT_FIELD_MAX}-old", None, b"old"))
    with _process(storage) as disk:
        with pytest.raises(LimitExceededError, match="no task id can be generated"):
            disk.add_task(b"new")
        assert disk.add_task(b"new", task_id="chosen") == "chosen"
        assert [t.task_id for t in disk.pending_tasks()] == [f"{INT_FIELD_MAX}-old", "chosen"]


@pytest.mark.spec("W-28")
def test_generated_seeds_past_twelve_digits_are_read_back_as_seeds(storage: Path) -> None:
    with _process(storage) as disk:
        disk.add_task(b"", task_id=f"{SEED_CALLER_MAX}-far")
    with _process(storage) as disk:
        far = disk.add_task(b"")
    with _process(storage) as disk:
        disk.remove_task(f"{SEED_CALLER_MAX}-far")
        disk.sync()
    with _process(storage) as disk:
        later = disk.add_task(b"")
    assert int(far.split("-")[0]) == SEED_CALLER_MAX + 1
    assert int(later.split("-")[0]) > SEED_CALLER_MAX + 1
