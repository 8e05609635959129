"""Threads of one process beside other processes, interleaved at syscalls and locks.

Goal: races between the threads of one process (the dead-task store's process-local mutex
beside its flock on a shared open file description, the group commits' conditions, the
WAL's mutex) are found by a generic exploration, not only by scenarios written for one
change (spec/simulator.md M-15..M-19, spec/dead-tasks.md L-1, L-7, L-8). Method: Hypothesis
draws a ``deferq.crashtest._interleave.Plan``: two simulated processes, the first with three
threads and the second with one or two, each thread a short list of WAL and
dead-task operations on its process's one ``Disk``; the scheduling choices; and how the run
ends (to completion, cut after a number of steps, one process killed with all its threads
at a step, a power loss under a model that meets A-11). ``check_plan`` runs it on the real
engine with the deterministic scheduler, checks every result against every interleaving
the real-time order of the operations allows, the stores against the pure model when the
run completes, and the recovery after it. ``ThreadsMachine`` runs such plans one after
another on one machine (a ``Session``): each plan's processes adopt the WALs the last
recovery left, so state carries over kills and power losses. ``DEFERQ_THREAD_EXAMPLES``
(default 200; the machine runs a fifth as many examples of five plans) raises the number of
examples (``HYPOTHESIS_PROFILE=soak`` multiplies it by ten). Also here: the real engine's
lock order seen through the seam (L-7, L-8), and that the check has teeth (a mutant plan).
"""

from __future__ import annotations

import os
import random
from typing import Final

import pytest
from hypothesis import given, note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from deferq._engine.deadlock import DeadLock
from deferq._engine.deadstore import DeadTaskStore
from deferq._engine.env import Condition, Mutex
from deferq.backends import Disk
from deferq.crashtest import SimDisk
from deferq.crashtest._crashengine import Engine
from deferq.crashtest._interleave import (
    DEAD_KINDS,
    OP_KINDS,
    POWER_MODELS,
    Plan,
    Session,
    check_plan,
    explore_threads,
    random_plan,
)
from deferq.crashtest._simenv import SimEnv
from deferq.crashtest._tracing import TracingEnv
from deferq.crashtest.catalogue.locks import MUTANTS as LOCK_MUTANTS

from tests.stateful.support import machine_settings

EXAMPLES: Final = int(os.environ.get("DEFERQ_THREAD_EXAMPLES", "200"))

def _uniform_choices(seed: int) -> tuple[int, ...]:
    rng = random.Random(seed)
    return tuple(rng.randrange(6) for _ in range(400))


# Mostly dead-task operations, where the two locks are (as ``random_plan`` draws them).
ops = st.tuples(st.sampled_from(DEAD_KINDS * 4 + OP_KINDS), st.integers(0, 63))
thread_ops = st.lists(ops, min_size=1, max_size=5).map(tuple)
plans = st.builds(
    Plan,
    threads=st.tuples(st.lists(thread_ops, min_size=3, max_size=3).map(tuple),
                      st.lists(thread_ops, min_size=1, max_size=2).map(tuple)),
    frequencies=st.tuples(st.just(0.0), st.sampled_from([0.0, 0.5])),
    # Hypothesis's own lists lean to small, repeated values; a seeded uniform list explores
    # fine-grained interleavings better, and an explicit list shrinks to a readable one.
    choices=st.one_of(st.integers(0, 2**32).map(_uniform_choices),
                      st.lists(st.integers(0, 5), max_size=300).map(tuple)),
    max_steps=st.one_of(st.none(), st.integers(5, 200)),
    kill=st.one_of(st.none(), st.tuples(st.integers(0, 1), st.integers(1, 150))),
    power=st.one_of(st.none(), st.tuples(st.sampled_from(sorted(POWER_MODELS)),
                                         st.integers(0, 2**16))),
)


@pytest.mark.slow
@pytest.mark.spec("M-15", "M-17", "M-18", "M-25", "M-26", "M-29", "M-30", "L-1", "L-7", "L-8",
                  "D-11", "S-14", "W-21")
@given(plan=plans, seed=st.integers(0, 2**16))
@machine_settings(max_examples=EXAMPLES, stateful_step_count=1)
def test_threads_and_processes_agree_with_the_model(plan: Plan, seed: int) -> None:
    violations = check_plan(Engine(), plan, seed=seed)
    assert not violations, "\n".join(violations)


class ThreadsMachine(RuleBasedStateMachine):
    """Plans run one after another on one machine: each plan's processes adopt what the last
    recovery left, so the dead-task store and the WALs carry over crashes and power losses."""

    def __init__(self) -> None:
        super().__init__()
        self.session = Session(SimDisk(0))

    @initialize(seed=st.integers(0, 2**32 - 1))
    def boot(self, seed: int) -> None:
        note(f"SimDisk seed={seed}")
        self.session = Session(SimDisk(seed))

    @rule(plan=plans)
    def concurrent_round(self, plan: Plan) -> None:
        violations = check_plan(Engine(), plan, session=self.session)
        assert not violations, "\n".join(violations)


TestThreadsMachine = pytest.mark.slow(pytest.mark.spec("M-17", "M-18", "M-29", "M-30", "W-27", "D-11")(
    ThreadsMachine.TestCase))
TestThreadsMachine.settings = machine_settings(max_examples=max(1, EXAMPLES // 5),
                                               stateful_step_count=5)


@pytest.mark.slow
@pytest.mark.spec("M-18", "M-31")
def test_the_exploration_has_teeth_a_lock_order_mutant_fails_a_plan() -> None:
    # The mutants of crashtest/catalogue/locks.py, through the same check: some plan of the
    # first few dozen seeds shows each of them (tests/mutants runs them in full).
    for mutant in LOCK_MUTANTS:
        report = explore_threads(mutant.engine, runs=200, stop_after=1)
        assert report.failures, f"{mutant.name}: no plan of {report.runs} showed it"
        seed, violations = report.failures[0]
        assert violations and check_plan(mutant.engine, random_plan(random.Random(seed)),
                                          seed=seed) == violations  # M-19: it replays
        assert check_plan(Engine(), random_plan(random.Random(seed)), seed=seed) == []


class _LockOrderEnv(TracingEnv):
    """Records the dead-task lock file's flock calls and the store's mutexes, in order."""

    def __init__(self, inner: SimEnv, log: list[str]) -> None:
        super().__init__(inner, [])
        self.log = log

    def flock_exclusive_nb(self, fd: int) -> bool:
        self.log.append("flock")
        return super().flock_exclusive_nb(fd)

    def flock_unlock(self, fd: int) -> None:
        self.log.append("unlock")
        super().flock_unlock(fd)

    def mutex(self) -> Mutex:
        return _LoggedMutex(self.inner.mutex(), self.log, len(self.log))

    def condition(self, mutex: Mutex) -> Condition:
        assert isinstance(mutex, _LoggedMutex)
        return self.inner.condition(mutex.inner)


class _LoggedMutex:
    def __init__(self, inner: Mutex, log: list[str], number: int) -> None:
        self.inner = inner
        self.log = log

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        taken = self.inner.acquire(blocking, timeout)
        self.log.append(f"take {id(self)}" if taken else "busy")
        return taken

    def release(self) -> None:
        self.log.append(f"drop {id(self)}")
        self.inner.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


@pytest.mark.spec("L-7", "L-8", "M-15")
def test_the_store_takes_its_mutex_before_the_flock_and_drops_it_after() -> None:
    log: list[str] = []
    disk = Disk(path="/s", env=_LockOrderEnv(SimDisk(0).process(), log), fsync_frequency=0)
    local = id(disk._dead._lock.local)  # the dead-task store's process-local mutex (L-1)
    log.clear()
    disk.add_dead_task("a", b"x", RuntimeError("e"), task_class="J", attempts=1)
    disk.remove_dead_tasks(["a"])
    disk.list_dead_tasks()
    order = [e for e in log if e in ("flock", "unlock") or e.endswith(str(local))]
    assert order == [f"take {local}", "flock", "unlock", f"drop {local}"] * 3, order
    disk.close()


class _ForgetfulLock(DeadLock):
    """Waits for the mutex (blocking) and never releases it: the second operation of the
    process waits for ever."""

    def acquire(self, operation: str) -> None:
        self.local.acquire()
        assert self._env.flock_exclusive_nb(self.fd)

    def release(self) -> None:
        self._env.flock_unlock(self.fd)  # BUG: the mutex stays held


class _ForgetfulStore(DeadTaskStore):
    _lock_class: type[DeadLock] = _ForgetfulLock


@pytest.mark.spec("M-16", "M-18", "M-31")
def test_an_engine_that_deadlocks_its_threads_is_reported_not_hung() -> None:
    engine = Engine("forgetful", type("Forgetful", (Disk,), {"_dead_class": _ForgetfulStore}))
    process_0 = ((("list", 0),), (("find", 0),))  # two threads, one operation each
    process_1 = ((("list", 0),),)
    plan = Plan((process_0, process_1), (0.0, 0.0))
    violations = check_plan(engine, plan)
    assert len(violations) == 1 and violations[0].startswith("M-16: deadlock"), violations
    assert "waits for mutex deadlock.py" in violations[0] and "DeadLock.__init__" in violations[0]
    assert check_plan(Engine(), plan) == []
