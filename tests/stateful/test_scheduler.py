"""Unit tests of the deterministic syscall-granularity scheduler (``deferq.crashtest._scheduler``).

Goal: the concurrency tests built on the scheduler are only as trustworthy as its
promises: exactly one thread runs at a time, switches happen only at seam calls, a
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
from deferq.crashtest._scheduler import (
    START,
    Aborted,
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
