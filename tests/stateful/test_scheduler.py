"""Unit tests of the deterministic syscall-granularity scheduler (``deferq.crashtest._scheduler``).

Goal: the concurrency tests built on the scheduler are only as trustworthy as its
promises: exactly one thread runs at a time, switches happen only at seam calls and
at the acquires and waits of the process-local locks the engine makes through its
Env (M-15), threads of one process share its flocks and die together (M-17), a
deadlock is reported naming each thread (M-16), a
choice list reproduces an interleaving exactly, finished threads are skipped, an
early stop aborts the parked threads with ``SimulatedCrash``, and a real block is
reported instead of hanging. Method: small hand-made threads that call a simulated
process's ``Env`` through ``ScheduledEnv`` and record what they did, with the choice
lists written out by hand.
"""

from __future__ import annotations

import threading

import pytest

from deferq._engine.env import OpenFlag
from deferq._core.errors import DeadTasksLockTimeout
from deferq.backends import Disk
from deferq.crashtest import Scheduler, SimDisk, SimulatedCrash
from deferq.crashtest._schedsync import SchedMutex
from deferq.crashtest._scheduler import (
    START,
    Aborted,
    SchedulerDeadlock,
    SchedulerStuck,
    ScheduledEnv,
    Step,
    choices_from,
)


def _two_writers(choices: list[int]) -> tuple[list[str], list[Step]]:
    """Two threads, each making three ``time()`` seam calls and logging after each."""
    disk = SimDisk(seed=0)
    sched = Scheduler(choices)
    log: list[str] = []

    def worker(name: str, env: ScheduledEnv) -> None:
        for i in range(3):
            env.time()
            log.append(f"{name}{i}")

    env_a, env_b = sched.wrap(disk.process()), sched.wrap(disk.process())
    sched.spawn("a", lambda: worker("a", env_a))
    sched.spawn("b", lambda: worker("b", env_b))
    result = sched.run()
    return log, result.trace


def test_interleaving_follows_the_choice_list_exactly() -> None:
    # Runnable lists are in spawn order: [a, b] while both live.
    log, trace = _two_writers([1, 0, 0, 1, 1, 0])
    # b starts (parks at its first time()), a starts, a's 1st time(), b's 1st time(), ...
    assert [s.thread for s in trace[:6]] == ["b", "a", "a", "b", "b", "a"]
    assert trace[0] == Step("b", START) and trace[2] == Step("a", "time")
    assert log[:3] == ["a0", "b0", "b1"]
    assert sorted(log) == ["a0", "a1", "a2", "b0", "b1", "b2"]


def test_same_choices_same_interleaving_and_different_choices_differ() -> None:
    first = _two_writers([1, 1, 0, 0, 1, 0, 1])
    assert _two_writers([1, 1, 0, 0, 1, 0, 1]) == first
    assert _two_writers([0, 0, 0, 0]) != first


def test_a_finished_thread_is_skipped() -> None:
    disk = SimDisk(seed=0)
    sched = Scheduler([0] * 50)  # always "the first runnable"
    env_b = sched.wrap(disk.process())
    sched.spawn("a", lambda: None)  # no seam call: done after its start step
    sched.spawn("b", lambda: [env_b.getpid() for _ in range(3)])
    result = sched.run()
    assert [s.thread for s in result.trace] == ["a", "b", "b", "b", "b"]
    assert result.outcomes["a"].returned and result.outcomes["b"].value == [1000] * 3


def test_a_thread_that_raises_is_removed_and_its_error_kept() -> None:
    disk = SimDisk(seed=0)
    sched = Scheduler([1, 0, 0, 0])
    env = sched.wrap(disk.process())

    def fails() -> None:
        env.open("/missing", OpenFlag.READ)

    sched.spawn("ok", lambda: env.time())
    sched.spawn("bad", fails)
    result = sched.run()
    assert isinstance(result.outcomes["bad"].error, FileNotFoundError)
    assert result.outcomes["ok"].returned
    assert [s.thread for s in result.trace].count("bad") == 2  # start, open


def test_only_one_thread_runs_between_checkpoints() -> None:
    disk = SimDisk(seed=0)
    sched = Scheduler(list(range(40)))
    inside = threading.Semaphore(1)
    overlaps: list[str] = []

    def worker(env: ScheduledEnv) -> None:
        for _ in range(5):
            if not inside.acquire(blocking=False):
                overlaps.append("two threads ran at once")
                return
            inside.release()
            env.monotonic()

    for name in "abc":
        env = sched.wrap(disk.process())
        sched.spawn(name, lambda env=env: worker(env))  # type: ignore[misc]
    result = sched.run()
    assert not overlaps and all(o.returned for o in result.outcomes.values())


def test_max_steps_aborts_parked_threads_with_simulated_crash() -> None:
    disk = SimDisk(seed=0)
    sched = Scheduler([0, 1])
    env_a, env_b = sched.wrap(disk.process()), sched.wrap(disk.process())
    sched.spawn("a", lambda: env_a.makedirs("/x"))
    sched.spawn("b", lambda: env_b.makedirs("/y"))
    result = sched.run(max_steps=3)  # a starts, b starts, a makes /x; b is parked at makedirs
    assert result.stopped_early
    assert result.outcomes["a"].returned
    assert result.outcomes["b"].aborted and not disk.exists("/y")
    assert issubclass(Aborted, SimulatedCrash)


def test_calls_outside_a_run_pass_straight_through() -> None:
    disk = SimDisk(seed=0)
    sched = Scheduler()
    env = sched.wrap(disk.process())
    backend = Disk(path="/s", env=env, fsync_frequency=0)  # set up on the main thread
    task_id = backend.add_task(b"x")
    assert [t.task_id for t in backend.pending_tasks()] == [task_id]
    backend.close()


def test_round_robin_after_the_choice_list() -> None:
    choose = choices_from([1])
    picks = [choose(["a", "b", "c"]) for _ in range(4)]
    assert picks == [1, 2, 0, 1]


def test_lock_retry_sleeps_are_simulated_and_yield() -> None:
    """The dead-task lock's retry loop never blocks: its sleeps advance the sim clock and yield."""
    slept = 0
    for k in range(30):  # a runs k steps (at some k it holds the lock), then b is preferred
        disk = SimDisk(seed=0)
        sched = Scheduler([0] * k + [1] * 12)
        env_a, env_b = sched.wrap(disk.process()), sched.wrap(disk.process())
        a = Disk(path="/s", env=env_a, fsync_frequency=0)
        b = Disk(path="/s", env=env_b, fsync_frequency=0)
        sched.spawn("a", lambda: a.add_dead_task("x", b"1", RuntimeError("e"), task_class="J",
                                                attempts=1))
        sched.spawn("b", lambda: b.list_dead_tasks())
        before = disk.clock.monotonic_s
        result = sched.run()
        assert result.outcomes["a"].returned
        # Preferring b while a holds the lock may starve a into b's lock timeout (L-3).
        error = result.outcomes["b"].error
        assert error is None or isinstance(error, DeadTasksLockTimeout)
        if any(step.thread == "b" and step.op == "sleep" for step in result.trace):
            slept += 1
            assert disk.clock.monotonic_s > before
        assert [t.id for t in b.list_dead_tasks()] == ["x"]
    assert slept > 0


@pytest.mark.slow
@pytest.mark.spec("M-27")
def test_a_real_block_is_reported_not_hung() -> None:
    disk = SimDisk(seed=0)
    sched = Scheduler([0, 0, 0], stuck_timeout_s=0.2)
    env = sched.wrap(disk.process())
    gate = threading.Event()
    sched.spawn("blocks", lambda: (env.time(), gate.wait(5)))
    with pytest.raises(SchedulerStuck):
        sched.run()
    gate.set()


def test_kills_abort_one_thread_and_the_others_run_on() -> None:
    disk = SimDisk(seed=0)
    sched = Scheduler([0] * 50)
    env_a, env_b = sched.wrap(disk.process()), sched.wrap(disk.process())
    killed: list[str] = []

    def on_kill(name: str) -> None:
        killed.append(name)
        disk.kill(env_a.inner.getpid())

    sched.spawn("a", lambda: [env_a.time() for _ in range(10)])
    sched.spawn("b", lambda: [env_b.time() for _ in range(3)])
    result = sched.run(kills={"a": 3}, on_kill=on_kill)
    assert killed == ["a"] and result.outcomes["a"].aborted and not result.stopped_early
    assert result.outcomes["b"].returned
    assert [s.thread for s in result.trace] == ["a", "a", "a", "b", "b", "b", "b"]
    assert disk.processes() == [1001]


def test_a_kill_can_wait_for_a_named_seam_call() -> None:
    disk = SimDisk(seed=0)
    sched = Scheduler()
    env = sched.wrap(disk.process())
    def body() -> None:
        env.makedirs("/x")
        env.fsync_dir("/x")
        env.makedirs("/y")

    sched.spawn("a", body)
    result = sched.run(kills={"a": "fsync_dir"})
    assert result.outcomes["a"].aborted and result.trace[-1] == Step("a", "makedirs")
    assert disk.exists("/x") and not disk.exists("/y")


# ---------------------------------------------------------------- threads of one process


@pytest.mark.spec("M-26")
def test_a_held_mutex_parks_the_other_thread_until_it_is_released() -> None:
    disk = SimDisk(seed=0)
    sched = Scheduler([0, 0, 1, 1, 1, 1])  # a starts and takes the mutex, then b is preferred
    env = sched.wrap(disk.process())
    mutex = env.mutex()
    log: list[str] = []

    def worker(name: str) -> None:
        with mutex:
            log.append(f"{name} in")
            env.time()  # a scheduling point inside the critical section
            log.append(f"{name} out")

    sched.spawn("a", lambda: worker("a"), process="p")
    sched.spawn("b", lambda: worker("b"), process="p")
    result = sched.run()
    assert all(o.returned for o in result.outcomes.values())
    assert log == ["a in", "a out", "b in", "b out"]  # never interleaved inside
    ops = [(s.thread, s.op) for s in result.trace]
    assert ("b", "blocked") in ops  # b was parked blocked, then picked again once a released
    assert ops.index(("a", "time")) < ops.index(("b", "blocked"))


@pytest.mark.spec("M-25")
def test_acquire_is_a_scheduling_point_and_a_non_blocking_try_fails_at_once() -> None:
    disk = SimDisk(seed=0)
    sched = Scheduler([0, 0, 1, 1, 0])
    env = sched.wrap(disk.process())
    mutex = env.mutex()
    got: list[bool] = []

    def holder() -> None:
        with mutex:
            env.time()

    def tryer() -> None:
        got.append(mutex.acquire(blocking=False))

    sched.spawn("a", holder, process="p")
    sched.spawn("b", tryer, process="p")
    result = sched.run()
    assert [s.op for s in result.trace[:4]] == [START, "acquire", START, "acquire"]
    assert got == [False] and all(o.returned for o in result.outcomes.values())


@pytest.mark.spec("M-26")
def test_a_condition_wait_parks_until_notified_and_retakes_the_mutex() -> None:
    disk = SimDisk(seed=0)
    sched = Scheduler([0] * 40)
    env = sched.wrap(disk.process())
    mutex = env.mutex()
    cond = env.condition(mutex)
    state = {"ready": False}
    log: list[str] = []

    def waiter() -> None:
        with mutex:
            while not state["ready"]:
                cond.wait()
            log.append("woke with the mutex")
            assert isinstance(mutex, SchedMutex) and mutex.owner == "w"

    def notifier() -> None:
        env.time()
        with mutex:
            state["ready"] = True
            cond.notify_all()
            log.append("notified")

    sched.spawn("w", waiter, process="p")
    sched.spawn("n", notifier, process="p")
    result = sched.run()
    assert all(o.returned for o in result.outcomes.values()), result.outcomes
    assert log == ["notified", "woke with the mutex"]
    assert ("w", "wait") in [(s.thread, s.op) for s in result.trace]


@pytest.mark.spec("M-16")
def test_a_lock_order_deadlock_names_each_thread_and_what_it_waits_for() -> None:
    disk = SimDisk(seed=0)
    sched = Scheduler([0, 0, 1, 1] + [0] * 20)  # a takes m1, b takes m2, then each wants the other
    env = sched.wrap(disk.process())
    m1, m2 = env.mutex(), env.mutex()

    def ab() -> None:
        with m1, m2:
            pass

    def ba() -> None:
        with m2, m1:
            pass

    sched.spawn("a", ab, process="p")
    sched.spawn("b", ba, process="p")
    with pytest.raises(SchedulerDeadlock) as caught:
        sched.run()
    waits = caught.value.waits
    assert set(waits) == {"a", "b"}
    assert "held by 'b'" in waits["a"] and "held by 'a'" in waits["b"]
    assert "test_scheduler.py" in waits["a"]  # where the mutex was made
    assert "deadlock" in str(caught.value)


@pytest.mark.spec("M-16")
def test_a_wait_nobody_notifies_is_a_deadlock_not_a_hang() -> None:
    disk = SimDisk(seed=0)
    sched = Scheduler([0] * 10)
    env = sched.wrap(disk.process())
    mutex = env.mutex()
    cond = env.condition(mutex)

    def waits_forever() -> None:
        with mutex:
            cond.wait()

    sched.spawn("lonely", waits_forever)
    with pytest.raises(SchedulerDeadlock) as caught:
        sched.run()
    assert list(caught.value.waits) == ["lonely"]
    assert "on condition" in caught.value.waits["lonely"]


@pytest.mark.spec("M-17", "M-28")
def test_threads_of_one_process_share_its_flocks_and_die_together() -> None:
    disk = SimDisk(seed=0)
    sched = Scheduler([0, 0, 1, 1, 2, 2] + [0] * 60)  # each takes its flock, then t0 runs on
    env = sched.wrap(disk.process())
    other = sched.wrap(disk.process())
    env.makedirs("/d")
    fd = env.open("/d/lock", OpenFlag.READ | OpenFlag.WRITE | OpenFlag.CREATE)
    other_fd = other.open("/d/lock", OpenFlag.READ | OpenFlag.WRITE)
    taken: list[tuple[str, bool]] = []
    killed: list[str] = []

    def t0() -> None:
        taken.append(("t0", env.flock_exclusive_nb(fd)))
        for _ in range(10):
            env.time()

    def t1() -> None:
        # The same open file description: the flock t0 holds "succeeds" here too.
        taken.append(("t1", env.flock_exclusive_nb(fd)))
        for _ in range(10):
            env.time()

    def outsider() -> None:
        taken.append(("q", other.flock_exclusive_nb(other_fd)))
        for _ in range(20):
            other.time()
        taken.append(("q", other.flock_exclusive_nb(other_fd)))

    def on_kill(name: str) -> None:
        killed.append(name)
        disk.kill(env.inner.getpid())

    sched.spawn("t0", t0, process="p")
    sched.spawn("t1", t1, process="p")
    sched.spawn("q", outsider, process="q")
    result = sched.run(kills={"t0": 9}, on_kill=on_kill)
    assert taken[:3] == [("t0", True), ("t1", True), ("q", False)]
    assert result.outcomes["t0"].aborted and result.outcomes["t1"].aborted  # M-17: together
    assert killed == ["t0"]
    assert result.outcomes["q"].returned and taken[-1] == ("q", True)  # M-8: released by the kill


@pytest.mark.spec("M-19")
def test_same_choices_same_trace_through_locks_and_waits() -> None:
    def run(choices: list[int]) -> list[Step]:
        disk = SimDisk(seed=0)
        sched = Scheduler(choices)
        env = sched.wrap(disk.process())
        backend = Disk(path="/s", env=env, fsync_frequency=0)
        for name in ("a", "b", "c"):
            sched.spawn(name, lambda name=name: [  # type: ignore[misc]
                backend.add_dead_task(f"{name}{i}", b"x", RuntimeError("e"), task_class="J",
                                      attempts=1) for i in range(2)], process="p")
        result = sched.run()
        assert all(o.returned for o in result.outcomes.values()), result.outcomes
        assert len(backend.list_dead_tasks()) == 6
        return result.trace

    choices = [2, 1, 0, 2, 2, 1, 0, 0, 1, 2, 1, 0, 2] * 5
    first = run(choices)
    assert {s.op for s in first} >= {"acquire", "wait"}  # group commit (S-14) waited
    assert run(choices) == first
    assert run([0] * 80) != first


@pytest.mark.spec("M-15")
def test_the_os_env_hands_out_plain_threading_locks() -> None:
    from deferq._engine.osenv import OsEnv

    env = OsEnv()
    mutex = env.mutex()
    assert type(mutex) is type(threading.Lock())
    assert isinstance(env.condition(mutex), threading.Condition)


@pytest.mark.spec("M-27")
def test_a_mutex_of_the_run_is_a_plain_lock_outside_it() -> None:
    disk = SimDisk(seed=0)
    sched = Scheduler()
    env = sched.wrap(disk.process())
    mutex = env.mutex()
    assert mutex.acquire() and not mutex.acquire(blocking=False)
    with pytest.raises(SchedulerStuck):
        mutex.acquire()  # would block for ever: nobody else can release it
    mutex.release()
    assert isinstance(mutex, SchedMutex) and not mutex.locked()
