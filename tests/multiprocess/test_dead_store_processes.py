"""The dead-task store shared by real OS processes (spec/dead-tasks.md, D-8..D-12).

Goal: show that processes sharing one store serialize on the lock file, lose
no acknowledged record to concurrent adds or compactions (the renamed-inode
race of the reference design), release the lock the instant they are killed,
and time out with the specified message when the lock stays held.

Method: every actor is a separate interpreter started by ``workers.WorkerPool``
and driven over pipes; flock, rename and SIGKILL are real. Readiness is
signalled over the pipes (a "stalled" child announces that it is frozen inside
the store's write while holding the lock), never guessed with sleeps. Files
are checked from the parent by decoding every line outside deferq's reader,
and by fresh reader processes. One deliberately broken store (it caches its
data descriptor from init) runs the renamed-inode scenario to prove the test
detects the bug it is about.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.multiprocess.workers import (
    WorkerPool,
    assert_ran_concurrently,
    lock_is_free,
    scan_dead_file,
)

pytestmark = pytest.mark.multiprocess


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[WorkerPool]:
    with WorkerPool(tmp_path) as workers:
        yield workers


def _dead_ids_seen_by_fresh_reader(pool: WorkerPool) -> list[str]:
    reader = pool.spawn()
    ids = reader.call("list_dead").texts("ids")
    reader.close()
    return ids


@pytest.mark.slow
@pytest.mark.spec("D-11", "L-1")
def test_concurrent_adds_from_four_processes_are_all_kept(pool: WorkerPool) -> None:
    workers = [pool.spawn() for _ in range(4)]
    pool.start_together([(worker, "add_dead_many", {"prefix": f"w{number}-", "start": 0,
                                                     "count": 200})
                         for number, worker in enumerate(workers)])
    acked: set[str] = set()
    replies = [worker.expect("result") for worker in workers]
    for number, reply in enumerate(replies):
        assert reply.texts("acked") == [f"w{number}-{i}" for i in range(200)]
        acked.update(reply.texts("acked"))
    assert_ran_concurrently(replies)

    scan = scan_dead_file(pool.dead_data_path)
    assert scan.damaged == 0 and scan.tail == b""
    assert len(scan.ids) == 800 and set(scan.ids) == acked
    assert set(_dead_ids_seen_by_fresh_reader(pool)) == acked


@pytest.mark.slow
@pytest.mark.spec("D-11", "D-9", "S-3")
def test_adds_racing_removes_keep_every_acknowledged_outcome(pool: WorkerPool) -> None:
    ack_files = [str(pool.tmp_path / f"acked-{n}.txt") for n in range(2)]
    adders = [pool.spawn() for _ in range(2)]
    removers = [pool.spawn() for _ in range(2)]
    # Some acknowledged adds first, so the removers always have ids to pick from.
    for number, adder in enumerate(adders):
        adder.call("add_dead_many", prefix=f"a{number}-", start=0, count=20,
                   ack_file=ack_files[number])
    pool.start_together(
        [(adder, "add_dead_many", {"prefix": f"a{number}-", "start": 20, "count": 130,
                                   "ack_file": ack_files[number]})
         for number, adder in enumerate(adders)]
        + [(remover, "remove_dead_random", {"ack_files": ack_files, "count": 40, "seed": number})
           for number, remover in enumerate(removers)])

    acked: set[str] = set()
    add_replies = [adder.expect("result") for adder in adders]
    for number, reply in enumerate(add_replies):
        acked.update(f"a{number}-{i}" for i in range(20))
        acked.update(reply.texts("acked"))
    removed: list[str] = []
    remove_replies = [remover.expect("result") for remover in removers]
    for reply in remove_replies:
        removed.extend(reply.texts("removed"))
    # Which operation wins the lock when is up to the scheduler (L-1 never queues
    # waiters); what is certain is that all four commands were running at once.
    assert_ran_concurrently(add_replies + remove_replies)

    assert len(acked) == 300
    assert removed, "no remove found its id"
    assert len(removed) == len(set(removed)), "an id was reported removed twice"
    assert set(removed) <= acked
    scan = scan_dead_file(pool.dead_data_path)
    assert scan.damaged == 0 and scan.tail == b""
    assert sorted(scan.ids) == sorted(acked - set(removed))
    assert set(_dead_ids_seen_by_fresh_reader(pool)) == acked - set(removed)


def _renamed_inode_scenario(pool: WorkerPool, dead_store: str) -> bool:
    """Return whether B's add after A's compaction is visible to a fresh reader.

    B opens the store before A compacts; A renames a compacted data file over the
    path; then B adds. Checks on the way that the data inode changed and the lock
    inode did not (S-2).
    """
    writer_b = pool.spawn(dead_store=dead_store)
    writer_b.call("add_dead", task_id="b-before", context_bytes=100)
    data_inode = os.stat(pool.dead_data_path).st_ino
    lock_inode = os.stat(pool.dead_lock_path).st_ino

    compactor_a = pool.spawn()
    compactor_a.call("add_dead", task_id="a-keep", context_bytes=100)
    compactor_a.call("add_dead", task_id="a-doomed", context_bytes=100)
    assert compactor_a.call("remove_dead", ids=["a-doomed"]).number("count") == 1
    assert os.stat(pool.dead_data_path).st_ino != data_inode, "the compaction renamed nothing"
    assert os.stat(pool.dead_lock_path).st_ino == lock_inode

    writer_b.call("add_dead", task_id="b-after", context_bytes=100)
    seen = _dead_ids_seen_by_fresh_reader(pool)
    assert {"b-before", "a-keep"} <= set(seen) and "a-doomed" not in seen
    assert os.stat(pool.dead_lock_path).st_ino == lock_inode
    return "b-after" in seen


@pytest.mark.slow
@pytest.mark.spec("S-2", "S-3", "D-11")
def test_add_after_another_process_compacted_goes_to_the_live_file(pool: WorkerPool) -> None:
    assert _renamed_inode_scenario(pool, "correct")
    assert scan_dead_file(pool.dead_data_path).ids == ["b-before", "a-keep", "b-after"]


@pytest.mark.slow
@pytest.mark.spec("S-3", "D-11")
def test_store_caching_its_data_fd_loses_the_add_in_the_same_scenario(pool: WorkerPool) -> None:
    # The broken store's add is acknowledged but lands in the unlinked inode: the
    # scenario above would fail for it, so the test has teeth.
    assert not _renamed_inode_scenario(pool, "cached_fd")
    assert "b-after" not in scan_dead_file(pool.dead_data_path).ids


def _torn_tail_by_stalled_add(pool: WorkerPool) -> None:
    """A child frozen halfway through the store's own write of a big record, lock held."""
    child = pool.spawn(stall_writes_over=256 * 1024)
    child.call("add_dead", task_id="early-1", context_bytes=100)
    child.call("add_dead", task_id="early-2", context_bytes=100)
    child.send("add_dead", task_id="big", context_bytes=1024 * 1024)
    stalled = child.expect("stalled")
    assert 0 < stalled.number("written") < stalled.number("size")
    _kill_while_holding_lock(pool, child.pid, child.kill)


def _torn_tail_by_raw_flock(pool: WorkerPool) -> None:
    """A child that took the lock file's flock itself and wrote a partial line."""
    writer = pool.spawn()
    writer.call("add_dead", task_id="early-1", context_bytes=100)
    writer.call("add_dead", task_id="early-2", context_bytes=100)
    writer.close()
    child = pool.spawn(open_disk=False)
    child.call("flock_hold", path=str(pool.dead_lock_path))
    child.call("append_raw", path=str(pool.dead_data_path),
               data_hex=b"0badc0de:dead_task:torn:{\"id\":\"to".hex())
    _kill_while_holding_lock(pool, child.pid, child.kill)


def _kill_while_holding_lock(pool: WorkerPool, pid: int, kill: Callable[[], None]) -> None:
    assert not lock_is_free(pool.dead_lock_path), f"worker {pid} should hold the lock"
    assert not pool.dead_data_path.read_bytes().endswith(b"\n"), "no torn tail was left"
    kill()
    assert lock_is_free(pool.dead_lock_path), "the lock outlived its killed holder"


@pytest.mark.slow
@pytest.mark.parametrize("tear", [_torn_tail_by_stalled_add, _torn_tail_by_raw_flock],
                         ids=["stalled-store-add", "raw-flock-partial-line"])
@pytest.mark.spec("D-12", "S-4", "R-@F")
def test_kill_while_holding_lock_frees_it_and_next_add_cuts_torn_tail(
        pool: WorkerPool, tear: Callable[[WorkerPool], None]) -> None:
    tear(pool)
    before = scan_dead_file(pool.dead_data_path)
    assert before.ids == ["early-1", "early-2"] and before.damaged == 0 and before.tail

    survivor = pool.spawn()
    reply = survivor.call("add_dead", task_id="after", context_bytes=100)
    # The lock was free at once: a timeout would have taken about 1.45 s (L-2).
    assert reply.seconds("elapsed_s") < 1.0

    after = scan_dead_file(pool.dead_data_path)
    assert after.ids == ["early-1", "early-2", "after"]
    assert after.damaged == 0 and after.tail == b""
    assert survivor.call("list_dead").texts("ids") == ["after", "early-2", "early-1"]


@pytest.mark.slow
@pytest.mark.spec("L-2", "L-3", "D-8")
def test_add_times_out_when_another_process_holds_the_lock(pool: WorkerPool) -> None:
    writer = pool.spawn()
    writer.call("add_dead", task_id="existing", context_bytes=100)
    holder = pool.spawn(open_disk=False)
    holder.call("flock_hold", path=str(pool.dead_lock_path))
    before = pool.dead_data_path.read_bytes()

    writer.send("add_dead", task_id="blocked", context_bytes=100)
    reply = writer.expect("error")
    assert reply.text("type") == "DeadTasksLockTimeout"
    assert reply.text("message") == "Could not lock the dead tasks store to add a task to it"
    # 19 sleeps of min(0.01 k, 0.1) s: 0.55 + 0.9 = 1.45 s (the lower bound leaves room for
    # float rounding of the sleeps; the upper one for a loaded machine).
    assert 1.4 <= reply.seconds("elapsed_s") < 3.0
    assert pool.dead_data_path.read_bytes() == before
    assert sorted(os.listdir(pool.storage)) == sorted(
        [pool.dead_data_path.name, pool.dead_lock_path.name, *pool.wal_files()])

    holder.call("flock_release")
    assert writer.call("find_dead", task_id="blocked").data["found"] is False
    assert writer.call("list_dead").texts("ids") == ["existing"]
