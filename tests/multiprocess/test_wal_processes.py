"""The tasks WAL across real worker processes: claiming, adoption, torn tails, merging (spec/wal.md).

Goal: show that a worker's WAL file is its own while it lives, that the next
worker adopts the files of dead workers with exactly the acknowledged tasks,
cuts a torn tail left by a kill mid-write, and merges several orphans into one.

Method: workers are separate interpreters (``workers.WorkerPool``) with
``fsync_frequency=0`` that report every acknowledged add and remove over a
pipe, then are SIGKILLed, so their flocks are released by the kernel exactly
as after a crash. A "stalled" worker writes half of a big record through the
real WAL code and announces the stall before blocking, so the kill lands
mid-write without any sleep. Files are inspected by name (F-1 puts the
creator's pid in it) and decoded line by line from the parent.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fsenv import append_to_wal, wal_size
from tests.multiprocess.workers import Reply, Worker, WorkerPool, lock_is_free, scan_wal_file

pytestmark = pytest.mark.multiprocess

Task = tuple[str, bytes, int | None]


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[WorkerPool]:
    with WorkerPool(tmp_path) as workers:
        yield workers


def _expected_pending(reply: Reply) -> list[Task]:
    """The acknowledged adds of an ``add_tasks`` reply minus its acknowledged removes."""
    removed = set(reply.texts("removed"))
    return [task for task in reply.tasks("acked") if task[0] not in removed]


def _pending(worker: Worker) -> list[Task]:
    return worker.call("pending").tasks("tasks")


def _wal_file(worker: Worker) -> str:
    return worker.call("wal_file").text("name")


def _creator_pid(wal_file: str) -> int:
    """The pid field of a WAL file name (F-1: ``{prefix}0-{date}-{pid}-{rand}``)."""
    return int(wal_file.split("-")[-2])


@pytest.mark.slow
@pytest.mark.spec("D-12", "W-27", "D-1")
def test_next_worker_adopts_killed_workers_wal_with_exactly_the_acknowledged_tasks(
        pool: WorkerPool) -> None:
    dead = pool.spawn(fsync_frequency=0)
    dead_file = _wal_file(dead)
    reply = dead.call("add_tasks", count=60, remove_every=3)
    expected = _expected_pending(reply)
    assert len(expected) == 40 and len(reply.texts("removed")) == 20
    dead.kill()

    heir = pool.spawn(fsync_frequency=0)
    heir_file = _wal_file(heir)  # Adopted: copied to a fresh file of the heir's (W-3).
    assert _creator_pid(dead_file) == dead.pid != heir.pid == _creator_pid(heir_file)
    assert pool.wal_files() == [heir_file]  # The adopted file is unlinked (W-4).
    assert _pending(heir) == expected


@pytest.mark.slow
@pytest.mark.spec("W-27")
def test_live_workers_keep_their_own_files_and_only_a_dead_ones_is_adopted(
        pool: WorkerPool) -> None:
    worker_a = pool.spawn()
    worker_b = pool.spawn()
    file_a, file_b = _wal_file(worker_a), _wal_file(worker_b)
    assert file_a != file_b
    assert _creator_pid(file_a) == worker_a.pid and _creator_pid(file_b) == worker_b.pid
    task_a = worker_a.call("add_task", context_hex=b"from a".hex()).text("task_id")
    task_b = worker_b.call("add_task", context_hex=b"from b".hex()).text("task_id")
    for name in (file_a, file_b):
        assert not lock_is_free(pool.storage / name)

    # A third worker, while both live, claims neither file and sees neither task.
    worker_c = pool.spawn()
    file_c = _wal_file(worker_c)
    assert file_c not in (file_a, file_b) and _creator_pid(file_c) == worker_c.pid
    assert _pending(worker_c) == []

    worker_a.kill()
    heir = pool.spawn()
    heir_file = _wal_file(heir)
    assert heir_file not in (file_a, file_b, file_c) and _creator_pid(heir_file) == heir.pid
    assert _pending(heir) == [(task_a, b"from a", None)]
    assert pool.wal_files() == sorted([heir_file, file_b, file_c])
    # The live workers still own their files and tasks.
    worker_b.call("add_task", context_hex=b"b again".hex(), task_id="b-2")
    assert [t[0] for t in _pending(worker_b)] == [task_b, "b-2"]
    assert _wal_file(worker_b) == file_b and _wal_file(worker_c) == file_c


@pytest.mark.slow
@pytest.mark.spec("W-3", "W-4", "D-5", "D-12", "R-@F", "W-26", "W-45")
@pytest.mark.parametrize("fsync_frequency", [0, 1], ids=["written (f=0)", "stored (f=1, mapped)"])
def test_torn_tail_of_worker_killed_mid_write_is_left_behind_and_later_records_survive(
        pool: WorkerPool, fsync_frequency: int) -> None:
    # With f = 1 the records are copied into a mapping of the reserved space (W-26) and the
    # kill interrupts that copy; with f = 0 it interrupts a write system call.
    victim = pool.spawn(stall_writes_over=1024 * 1024, fsync_frequency=fsync_frequency)
    victim_file = _wal_file(victim)
    kept = victim.call("add_task", context_hex=b"small".hex()).text("task_id")
    wal_path = pool.storage / victim_file
    valid_size = wal_size(wal_path)
    victim.send("add_task", context_bytes=3 * 1024 * 1024)
    stalled = victim.expect("stalled")
    assert 0 < stalled.number("written") < stalled.number("size")
    assert stalled.text("via") == ("store" if fsync_frequency else "write")
    victim.kill()
    assert wal_size(wal_path) == valid_size + stalled.number("written")
    assert scan_wal_file(wal_path).tail, "the kill left no torn tail"

    heir = pool.spawn()
    heir_file = _wal_file(heir)
    assert pool.wal_files() == [heir_file] != [victim_file]  # W-3, W-4: copied, then unlinked.
    assert _pending(heir) == [(kept, b"small", None)]
    own = [heir.call("add_task", context_hex=f"heir {n}".encode().hex(), task_id=f"heir-{n}")
           .text("task_id") for n in range(3)]
    heir.kill()

    scan = scan_wal_file(pool.storage / heir_file)
    assert scan.damaged == 0 and scan.tail == b""
    assert scan.ids == [kept, *own]
    second_heir = pool.spawn()
    assert pool.wal_files() == [_wal_file(second_heir)] != [heir_file]
    assert _pending(second_heir) == [(kept, b"small", None),
                                     *[(tid, f"heir {n}".encode(), None)
                                       for n, tid in enumerate(own)]]


@pytest.mark.slow
@pytest.mark.spec("W-3", "W-4")
def test_files_of_several_dead_workers_are_merged_into_one(pool: WorkerPool) -> None:
    # All three live at once, so each creates its own file (W-27).
    workers = [pool.spawn() for _ in range(3)]
    expected_by_file: dict[str, list[Task]] = {}
    for worker in workers:
        reply = worker.call("add_tasks", count=30, remove_every=4)
        expected_by_file[_wal_file(worker)] = _expected_pending(reply)
    for worker in workers:
        worker.kill()
    files = sorted(expected_by_file)
    assert pool.wal_files() == files
    # A torn tail on an orphan that will be merged: only valid records are copied.
    append_to_wal(pool.storage / files[-1], b"0badc0de:add:torn")

    heir = pool.spawn()
    heir_file = _wal_file(heir)  # A fresh copy (W-3), in the adopted files' name order.
    assert pool.wal_files() == [heir_file] and heir_file not in files  # Orphans unlinked (W-4).
    expected = [task for name in files for task in expected_by_file[name]]
    assert _pending(heir) == expected
    heir.kill()

    scan = scan_wal_file(pool.storage / heir_file)
    assert scan.damaged == 0 and scan.tail == b""
    second_heir = pool.spawn()
    assert pool.wal_files() == [_wal_file(second_heir)]
    assert _pending(second_heir) == expected


@pytest.mark.slow
@pytest.mark.spec("W-1", "W-27", "D-1")
def test_new_file_claimed_by_a_booting_worker_before_its_creator_locked_it_stays_live(
        pool: WorkerPool) -> None:
    # The creator stops between O_EXCL create and flock (W-1); a second worker boots in
    # that window, finds the unlocked file and adopts it (W-27): it copies it to a fresh
    # file of its own and unlinks it (W-3, W-4). The creator's flock then succeeds on an
    # unlinked inode: it must leave that file alone and use another name.
    creator = pool.spawn(pause_before_new_file_lock=True, wait_ready=False)
    creator.expect("stalled")
    [new_file] = pool.wal_files()
    claimer = pool.spawn()
    claimer_file = _wal_file(claimer)
    assert pool.wal_files() == [claimer_file] != [new_file]
    creator.send("continue")
    creator.expect("ready")
    creator_file = _wal_file(creator)
    assert creator_file not in (new_file, claimer_file)
    assert pool.wal_files() == sorted([claimer_file, creator_file])

    task = claimer.call("add_task", context_hex=b"claimed".hex()).text("task_id")
    claimer.kill()
    heir = pool.spawn()
    assert _wal_file(heir) not in (claimer_file, creator_file)
    assert _pending(heir) == [(task, b"claimed", None)]
    assert _pending(creator) == []


@pytest.mark.slow
@pytest.mark.spec("W-1", "W-4", "D-1")
def test_new_file_merged_away_by_a_booting_worker_before_its_creator_locked_it_is_not_used(
        pool: WorkerPool) -> None:
    # As above, but the booting worker adopts an older orphan as its main file, so it
    # merges the creator's empty new file, unlinks it and closes it, all inside the
    # creator's window. The creator's flock then succeeds on an unlinked inode: it
    # must not write its tasks there.
    creator = pool.spawn(pause_before_new_file_lock=True, wait_ready=False)
    creator.expect("stalled")
    (pool.storage / "deferred-0-00000000-1-0").touch()  # An orphan sorting before any other.
    [orphan, new_file] = pool.wal_files()
    claimer = pool.spawn()
    claimer_file = _wal_file(claimer)
    # Both adopted files were copied to the claimer's fresh file and unlinked (W-3, W-4).
    assert pool.wal_files() == [claimer_file] and claimer_file not in (orphan, new_file)
    creator.send("continue")
    creator.expect("ready")
    creator_file = _wal_file(creator)
    assert pool.wal_files() == sorted([claimer_file, creator_file])

    task = creator.call("add_task", context_hex=b"mine".hex()).text("task_id")
    creator.kill()
    heir = pool.spawn()
    assert _wal_file(heir) not in (claimer_file, creator_file)
    assert _pending(heir) == [(task, b"mine", None)]
