"""The pure model (``deferq._core.model``): the executable spec of what a recovery may show.

Goal: pin down the crash relation of spec/durability.md on small, hand-made
histories, so the stateful and exhaustive crash suites (which use the model as
their oracle) rest on a checked foundation. Method: issue operations, mark
them acknowledged / failed / in flight, crash, and ask which recovered states
the model allows.
"""

from __future__ import annotations

import pytest

from deferq._core.model import ABSENT, Crash, Dead, Pending, StorageModel

A = Pending(b"a", None)
B = Pending(b"b", 7)
DEAD = Dead(b"ctx", "Job", 3, "boom")


def allowed_after(model: StorageModel, kind: Crash, task_id: str = "t") -> set[object]:
    model.crash(kind)
    return set(model.wal[task_id].allowed(wal=True))


@pytest.mark.spec("D-1")
def test_durable_acknowledged_add_survives_power_loss() -> None:
    model = StorageModel()
    model.acked(model.add_task("w", "t", A), durable=True)
    assert allowed_after(model, Crash.POWER_LOSS) == {A}


@pytest.mark.spec("D-2")
def test_unsynced_add_may_be_lost_at_power_loss_until_sync() -> None:
    model = StorageModel()
    model.acked(model.add_task("w", "t", A))
    assert model.wal["t"].allowed(wal=True) == {A}  # no crash yet: a kill keeps it
    unsynced = StorageModel()
    unsynced.acked(unsynced.add_task("w", "t", A))
    assert allowed_after(unsynced, Crash.POWER_LOSS) == {ABSENT, A}
    synced = StorageModel()
    synced.acked(synced.add_task("w", "t", A))
    synced.synced("w")
    assert allowed_after(synced, Crash.POWER_LOSS) == {A}


@pytest.mark.spec("D-2", "D-12")
def test_process_kill_keeps_acknowledged_unsynced_writes() -> None:
    model = StorageModel()
    model.acked(model.add_task("w", "t", A))
    assert allowed_after(model, Crash.PROCESS_KILL) == {A}


@pytest.mark.spec("D-3")
def test_unsynced_removal_may_be_undone_but_synced_removal_may_not() -> None:
    model = StorageModel()
    model.acked(model.add_task("w", "t", A), durable=True)
    model.acked(model.remove_task("w", "t"))
    assert allowed_after(model, Crash.POWER_LOSS) == {A, ABSENT}
    model2 = StorageModel()
    model2.acked(model2.add_task("w", "t", A), durable=True)
    model2.acked(model2.remove_task("w", "t"), durable=True)
    assert allowed_after(model2, Crash.POWER_LOSS) == {ABSENT}


@pytest.mark.spec("D-3")
def test_retry_readd_allows_either_version_until_synced() -> None:
    model = StorageModel()
    model.acked(model.add_task("w", "t", A), durable=True)
    model.acked(model.add_task("w", "t", B))
    assert allowed_after(model, Crash.POWER_LOSS) == {A, B}


@pytest.mark.spec("D-4")
def test_in_flight_add_may_appear_and_invented_tasks_are_violations() -> None:
    model = StorageModel()
    model.add_task("w", "t", A)  # in flight
    model.crash(Crash.POWER_LOSS)
    assert model.wal["t"].allowed(wal=True) == {ABSENT, A}
    violations = model.check_recovered({"t": A, "ghost": B}, {})
    assert [v.task_id for v in violations] == ["ghost"]


@pytest.mark.spec("D-4")
def test_recovered_bytes_must_match_exactly() -> None:
    model = StorageModel()
    model.acked(model.add_task("w", "t", A), durable=True)
    model.crash(Crash.POWER_LOSS)
    violations = model.check_recovered({"t": Pending(b"A", None)}, {})
    assert len(violations) == 1 and "recovered" in str(violations[0])


@pytest.mark.spec("D-7", "D-9")
def test_dead_store_writes_are_durable_when_acknowledged() -> None:
    model = StorageModel()
    model.acked(model.add_dead("t", DEAD))
    model.crash(Crash.POWER_LOSS)
    assert model.dead["t"].allowed(wal=False) == {DEAD}
    model.acked(model.remove_dead(["t", "t"]))
    assert model.dead["t"].allowed(wal=False) == {ABSENT}


@pytest.mark.spec("D-8", "D-9")
def test_failed_or_in_flight_dead_writes_may_or_may_not_take_effect() -> None:
    model = StorageModel()
    model.acked(model.add_dead("t", DEAD))
    model.failed(model.remove_dead(["t"]))
    model.add_dead("u", DEAD)  # in flight at the crash
    model.crash(Crash.POWER_LOSS)
    assert model.dead["t"].allowed(wal=False) == {DEAD, ABSENT}
    assert model.dead["u"].allowed(wal=False) == {DEAD, ABSENT}


@pytest.mark.spec("D-13")
def test_handoff_leaves_the_task_in_one_store_or_both() -> None:
    model = StorageModel()
    model.acked(model.add_task("w", "t", A), durable=True)
    model.acked(model.add_dead("t", DEAD))
    model.remove_task("w", "t")  # in flight
    model.crash(Crash.POWER_LOSS)
    assert model.check_recovered({"t": A}, {"t": DEAD}) == []
    model2 = StorageModel()
    model2.acked(model2.add_task("w", "t", A), durable=True)
    model2.acked(model2.add_dead("t", DEAD))
    model2.remove_task("w", "t")
    model2.crash(Crash.POWER_LOSS)
    lost = model2.check_recovered({}, {})
    assert [v.store for v in lost] == ["dead-task store"]


def test_check_adopts_the_observed_state_as_known() -> None:
    model = StorageModel()
    model.add_task("w", "t", A)
    model.crash(Crash.POWER_LOSS)
    assert model.check_recovered({}, {}) == []
    assert model.pending() == {}
    model.acked(model.add_task("w2", "u", B), durable=True)
    assert model.pending() == {"u": B}
    assert model.must_hold() == ({"u"}, set())


def test_kill_check_can_be_limited_to_the_dead_workers_ids() -> None:
    model = StorageModel()
    model.acked(model.add_task("alive", "x", A), durable=True)
    model.acked(model.add_task("dead", "y", B))
    model.crash(Crash.PROCESS_KILL)
    assert model.check_recovered({"y": B}, {}, wal_ids={"y"}) == []
    assert model.pending() == {"x": A, "y": B}


@pytest.mark.spec("D-7", "D-12")
def test_after_a_kill_an_unacknowledged_dead_task_seen_in_the_page_cache_stays_a_maybe() -> None:
    model = StorageModel()
    model.add_dead("t", DEAD)  # killed after its write, before its fsync: in flight
    model.crash(Crash.PROCESS_KILL)
    assert model.check_recovered({}, {"t": DEAD}, dead_durable=False) == []
    model.crash(Crash.POWER_LOSS)  # the page-cache copy may now be gone, or not
    assert model.dead["t"].allowed(wal=False) == {DEAD, ABSENT}


def test_a_kill_of_one_worker_leaves_the_other_workers_operations_in_flight() -> None:
    model = StorageModel()
    op_a = model.add_task("a", "x", A)
    op_b = model.add_task("b", "y", B)
    model.crash(Crash.PROCESS_KILL, worker="a")
    model.acked(op_b, durable=True)  # b's call returns after a's death
    assert model.pending() == {"y": B}
    with pytest.raises(KeyError):
        model.acked(op_a)
