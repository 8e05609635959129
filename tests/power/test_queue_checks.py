"""The queue-level checks of the power test, fed synthetic event logs (no root needed).

Goal: each check of ``deferq.powertest._qcheck.QueueLedger`` (and the group-commit
sync of ``Ledger``) fires on the log of a queue that breaks its guarantee and
stays quiet on a correct one, so a clean power-test run means something.
Method: hand-written event sequences in the harness's wire format.
"""

from __future__ import annotations

import pytest

from deferq._core.model import Crash, Dead, Pending
from deferq.powertest._check import Ledger
from deferq.powertest._observe import Observation
from deferq.powertest._qcheck import QueueLedger
from deferq.powertest._queue_roles import ALWAYS_FAIL_MAX_RETRIES, AlwaysFail, Succeed
from deferq.powertest._workers import Event

Q = "q0#1"
FAIL = AlwaysFail.task_name
GIVE_UP = ALWAYS_FAIL_MAX_RETRIES + 1


def feed(ledger: QueueLedger, events: list[Event], inc: str = Q) -> None:
    for event in events:
        ledger.on_event(inc, event)


def enqueue(seq: int, token: str, task_id: str, cls: str = FAIL, durable: bool = True
            ) -> list[Event]:
    return [{"e": "I", "s": seq, "k": "add", "t": 1.0, "id": None, "h": f"h-{token}", "p": None,
             "d": durable, "g": {"tok": token, "c": cls}},
            {"e": "A", "s": seq, "t": 1.1, "id": task_id}]


def run(token: str, task_id: str, attempt: int, result: str, cls: str = FAIL) -> Event:
    return {"e": "Q", "k": "run", "tok": token, "id": task_id, "n": attempt, "c": cls,
            "r": result}


def dead(seq: int, task_id: str, attempts: int = GIVE_UP, cls: str = FAIL) -> Event:
    return {"e": "I", "s": seq, "k": "dead", "t": 2.0, "id": task_id, "h": "hd", "c": cls,
            "n": attempts, "m": "always fails"}


def ack(seq: int) -> Event:
    return {"e": "A", "s": seq, "t": 2.5}


def rem(seq: int, task_id: str) -> Event:
    return {"e": "I", "s": seq, "k": "rem", "t": 3.0, "id": task_id, "d": True}


def give_up_in_order(ledger: QueueLedger) -> None:
    feed(ledger, enqueue(1, "T1", "X") + [run("T1", "X", n, "fail") for n in range(1, GIVE_UP + 1)]
         + [dead(2, "X"), ack(2), rem(3, "X"), ack(3)])


@pytest.mark.spec("D-13", "Q-8", "Q-3")
def test_a_give_up_in_order_is_accepted_and_accounted_for() -> None:
    ledger = QueueLedger(["q0"])
    give_up_in_order(ledger)
    feed(ledger, enqueue(4, "T2", "Y", Succeed.task_name)
         + [run("T2", "Y", 1, "ok", Succeed.task_name), rem(5, "Y"), ack(5)])
    obs = Observation(dead={"X": Dead(b"hd", FAIL, GIVE_UP, "always fails")})
    ledger.check(obs, "crash")
    ledger.account(obs, "drain")
    assert ledger.violations == []
    assert ledger.stats.accounted == 2 and ledger.stats.removals_judged == 2


@pytest.mark.spec("D-13", "Q-8", "Q-141")
def test_a_removal_before_the_dead_write_returned_is_a_violation() -> None:
    ledger = QueueLedger(["q0"])
    feed(ledger, enqueue(1, "T1", "X") + [run("T1", "X", GIVE_UP, "fail"), dead(2, "X"),
                                          rem(3, "X")])
    assert any("D-13" in v and "had not returned" in v for v in ledger.violations)


@pytest.mark.spec("D-13", "Q-8")
def test_a_removal_without_success_or_dead_write_is_a_violation() -> None:
    ledger = QueueLedger(["q0"])
    feed(ledger, enqueue(1, "T1", "X") + [run("T1", "X", 1, "fail"), rem(2, "X")])
    assert any("neither ran to success" in v for v in ledger.violations)


@pytest.mark.spec("D-13")
def test_a_given_up_task_missing_from_wal_and_dead_store_after_a_crash_is_a_violation() -> None:
    ledger = QueueLedger(["q0"])
    give_up_in_order(ledger)
    ledger.check(Observation(), "cycle 1")
    assert any("left the WAL but is not dead" in v for v in ledger.violations)
    ledger.account(Observation(), "drain")
    assert any("was lost" in v for v in ledger.violations)


@pytest.mark.spec("Q-3")
def test_a_give_up_with_the_wrong_attempts_count_is_a_violation() -> None:
    ledger = QueueLedger(["q0"])
    feed(ledger, enqueue(1, "T1", "X") + [run("T1", "X", 1, "fail"), dead(2, "X", attempts=1)])
    assert any("expected 3" in v for v in ledger.violations)
    ledger = QueueLedger(["q0"])
    feed(ledger, enqueue(1, "T1", "X", Succeed.task_name)
         + [dead(2, "X", attempts=1, cls=Succeed.task_name)])
    assert any("succeeds within its retries" in v for v in ledger.violations)


@pytest.mark.spec("Q-3")
def test_skipped_attempts_of_an_always_failing_task_are_a_violation() -> None:
    ledger = QueueLedger(["q0"])
    feed(ledger, enqueue(1, "T1", "X") + [run("T1", "X", 1, "fail"), run("T1", "X", GIVE_UP, "fail"),
                                          dead(2, "X")])
    assert any("before it gave up" in v for v in ledger.violations)


@pytest.mark.spec("D-4")
def test_running_a_task_nobody_enqueued_or_with_other_arguments_is_a_violation() -> None:
    ledger = QueueLedger(["q0"])
    feed(ledger, enqueue(1, "T1", "X") + [run("T9", "Y", 1, "ok")])
    assert any("no enqueue wrote" in v for v in ledger.violations)
    ledger = QueueLedger(["q0"])
    feed(ledger, enqueue(1, "T1", "X") + enqueue(2, "T2", "Y") + [run("T2", "X", 1, "ok")])
    assert any("with the arguments of 'T2'" in v for v in ledger.violations)


@pytest.mark.spec("Q-33")
def test_an_operator_retry_continues_the_task_under_its_new_id() -> None:
    ledger = QueueLedger(["q0", "qop"])
    give_up_in_order(ledger)
    feed(ledger, [
        {"e": "I", "s": 1, "k": "add", "t": 4.0, "id": None, "h": "h-r", "p": None, "d": True,
         "g": {"retry": ["X"]}},
        {"e": "A", "s": 1, "t": 4.1, "id": "Z"},
        {"e": "I", "s": 2, "k": "rdead", "t": 4.2, "ids": ["X"], "g": {"retry": ["X"]}},
        {"e": "A", "s": 2, "t": 4.3, "n": 1},
    ], inc="qop#1")
    assert ledger.tokens["Z"] == {"T1"}
    ledger.account(Observation(pending={"Z": [Pending(b"h-r", None)]}), "drain")
    assert any("was lost" in v for v in ledger.violations)  # Z never ran to its end
    ledger = QueueLedger(["q0"])
    give_up_in_order(ledger)
    feed(ledger, [{"e": "I", "s": 9, "k": "rdead", "t": 4.2, "ids": ["X"],
                   "g": {"remove": ["X"]}}])
    ledger.account(Observation(), "drain")
    assert ledger.violations == []  # an operator removed it: accounted for


@pytest.mark.spec("Q-20", "D-2")
def test_a_non_durable_enqueue_counts_once_a_group_commit_covering_it_returned() -> None:
    ledger = QueueLedger(["q0"])
    feed(ledger, enqueue(1, "T1", "X", durable=False) + enqueue(2, "T2", "Y", durable=False)
         + [{"e": "I", "s": 3, "k": "sync", "t": 2.0, "upto": [1]}, ack(3)])
    assert ledger.durable_tokens == {"T1"}


@pytest.mark.spec("Q-22", "D-2", "Q-148")
def test_a_group_commit_makes_durable_only_the_writes_it_names() -> None:
    ledger = Ledger()
    for seq, task_id in ((1, "a"), (2, "b")):
        ledger.on_event(Q, {"e": "I", "s": seq, "k": "add", "t": 1.0, "id": task_id, "h": "h",
                            "p": None, "d": False})
        ledger.on_event(Q, {"e": "A", "s": seq, "t": 1.1, "id": task_id})
    ledger.on_event(Q, {"e": "I", "s": 3, "k": "sync", "t": 2.0, "upto": [1]})
    ledger.on_event(Q, {"e": "A", "s": 3, "t": 2.1})
    must_pending, _ = ledger.model.must_hold()
    assert must_pending == {"a"}


@pytest.mark.spec("D-8")
def test_a_storage_error_logged_by_the_queue_outside_a_crash_is_a_violation() -> None:
    ledger = QueueLedger(["q0"])
    feed(ledger, [{"e": "L", "x": "DeadTasksLockTimeout", "m": "lock"}])
    assert ledger.violations == []
    feed(ledger, [{"e": "L", "x": "StorageBrokenError", "m": "broken"}])
    assert len(ledger.violations) == 1
    ledger.expect_errors = True
    feed(ledger, [{"e": "L", "x": "OSError", "m": "EIO after the cut"}])
    assert len(ledger.violations) == 1


# ----------------------------------------------------------------------------- dead-store judgement

W, OP = "w0#1", "op0#1"


def dead_write(seq: int, task_id: str, t: float) -> Event:
    return {"e": "I", "s": seq, "k": "dead", "t": t, "id": task_id, "h": "hd", "c": "C", "n": 1,
            "m": "gave up"}


def dead_removal(seq: int, task_id: str, t: float) -> Event:
    return {"e": "I", "s": seq, "k": "rdead", "t": t, "ids": [task_id]}


def returned(seq: int, t: float, **fields: object) -> Event:
    return {"e": "A", "s": seq, "t": t, **fields}


@pytest.mark.spec("D-7")
def test_a_lost_acknowledged_dead_task_is_a_violation_that_shows_its_events() -> None:
    ledger = Ledger()
    ledger.on_event(W, dead_write(1, "X", 1.0))
    ledger.on_event(W, returned(1, 1.5))
    found = ledger.check(Observation(), Crash.PROCESS_KILL, "cycle 1")
    assert len(found) == 1 and "dead-task store task 'X': recovered None" in found[0]
    # The events of the id since the last check come with it, to analyse one sighting.
    assert f"{W} I dead s=1 t=1.0" in found[0] and f"{W} A dead s=1 t=1.5" in found[0]


@pytest.mark.spec("D-7", "D-9", "D-11")
def test_a_removal_overlapping_a_dead_write_of_the_same_id_may_land_last() -> None:
    # Issued in one order, the two calls overlapped: the lock may have gone either way.
    ledger = Ledger()
    ledger.on_event(OP, dead_removal(1, "X", 1.0))
    ledger.on_event(W, dead_write(1, "X", 1.2))
    ledger.on_event(W, returned(1, 1.4))
    ledger.on_event(OP, returned(1, 1.6, n=1))
    assert ledger.check(Observation(), Crash.PROCESS_KILL, "cycle 1") == []
    assert ledger.reordered == 1


@pytest.mark.spec("D-7", "D-9")
def test_a_removal_that_returned_before_a_dead_write_began_cannot_undo_it() -> None:
    ledger = Ledger()
    ledger.on_event(OP, dead_removal(1, "X", 1.0))
    ledger.on_event(OP, returned(1, 1.1, n=0))
    ledger.on_event(W, dead_write(1, "X", 1.2))
    ledger.on_event(W, returned(1, 1.4))
    found = ledger.check(Observation(), Crash.PROCESS_KILL, "cycle 1")
    assert len(found) == 1 and f"{OP} A rdead s=1 t=1.1 removed=0" in found[0]


@pytest.mark.spec("D-9", "D-11")
def test_a_removal_in_flight_when_its_process_died_may_have_landed_after_a_later_write() -> None:
    ledger = Ledger()
    ledger.on_event(OP, dead_removal(1, "X", 1.0))
    ledger.on_event(W, dead_write(1, "X", 1.2))
    ledger.on_event(W, returned(1, 1.4))
    ledger.forget(OP)
    assert ledger.check(Observation(), Crash.PROCESS_KILL, "cycle 1") == []
