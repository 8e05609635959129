"""Concurrent workers on one storage directory, interleaved at syscall granularity.

Goal: check that concurrent dead-task operations of several processes are
serialized with nothing acknowledged lost (D-11, L-1), that WAL work and a worker
booting (adopting an orphaned WAL, W-27, W-4) interleave safely with them, and that
what survives a crash in the middle of such an interleaving (a kill of the threads
still running, or a power loss) is allowed by the model (D-1, D-3, D-4, D-7, D-9,
D-12). Method: ``deferq.crashtest._scheduler.Scheduler`` runs two or three
simulated processes, each in its own thread with its own ``Disk``, one at a time,
switching at every seam call in the order of a choice list Hypothesis draws (and
shrinks). Every operation is mirrored into ``StorageModel`` when it returns: the
dead-task store serializes operations on its lock and a thread returns with no
seam call after releasing it, so completion order is the linearization order, and
``list_dead_tasks``/``find_dead_task``/``remove_dead_tasks`` results are compared
with the model exactly at that moment. A run may be cut after a drawn number of
steps, and one process may be killed alone at a drawn step while the others run
on: operations still running are in flight for the model (they may or may not
have happened), their processes are killed, and a power loss (a model that meets
A-11) may follow; then one new worker recovers everything and
``check_recovered`` judges it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import event, given, note, settings
from hypothesis import strategies as st

from deferq._engine import deadpages as _deadpages
from deferq._engine import wal as _wal
from deferq._engine.deadstore import DeadTaskStore
from deferq._core.errors import DeadTasksLockTimeout
from deferq._core.model import Crash as ModelCrash
from deferq._core.model import Dead, Pending, StorageModel
from deferq.backends import Disk
from deferq.crashtest import Scheduler, SimDisk, SimEnv
from deferq.crashtest._scheduler import ScheduledEnv

from tests.stateful.support import (
    MODEL_NAMES,
    MODELS,
    PATH,
    dead_of,
    check_wal_only,
    machine_settings,
    pending_of,
    work_around_unsynced_compaction_rename,
)

DEAD_POOL = ("d-1", "d-2", "d-3")
ROTATE_LIMIT = 100  # bytes: two or three records

Op = tuple[object, ...]  # (kind, arguments...), see ``ops``

ops = st.one_of(
    st.tuples(st.just("add"), st.binary(max_size=6)),
    st.tuples(st.just("remove"), st.integers(0, 3)),
    st.tuples(st.just("dead_add"), st.sampled_from(DEAD_POOL), st.binary(max_size=6)),
    st.tuples(st.just("dead_remove"),
              st.lists(st.sampled_from([*DEAD_POOL, "unknown-1"]), min_size=1, max_size=3)),
    st.tuples(st.just("list"), st.one_of(st.none(), st.integers(0, 3)), st.integers(0, 2)),
    st.tuples(st.just("find"), st.sampled_from(DEAD_POOL)),
    # S-72: a deep page of the operators' read, by a process without an index of its own.
    st.tuples(st.just("page"), st.integers(1, 3), st.integers(1, 2)),
    # S-86, S-87: the whole store folded through the cache, restarted by a compaction.
    st.tuples(st.just("fold"), st.none(), st.just(0)),
)


@dataclass
class Actor:
    """One simulated process run by one scheduled thread."""

    name: str
    env: ScheduledEnv
    frequency: float
    plan: list[Op]
    boot: bool = False  # opens its Disk inside the thread (adopting the orphaned WAL)
    disk: Disk | None = None
    added: list[str] = field(default_factory=list)
    in_flight: tuple[str, object] | None = None  # (kind, argument) of the op running now
    killed: bool = False


class World:
    """The shared model and bookkeeping; touched only by the thread holding the turn."""

    def __init__(self, sim: SimDisk, *, work_around: bool = True) -> None:
        self.sim = sim
        self.work_around = work_around
        self.model = StorageModel()
        self.owner: dict[str, str] = {}
        self.dead_order: list[str] = []  # newest first
        # Every order the store has had, oldest first: a read in several lock steps (S-86)
        # returns the store as it was at one moment between its call and its return.
        self.dead_orders: list[tuple[str, ...]] = [()]
        self.dead_ambiguous = False  # a killed process's dead-task op may or may not be done
        self.timeouts = 0
        self.rotations = 0
        self.actors: list[Actor] = []

    def expected_pending(self, name: str) -> dict[str, Pending]:
        return {i: p for i, p in self.model.pending().items() if self.owner.get(i) == name}

    def run_actor(self, actor: Actor) -> None:
        if actor.boot:
            actor.in_flight = ("boot", None)
            actor.disk = Disk(path=PATH, env=actor.env, fsync_frequency=actor.frequency)
            adopted = pending_of(actor.disk)
            # W-27, W-4: it adopts the orphan, and the WAL of any process killed before it
            # claimed (whose file it then merged and unlinked), and nothing else.
            files = set(self.sim.listdir(PATH))
            gone = {"old"} | {a.name for a in self.actors if a.killed and a.disk is not None
                              and a.disk._wal.file_name not in files}
            wal_ids = {i for i, o in self.owner.items() if o in gone}
            violations = check_wal_only(self.model, adopted, wal_ids)
            assert not violations, "\n".join(map(str, violations))
            assert set(adopted) >= set(self.expected_pending("old"))
            for task_id in wal_ids | set(adopted):
                self.owner[task_id] = actor.name
            actor.in_flight = None
        for op in actor.plan:
            self.run_op(actor, op)

    def run_op(self, actor: Actor, op: Op) -> None:
        disk = actor.disk
        assert disk is not None
        kind = op[0]
        model = self.model
        durable = actor.frequency == 0
        if kind == "add":
            context = op[1]
            assert isinstance(context, bytes)
            task_id = f"{actor.name}-{len(actor.added) + 1}"
            actor.added.append(task_id)
            self.owner[task_id] = actor.name
            actor.in_flight = ("add", (task_id, context))
            disk.add_task(context, task_id=task_id)
            model.acked(model.add_task(actor.name, task_id, Pending(context, None)), durable=durable)
        elif kind == "remove":
            index = op[1]
            assert isinstance(index, int)
            pending = sorted(self.expected_pending(actor.name))
            if not pending:
                return
            task_id = pending[index % len(pending)]
            actor.in_flight = ("remove", task_id)
            before = disk._wal.file_name
            disk.remove_task(task_id)
            if disk._wal.file_name != before:
                self.rotations += 1  # (Hypothesis events can only be recorded by the main thread)
            model.acked(model.remove_task(actor.name, task_id), durable=durable)
        else:
            self.run_dead_op(actor, disk, op)
        actor.in_flight = None

    def run_dead_op(self, actor: Actor, disk: Disk, op: Op) -> None:
        kind = op[0]
        model = self.model
        try:
            if kind == "dead_add":
                task_id, context = op[1], op[2]
                assert isinstance(task_id, str) and isinstance(context, bytes)
                actor.in_flight = ("dead_add", (task_id, context))
                disk.add_dead_task(task_id, context, RuntimeError(actor.name), task_class="Job",
                                   attempts=1)
                model.acked(model.add_dead(task_id, Dead(context, "Job", 1, actor.name)))
                if task_id in self.dead_order:
                    self.dead_order.remove(task_id)
                self.dead_order.insert(0, task_id)
                self.dead_orders.append(tuple(self.dead_order))
            elif kind == "dead_remove":
                ids = op[1]
                assert isinstance(ids, list)
                actor.in_flight = ("dead_remove", ids)
                found = disk.remove_dead_tasks(ids)
                expected = len(set(ids) & set(model.dead_tasks()))
                assert self.dead_ambiguous or found == expected, \
                    f"D-11/S-5: removed {found}, model says {expected}"
                model.acked(model.remove_dead(ids))
                self.dead_order = [i for i in self.dead_order if i not in ids]
                self.dead_orders.append(tuple(self.dead_order))
            elif kind in ("list", "page", "fold"):
                limit, offset = op[1], op[2]
                assert (limit is None or isinstance(limit, int)) and isinstance(offset, int)
                if kind == "fold":
                    since = len(self.dead_orders) - 1
                    folded = disk._dead.fold_tasks(list)
                    if folded is None:  # S-87: the fallback
                        folded = disk.list_dead_tasks()
                    assert self.dead_ambiguous or tuple(
                        t.id for t in folded) in self.dead_orders[since:], "S-86 under D-11"
                    return
                elif kind == "page":
                    assert limit is not None
                    disk._dead._drop_index()
                    listed = list(disk._dead.iter_tasks(offset, limit))
                else:
                    listed = disk.list_dead_tasks(limit=limit, offset=offset)
                if self.dead_ambiguous:
                    return
                end = None if limit is None else offset + limit
                assert [t.id for t in listed] == self.dead_order[offset:end], "S-6 under D-11"
                dead = model.dead_tasks()
                for task in listed:
                    assert dead[task.id] == Dead(task.context, task.task_class, task.attempts,
                                                 task.exception_message)
            else:
                task_id = op[1]
                assert isinstance(task_id, str)
                found_task = disk.find_dead_task(task_id)
                assert self.dead_ambiguous or \
                    (found_task is None) == (task_id not in model.dead_tasks())
        except DeadTasksLockTimeout:
            # L-3: a starved operation times out having changed nothing; the model is
            # not told, so any change it made would show as a disagreement.
            self.timeouts += 1

    def kill(self, actor: Actor) -> None:
        """The actor's process dies (its thread was aborted): its op is in flight."""
        if actor.killed:
            return
        actor.killed = True
        self.issue_in_flight(actor)
        self.sim.kill(actor.env.inner.getpid())
        self.model.crash(ModelCrash.PROCESS_KILL)
        if actor.in_flight is not None and actor.in_flight[0].startswith("dead"):
            self.dead_ambiguous = True
            if self.work_around and work_around_unsynced_compaction_rename(self.sim):
                event("work-around: unsynced compaction rename made durable")
        actor.in_flight = None

    def issue_in_flight(self, actor: Actor) -> None:
        """An operation cut by a kill or by the end of the run: in flight for the model."""
        if actor.in_flight is None:
            return
        kind, argument = actor.in_flight
        model = self.model
        if kind == "add":
            assert isinstance(argument, tuple)
            task_id, context = argument
            model.add_task(actor.name, task_id, Pending(context, None))
        elif kind == "remove":
            assert isinstance(argument, str)
            model.remove_task(actor.name, argument)
        elif kind == "dead_add":
            assert isinstance(argument, tuple)
            task_id, context = argument
            model.add_dead(task_id, Dead(context, "Job", 1, actor.name))
        elif kind == "dead_remove":
            assert isinstance(argument, list)
            model.remove_dead(argument)


def _prepare_orphan(world: World, env: SimEnv) -> None:
    """A worker that added three tasks, removed one and closed: its WAL is an orphan."""
    old = Disk(path=PATH, env=env, fsync_frequency=0)
    for i in range(3):
        task_id = old.add_task(f"old {i}".encode(), task_id=f"o-{i}")
        world.model.acked(world.model.add_task("old", task_id, Pending(f"old {i}".encode(), None)),
                          durable=True)
        world.owner[task_id] = "old"
    old.remove_task("o-1")
    world.model.acked(world.model.remove_task("old", "o-1"), durable=True)
    old.close()
    world.sim.kill(env.getpid())


@pytest.mark.slow
@pytest.mark.spec("D-11", "L-1", "D-1", "D-3", "D-4", "D-7", "D-9", "D-12", "W-27", "W-4", "A-11",
                  "S-73", "S-87")
@given(
    seed=st.integers(0, 2**16),
    plans=st.lists(st.lists(ops, min_size=1, max_size=6), min_size=2, max_size=3),
    frequencies=st.lists(st.sampled_from([0.0, 0.5]), min_size=3, max_size=3),
    boot=st.booleans(),
    choices=st.lists(st.integers(0, 2), max_size=300),
    max_steps=st.one_of(st.none(), st.integers(1, 250)),
    power=st.one_of(st.none(), st.tuples(st.sampled_from(MODEL_NAMES), st.integers(0, 2**16))),
    kill=st.one_of(st.none(), st.tuples(st.integers(0, 2), st.one_of(
        st.integers(0, 120), st.sampled_from(["write", "fsync", "rename", "fsync_dir", "map"])))),
)
@machine_settings(max_examples=150, stateful_step_count=1)
def test_concurrent_workers_and_crash(seed: int, plans: list[list[Op]], frequencies: list[float],
                                      boot: bool, choices: list[int], max_steps: int | None,
                                      power: tuple[str, int] | None,
                                      kill: tuple[int, int | str] | None) -> None:
    run_concurrently(seed, plans, frequencies, boot, choices, max_steps, power, kill)


@pytest.mark.slow
@pytest.mark.spec("D-7", "D-11", "S-9")
@given(choice=st.integers(0, 5))
@settings(max_examples=6, database=None)
def test_scheduler_reproduces_the_unsynced_compaction_rename_bug(choice: int) -> None:
    run_concurrently(0, [[("dead_add", "d-1", b""), ("dead_remove", ["d-1"])],
                         [("dead_add", "d-2", b"")]],
                     [0.0, 0.0, 0.0], False, [0] * 400, None, ("prefix", choice),
                     (0, "fsync_dir"), work_around=False)


def run_concurrently(seed: int, plans: list[list[Op]], frequencies: list[float], boot: bool,
                     choices: list[int], max_steps: int | None, power: tuple[str, int] | None,
                     kill: tuple[int, int | str] | None, *, work_around: bool = True) -> None:
    """One concurrent run, then a crash and a checked recovery (see the module docstring)."""
    with pytest.MonkeyPatch.context() as patch:
        # Small WALs rotate (W-9, W-10), so a booting worker can race a rotation (W-27).
        patch.setattr(_wal, "WAL_SIZE_LIMIT_BYTES", ROTATE_LIMIT)
        # S-65..S-74: pages past the first go through the index cache, built in small steps.
        patch.setattr(DeadTaskStore, "_cache_offset_min", 1)
        patch.setattr(DeadTaskStore, "_cache_tail_max", 300)
        patch.setattr(DeadTaskStore, "_cache_scan_share", 0)  # S-90 would scan them all
        patch.setattr(_deadpages, "DEAD_READ_STEP_BYTES", 256)
        _run(seed, plans, frequencies, boot, choices, max_steps, power, kill, work_around)


def _run(seed: int, plans: list[list[Op]], frequencies: list[float], boot: bool,
         choices: list[int], max_steps: int | None, power: tuple[str, int] | None,
         kill: tuple[int, int | str] | None, work_around: bool) -> None:
    sim = SimDisk(seed)
    note(f"SimDisk seed={seed}")
    world = World(sim, work_around=work_around)
    scheduler = Scheduler(choices)
    actors: list[Actor] = []
    for index, plan in enumerate(plans):
        env = scheduler.wrap(sim.process())
        actor = Actor(f"p{index}", env, frequencies[index], plan, boot=boot and index == 0)
        if not actor.boot:
            actor.disk = Disk(path=PATH, env=env, fsync_frequency=actor.frequency)
        actors.append(actor)
    if boot:  # after the others opened, so that only the booting worker can adopt it
        _prepare_orphan(world, sim.process())
    for actor in actors:
        scheduler.spawn(actor.name, lambda actor=actor: world.run_actor(actor))  # type: ignore[misc]
    world.actors = actors
    by_name = {actor.name: actor for actor in actors}
    kills: dict[str, int | str] = {} if kill is None else {actors[kill[0] % len(actors)].name: kill[1]}
    result = scheduler.run(max_steps, kills=kills, on_kill=lambda name: world.kill(by_name[name]))
    note(f"{len(result.trace)} steps, stopped early: {result.stopped_early}")
    if world.rotations:
        event("WAL rotated")
    if world.timeouts:
        event("dead-task lock timeout (L-3)")
    for outcome in result.outcomes.values():
        if outcome.error is not None:
            raise outcome.error
    killed = [a for a in actors if result.outcomes[a.name].aborted]
    if killed:
        event("run cut: threads killed mid-operation")
    for actor in killed:
        world.kill(actor)
    survivors = [a for a in actors if a not in killed and a.disk is not None]
    if not killed and power is None:
        # Nothing ambiguous: every worker and the dead-task store agree with the model.
        for actor in survivors:
            assert actor.disk is not None
            assert pending_of(actor.disk) == world.expected_pending(actor.name)
        dead, order = dead_of(survivors[0].disk) if survivors[0].disk else ({}, [])
        assert dead == world.model.dead_tasks() and order == world.dead_order
    if power is not None:
        model_name, choice = power
        world.model.crash(ModelCrash.POWER_LOSS)
        note(f"power loss: {sim.power_loss(MODELS[model_name], choice)}")
        event("power loss")
    else:
        for actor in survivors:
            assert actor.disk is not None
            actor.disk.close()
            world.model.synced(actor.name)
    recovered = Disk(path=PATH, env=sim.process(), fsync_frequency=0)
    dead, _ = dead_of(recovered)
    violations = world.model.check_recovered(pending_of(recovered), dead)
    assert not violations, "\n".join(map(str, violations))
    # Liveness: the recovered worker takes and keeps new work.
    task_id = recovered.add_task(b"after")
    recovered.add_dead_task("d-after", b"x", RuntimeError("e"), task_class="Job", attempts=1)
    assert {t.task_id for t in recovered.pending_tasks()} >= {task_id}
    assert recovered.find_dead_task("d-after") is not None
    recovered.close()
