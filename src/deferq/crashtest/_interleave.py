"""Generic exploration of threads and processes interleaved at syscalls and locks (M-15..M-31).

Goal: find races between the threads of one process (a process-local mutex beside a flock on
a shared open file description) and between processes without a scenario written for each:
any change to the order in which the engine takes or releases its locks should show up here.

Method. A ``Plan`` names, per simulated process, the operations of each of its threads (WAL
adds and removes, a tick of the process's fsync timer, as its timer thread would run it, and
dead-task adds, removes, lists and finds), the scheduling choices, and how
the run ends (to completion, cut after a number of steps, one process killed at a step, a
power loss). ``check_plan`` runs it: each process is one ``SimDisk`` process with one
``Disk`` (the engine under test) on one ``ScheduledEnv``, shared by its threads, and a
``Scheduler`` runs every thread, switching at every seam call and every acquire of a
process-local mutex or wait on a condition (M-15). Every operation is issued to the pure
model (``StorageModel``) when it starts and acknowledged when it returns; identifiers are
unique per thread and a dead-task removal only names tasks whose add had returned, so each
identifier's history is in effect order whatever the interleaving (the model's rule).

Each result is checked when it returns, against what every interleaving consistent with the
operations' real-time order allows (M-18): a dead task whose add returned before the reader
started and that no removal started to remove must be listed, found and counted; one that was
never added or whose removal had returned must not be; listed tasks are newest first wherever
the adds did not overlap; and every value is exact. When the run completes, each process's
pending tasks and the whole dead-task store must equal the model. Then every process dies
(with a power loss under a drawn persistence model that meets A-11, when the plan says so), a
new process recovers, and ``StorageModel.check_recovered`` judges it. A deadlock (M-16) or an
unexpected exception in any thread is a violation too.

``random_plan`` draws a plan from a seed (for ``deferq crash-test`` and the mutant catalogue);
tests/stateful/test_threads.py draws them with Hypothesis, which shrinks a failure.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from deferq._core.errors import DeadTasksLockTimeout
from deferq._core.model import Crash, Dead, Pending, StorageModel
from deferq._core.types import DeadTask
from deferq.backends import Disk
from deferq.crashtest._crashengine import PATH, PREFIX, Engine
from deferq.crashtest._persistence import Ext4Ordered, PersistenceModel, Prefix, Weakest
from deferq.crashtest._schedenv import ScheduledEnv
from deferq.crashtest._scheduler import Scheduler, SchedulerStuck
from deferq.crashtest._simdisk import SimDisk
from deferq.crashtest._simenv import SimEnv

OP_KINDS: Final = ("add", "remove", "tick", "dead_add", "dead_remove", "list", "find")
DEAD_KINDS: Final = OP_KINDS[3:]
#: The persistence models a plan's power loss draws from: those that meet A-11.
POWER_MODELS: Final[dict[str, PersistenceModel]] = {
    "weakest-atomic-rename": Weakest(atomic_rename=True),
    "ext4_ordered": Ext4Ordered(),
    "prefix": Prefix(),
}

Op = tuple[str, int]
"""An operation: its kind (``OP_KINDS``) and a small integer that picks its argument."""


@dataclass(frozen=True, slots=True)
class Plan:
    """One run: ``threads[p][t]`` are the operations of thread t of process p (M-17)."""

    threads: tuple[tuple[tuple[Op, ...], ...], ...]
    frequencies: tuple[float, ...]  # fsync_frequency of each process's Disk
    choices: tuple[int, ...] = ()
    max_steps: int | None = None
    kill: tuple[int, int] | None = None  # (process, step): killed with all its threads
    power: tuple[str, int] | None = None  # (POWER_MODELS name, choice) after the run


@dataclass(slots=True)
class Session:
    """A machine and its model carried from one plan to the next (a stateful test's rounds):
    each plan's processes adopt what the previous plan's recovery left (W-27)."""

    sim: SimDisk
    model: StorageModel = field(default_factory=StorageModel)
    dead: dict[str, Dead] = field(default_factory=dict)  # the store as last recovered
    rounds: int = 0


@dataclass(slots=True)
class _Life:
    """One dead task's operations, in logical time (a counter of starts and returns)."""

    value: Dead
    added: tuple[int, int | None]  # (start, return) of its add; return None: not returned
    removals: list[list[int | None]] = field(default_factory=list)  # [start, return] each


class _Run:
    """The run's bookkeeping; touched only by the thread holding the scheduler's turn."""

    def __init__(self, plan: Plan, engine: Engine, session: Session,
                 scheduler: Scheduler) -> None:
        self.plan = plan
        self.session = session
        self.model = session.model
        self.tag = f"r{session.rounds}"  # ids are unique across a session's plans
        self.clock = 0
        # What an earlier plan left was added, in logical time, before anything here (0).
        self.dead = {i: _Life(value, (0, 0)) for i, value in session.dead.items()}
        # The first process opened adopts every orphaned WAL (W-27), so every pending task.
        self.owner: dict[str, int] = dict.fromkeys(self.model.pending(), 0)
        self.pending: dict[str, list[str]] = {}  # thread -> its pending ids, oldest first
        self.violations: list[str] = []
        self.killed: set[int] = set()
        self.sim = sim = session.sim
        self.pids: list[int] = []
        self.inners: list[SimEnv] = []
        self.envs: list[ScheduledEnv] = []
        self.disks: list[Disk] = []
        for frequency in plan.frequencies[:len(plan.threads)]:
            inner = sim.process()
            self.pids.append(inner.getpid())
            self.inners.append(inner)
            env = scheduler.wrap(inner)
            self.envs.append(env)
            self.disks.append(engine.disk_class(path=PATH, prefix=PREFIX, env=env,
                                                fsync_frequency=frequency))

    def tick(self) -> int:
        self.clock += 1
        return self.clock

    # ------------------------------------------------------------------ one thread

    def run_thread(self, process: int, thread: int) -> None:
        name = f"{self.tag}p{process}t{thread}"
        self.pending[name] = []
        for number, (kind, arg) in enumerate(self.plan.threads[process][thread], 1):
            if kind == "tick":
                self._tick(process, name)
            elif kind in ("add", "remove"):
                self._wal_op(process, name, kind, arg, number)
            else:
                self._dead_op(process, name, kind, arg, number)

    def _tick(self, process: int, name: str) -> None:
        """Half a second passes (a seam call: the machine's clock), then the process's due
        timers run in this thread, as its fsync timer thread would run them (W-8, W-21).

        The model is not told: an fsync only makes more durable than it knows (lenient).
        """
        self.envs[process].sleep(0.5)
        for error in self.inners[process].run_timers():
            self._fail(f"the fsync timer of p{process}, run by {name}, raised "
                       f"{type(error).__name__}: {error}")

    def _wal_op(self, process: int, name: str, kind: str, arg: int, number: int) -> None:
        disk, model, worker = self.disks[process], self.model, f"p{process}"
        durable = self.plan.frequencies[process] == 0
        if kind == "add":
            task_id, value = f"{name}-{number}", Pending(f"c{arg}".encode(), None)
            self.owner[task_id] = process
            op = model.add_task(worker, task_id, value)
            disk.add_task(value.context, task_id=task_id)
            self.pending[name].append(task_id)
        else:
            mine = self.pending[name]
            if not mine:
                return
            task_id = mine.pop(arg % len(mine))
            op = model.remove_task(worker, task_id)
            disk.remove_task(task_id)
        model.acked(op, durable=durable)

    def _dead_op(self, process: int, name: str, kind: str, arg: int, number: int) -> None:
        disk, model = self.disks[process], self.model
        start = self.tick()
        try:
            if kind == "dead_add":
                task_id = f"d-{name}-{number}"  # name carries the plan's tag
                value = Dead(f"x{arg}".encode(), "Job", 1 + arg % 3, name)
                life = self.dead[task_id] = _Life(value, (start, None))
                op = model.add_dead(task_id, value)
                disk.add_dead_task(task_id, value.context, RuntimeError(name), task_class="Job",
                                   attempts=value.attempts)
                life.added = (start, self.tick())
            elif kind == "dead_remove":
                ids = self._removal(arg)
                # This removal's own [start, return] entry in each task's life (another
                # thread's removal of the same task may append its own after it).
                spans: list[list[int | None]] = [[start, None] for i in ids if i in self.dead]
                for task_id, span in zip([i for i in ids if i in self.dead], spans, strict=True):
                    self.dead[task_id].removals.append(span)
                op = model.remove_dead(ids)
                found = disk.remove_dead_tasks(ids)
                end = self.tick()
                for span in spans:
                    span[1] = end
                self._check_count(name, ids, found, start, end)
            elif kind == "list":
                op = 0
                listed = disk.list_dead_tasks()
                self._check_list(name, listed, start, self.tick())
            else:
                op = 0
                known = sorted(self.dead)
                task_id = known[arg % len(known)] if known else "d-none"
                found_task = disk.find_dead_task(task_id)
                self._check_found(name, task_id, found_task, start, self.tick())
        except DeadTasksLockTimeout:
            # L-3: a starved operation gives up having changed nothing it acknowledged; for
            # the model it failed (it may or may not have taken effect, D-8).
            if kind in ("dead_add", "dead_remove"):
                model.failed(op)
            return
        if op:
            model.acked(op)

    def _removal(self, arg: int) -> list[str]:
        """Up to two ids whose add has returned, and an unknown one now and then."""
        done = sorted(i for i, life in self.dead.items() if life.added[1] is not None)
        ids = [done[arg % len(done)], done[(arg // 7) % len(done)]] if done else []
        if arg % 3 == 0:
            ids.append("d-unknown")
        return sorted(set(ids))

    # ------------------------------------------------------------------ checks (M-18)

    def _present(self, task_id: str, start: int, end: int) -> bool | None:
        """True/False when every interleaving agrees the task is/is not in the store
        during [start, end]; None when it depends on the interleaving."""
        life = self.dead.get(task_id)
        if life is None:
            return False
        if any(r[1] is not None and r[1] < start for r in life.removals):
            return False
        added = life.added[1]
        if added is not None and added < start and not any(
                r[0] is not None and r[0] < end and r[0] != start for r in life.removals):
            return True
        return None

    def _fail(self, message: str) -> None:
        self.violations.append(message)

    def _check_count(self, name: str, ids: list[str], found: int, start: int, end: int) -> None:
        states = [self._present(i, start, end) for i in ids]
        low, high = states.count(True), len(ids) - states.count(False)
        if not low <= found <= high:
            self._fail(f"D-11/S-5: remove_dead_tasks({ids}) in {name} removed {found}; every "
                       f"interleaving allows {low}..{high}")

    def _check_found(self, name: str, task_id: str, got: DeadTask | None, start: int,
                     end: int) -> None:
        state = self._present(task_id, start, end)
        if state is True and got is None or state is False and got is not None:
            self._fail(f"D-11/S-7: find_dead_task({task_id!r}) in {name} returned "
                       f"{'nothing' if got is None else 'a task'}")
        if got is not None:
            self._check_value(name, got)

    def _check_value(self, name: str, got: DeadTask) -> None:
        life = self.dead.get(got.id)
        value = Dead(got.context, got.task_class, got.attempts, got.exception_message)
        if life is None or life.value != value:
            self._fail(f"D-4: {name} read dead task {got.id!r} as {value}, which nobody wrote")

    def _check_list(self, name: str, listed: list[DeadTask], start: int, end: int) -> None:
        ids = [task.id for task in listed]
        if len(set(ids)) != len(ids):
            self._fail(f"S-6: list_dead_tasks in {name} listed an id twice: {ids}")
        for task in listed:
            self._check_value(name, task)
        for task_id in self.dead:
            state = self._present(task_id, start, end)
            if state is True and task_id not in ids:
                self._fail(f"D-11: list_dead_tasks in {name} misses {task_id!r}, added and "
                           f"not removed before the list began (listed {ids})")
            if state is False and task_id in ids:
                self._fail(f"D-9: list_dead_tasks in {name} lists {task_id!r}, removed before "
                           "the list began")
        for newer_index, newer in enumerate(ids):
            for older in ids[newer_index + 1:]:
                a, b = self.dead.get(newer), self.dead.get(older)
                if a and b and a.added[1] is not None and a.added[1] < b.added[0]:
                    self._fail(f"S-6: list_dead_tasks in {name} lists {newer!r} before "
                               f"{older!r}, added after it returned (listed {ids})")


def check_plan(engine: Engine, plan: Plan, *, seed: int = 0,
               session: Session | None = None) -> list[str]:
    """Run ``plan`` on ``engine`` and return every violation found (empty: it passed).

    On a fresh machine (``SimDisk(seed)``), or on ``session``'s, which it leaves recovered
    for the next plan.
    """
    session = Session(SimDisk(seed)) if session is None else session
    session.rounds += 1
    sim = session.sim
    scheduler = Scheduler(list(plan.choices))
    run = _Run(plan, engine, session, scheduler)
    for process, threads in enumerate(plan.threads):
        for thread in range(len(threads)):
            scheduler.spawn(f"p{process}t{thread}",
                            lambda p=process, t=thread: run.run_thread(p, t),  # type: ignore[misc]
                            process=f"p{process}")
    kills = {} if plan.kill is None else {f"p{plan.kill[0] % len(plan.threads)}t0": plan.kill[1]}

    def on_kill(name: str) -> None:
        process = int(name[1:name.index("t")])
        run.killed.add(process)
        sim.kill(run.pids[process])
        run.model.crash(Crash.PROCESS_KILL, f"p{process}")

    try:
        result = scheduler.run(plan.max_steps, kills=kills, on_kill=on_kill)
    except SchedulerStuck as exc:  # SchedulerDeadlock included (M-16)
        return [*run.violations, f"M-16: {exc}"]
    for name, outcome in result.outcomes.items():
        if outcome.error is not None:
            run.violations.append(f"thread {name} raised {type(outcome.error).__name__}: "
                                  f"{outcome.error}")
    cut = {int(n[1:n.index("t")]) for n, o in result.outcomes.items() if o.aborted}
    if not run.violations and not cut and not run.killed:
        _check_complete(run)
    return run.violations or _check_recovery(run, engine, cut)


def _check_complete(run: _Run) -> None:
    """Every operation returned: each process's WAL and the dead-task store equal the model."""
    expected = run.model.pending()
    for process, disk in enumerate(run.disks):
        got = {t.task_id: Pending(t.context, t.publish_at) for t in disk.pending_tasks()}
        mine = {i: p for i, p in expected.items() if run.owner.get(i) == process}
        if got != mine:
            run.violations.append(f"D-1: process p{process} has pending {sorted(got)}, the "
                                  f"model {sorted(mine)}")
    dead = {t.id: Dead(t.context, t.task_class, t.attempts, t.exception_message)
            for t in run.disks[0].list_dead_tasks()}
    if dead != run.model.dead_tasks():
        run.violations.append(f"D-7/D-11: the dead-task store holds {sorted(dead)}, the "
                              f"model {sorted(run.model.dead_tasks())}")


def _check_recovery(run: _Run, engine: Engine, cut: set[int]) -> list[str]:
    """Every process dies (a power loss too, if planned); a new one must recover an allowed
    state and keep new work."""
    sim, model = run.sim, run.model
    for process, pid in enumerate(run.pids):
        if process in run.killed or process in cut:
            if pid in sim.processes():
                sim.kill(pid)
            continue
        run.disks[process].close()
        model.synced(f"p{process}")
        sim.kill(pid)
    model.crash(Crash.PROCESS_KILL)
    if run.plan.power is not None:
        name, choice = run.plan.power
        model.crash(Crash.POWER_LOSS)
        sim.power_loss(POWER_MODELS[name], choice)
    env = sim.process()
    recovered = engine.disk_class(path=PATH, prefix=PREFIX, fsync_frequency=0, env=env)
    pending = {t.task_id: Pending(t.context, t.publish_at) for t in recovered.pending_tasks()}
    dead = {t.id: Dead(t.context, t.task_class, t.attempts, t.exception_message)
            for t in recovered.list_dead_tasks()}
    out = [f"recovery: {v}" for v in model.check_recovered(pending, dead)]
    after, value = f"d-after-{run.tag}", Dead(b"", "Job", 1, "e")
    op = model.add_dead(after, value)
    recovered.add_dead_task(after, b"", RuntimeError("e"), task_class="Job", attempts=1)
    model.acked(op)
    if recovered.find_dead_task(after) is None:
        out.append("recovery: a dead task added after recovery is not found (liveness)")
    run.session.dead = {**dead, after: value}
    recovered.close()  # its WAL, holding every pending task, is the next plan's orphan
    sim.kill(env.getpid())
    return out


def random_plan(rng: random.Random) -> Plan:
    """A plan for ``explore_threads``: one process of three threads and one of one or two,
    one to five operations each (mostly on the dead-task store, where the two locks are),
    random choices, and one ending in four."""
    threads = tuple(
        tuple(tuple((rng.choice(DEAD_KINDS if rng.random() < 0.8 else OP_KINDS),
                     rng.randrange(64)) for _ in range(rng.randint(1, 5)))
              for _ in range(count))
        for count in (3, rng.randint(1, 2)))
    ending = rng.randrange(4)
    return Plan(threads, (0.0, rng.choice((0.0, 0.5))),
                tuple(rng.randrange(6) for _ in range(400)),
                max_steps=rng.randint(5, 200) if ending == 1 else None,
                kill=(rng.randrange(2), rng.randint(1, 150)) if ending == 2 else None,
                power=(rng.choice(tuple(POWER_MODELS)), rng.randrange(2**16))
                if ending == 3 else None)


@dataclass(slots=True)
class ThreadsReport:
    """What ``explore_threads`` ran and found: each failing seed with its violations."""

    runs: int = 0
    failures: list[tuple[int, list[str]]] = field(default_factory=list)
    elapsed_s: float = 0.0


def explore_threads(engine: Engine, *, seed: int = 0, runs: int = 200,
                    seconds: float | None = None, stop_after: int | None = None) -> ThreadsReport:
    """Check ``runs`` random plans (seeds ``seed``, ``seed + 1``, ...) on ``engine``."""
    report = ThreadsReport()
    begin = time.monotonic()
    for number in range(seed, seed + runs):
        if seconds is not None and time.monotonic() - begin > seconds:
            break
        found = check_plan(engine, random_plan(random.Random(number)), seed=number)
        report.runs += 1
        if found:
            report.failures.append((number, found))
            if stop_after is not None and len(report.failures) >= stop_after:
                break
    report.elapsed_s = time.monotonic() - begin
    return report


def describe(seeds: Sequence[int]) -> str:
    """How to replay failing seeds."""
    return ", ".join(f"check_plan(engine, random_plan(random.Random({s})), seed={s})"
                     for s in seeds)
