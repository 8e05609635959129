"""Running one workload to one crash point on a fresh simulated machine, model in step.

Theory of operation. A run (``_Run``) executes a workload on a fresh ``SimDisk`` with
``deferq._core.model.StorageModel`` kept in step: every operation is recorded in the
model before it is called and marked acknowledged or failed when it returns, so at any
crash the model knows exactly what was acknowledged, failed or in flight.
``trace_workload`` runs it once without a crash through a ``TracingEnv`` that records
every seam-level call; then, for every crash point (``_crashpoints``), the workload is
re-run from scratch up to that point (``_prepare``), with the faults that make the
crash happen there, and every process is killed. Recovering and judging the crash
states is ``_crashrecover``'s job; which states to recover is the explorer's
(``deferq.crashtest._explore``). The engine under test and its handoff order are
``_crashengine``'s.

An operation that raises without a fault having fired is an engine bug (an
*anomaly*), reported with the verdict. A worker whose open fails after a fault ends
the run (its WAL may be adopted by another worker, so the workload's plan no longer
holds); a step on a worker that is not open is skipped.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final

import deferq._engine.wal as _wal_module
from deferq._core.model import Crash as CrashKind
from deferq._core.model import IdHistory, StorageModel, Write
from deferq._engine.walorphan import HandoffWal
from deferq.backends import Disk
from deferq.crashtest._crashengine import (
    PATH,
    PREFIX,
    Engine,
    HandoffOps,
    dead_value,
    pending_value,
    standard_handoff,
)
from deferq.crashtest._crashpoints import CrashPoint, crash_points, nth_of
from deferq.crashtest._faults import Crash, FaultRule, FsyncEio, ShortWrite, SimulatedCrash
from deferq.crashtest._oplog import Image
from deferq.crashtest._simdisk import SimDisk
from deferq.crashtest._simenv import SimEnv
from deferq.crashtest._tracing import Call, TracingEnv
from deferq.crashtest._workloads import Step, Workload

# The engine seam and the crash points are re-exported: the mutant catalogue and
# older callers import them from here.
__all__ = [
    "CrashPoint",
    "Engine",
    "HandoffOps",
    "PATH",
    "PREFIX",
    "crash_points",
    "standard_handoff",
    "trace_workload",
]

# Small enough that a remove after one add rotates; above 2 so that 1.5x growth terminates.
ROTATE_LIMIT_BYTES: Final = 40


@contextlib.contextmanager
def _rotation(rotate: bool) -> Iterator[None]:
    if not rotate:
        yield
        return
    saved: object = getattr(_wal_module, "WAL_SIZE_LIMIT_BYTES")  # noqa: B009 - patched below
    setattr(_wal_module, "WAL_SIZE_LIMIT_BYTES", ROTATE_LIMIT_BYTES)  # noqa: B010 - Final
    try:
        yield
    finally:
        setattr(_wal_module, "WAL_SIZE_LIMIT_BYTES", saved)  # noqa: B010


# ---------------------------------------------------------------------------- running


class _GaveUp(Exception):
    """The exception recorded with every dead task of a workload.

    It stays in this module: its qualified name is written into every dead record
    (``exception_class``), so moving it would change the bytes, the tear points and the
    crash states every exploration sees.
    """


class _StopRun(Exception):
    """The run reached an ``op:i`` crash point."""


@dataclass(slots=True)
class _Handoff:
    task: str
    must_survive: dict[CrashKind, bool]


class _Run:
    """One execution of a workload on a fresh machine, with the model kept in step."""

    def __init__(self, engine: Engine, workload: Workload, seed: int,
                 trace: list[Call] | None) -> None:
        self.engine = engine
        self.workload = workload
        self.disk = SimDisk(seed, image=_start_image(workload.start, seed))
        self.model = StorageModel()
        self.trace = trace
        self.workers: list[Disk | None] = []
        self.pids: list[int] = []
        self.handoffs: list[_Handoff] = []
        self.anomalies: list[str] = []  # exceptions without a fault: engine bugs
        self.faulted = False
        if workload.start == "seeded":
            self.model.acked(self.model.add_task("w0", "p0", pending_value("p0", False)),
                             durable=True)
            self.model.acked(self.model.add_dead("d0", dead_value("d0")))
        self.added = 0
        self.failed_workers: set[int] = set()
        # The worker whose WAL each task was written to, by the workload's plan (W-15).
        self.owners: dict[str, int] = {"p0": 0} if workload.start == "seeded" else {}

    # --- workers
    def _env(self) -> SimEnv | TracingEnv:
        env = self.disk.process()
        return TracingEnv(env, self.trace) if self.trace is not None else env

    def open_worker(self, w: int) -> None:
        env = self._env()
        pid = env.getpid()
        while len(self.workers) <= w:
            self.workers.append(None)
            self.pids.append(0)
        self.pids[w] = pid
        self.workers[w] = None
        try:
            self.workers[w] = self.engine.disk_class(
                path=PATH, prefix=PREFIX, fsync_frequency=self.workload.fsync_frequency,
                env=env)
        except SimulatedCrash:
            raise
        except Exception as exc:  # noqa: BLE001 - a faulted open leaves the worker unusable
            self._unexpected(f"opening worker w{w}", exc)
            # The worker process gives up; its WAL may now be adopted by another worker,
            # so the workload's ownership plan no longer holds: the run ends here.
            raise _Abort from exc

    def _unexpected(self, what: str, exc: BaseException) -> None:
        if not self.faulted and not isinstance(exc, _StopRun):
            self.anomalies.append(f"{what} raised {type(exc).__name__}: {exc}")

    def worker(self, w: int) -> Disk:
        disk = self.workers[w] if w < len(self.workers) else None
        if disk is None:
            raise _Unusable(f"worker w{w} is not open")
        return disk

    # --- operations (each with its model bookkeeping)
    def _call(self, op: int, what: str, fn: Callable[[], object], *, worker: int,
              durable: bool = False) -> bool:
        try:
            fn()
        except SimulatedCrash:
            raise
        except Exception as exc:  # noqa: BLE001 - the operation failed: it may have taken effect
            self.model.failed(op)
            self.failed_workers.add(worker)
            self._unexpected(what, exc)
            return False
        self.model.acked(op, durable=durable)
        return True

    def add_task(self, w: int, task: str, delayed: bool) -> None:
        value = pending_value(task, delayed)
        op = self.model.add_task(f"w{w}", task, value)
        self._call(op, f"add_task({task})",
                   lambda: self.worker(w).add_task(value.context, value.publish_at, task_id=task),
                   worker=w, durable=self.workload.fsync_frequency == 0)

    def remove_task(self, w: int, task: str) -> None:
        op = self.model.remove_task(f"w{w}", task)
        self._call(op, f"remove_task({task})", lambda: self.worker(w).remove_task(task),
                   worker=w, durable=self.workload.fsync_frequency == 0)

    def remove_all(self, w: int) -> None:
        """W-79: every task pending in w's WAL, in one ``remove_tasks`` call (one append)."""
        pending = self.model.pending()
        tasks = [task for task, owner in self.owners.items() if owner == w and task in pending]
        op = self.model.remove_tasks(f"w{w}", tasks)
        self._call(op, f"remove_tasks({', '.join(tasks)})",
                   lambda: self.worker(w).remove_tasks(tasks),
                   worker=w, durable=self.workload.fsync_frequency == 0)

    def add_dead(self, w: int, task: str) -> None:
        value = dead_value(task)
        op = self.model.add_dead(task, value)
        if not self._call(op, f"add_dead_task({task})", lambda: self.worker(w).add_dead_task(
                task, value.context, _GaveUp(value.exception_message),
                task_class=value.task_class, attempts=value.attempts), worker=w):
            raise _HandoffFailed(task)

    def remove_dead(self, w: int, task: str) -> None:
        # D-13 is about the handoff; a later removal of the dead task ends its promise.
        self.handoffs = [h for h in self.handoffs if h.task != task]
        op = self.model.remove_dead([task])
        self._call(op, f"remove_dead_tasks({task})",
                   lambda: self.worker(w).remove_dead_tasks([task]), worker=w)

    def sync(self, w: int) -> None:
        try:
            self.worker(w).sync()
        except SimulatedCrash:
            raise
        except Exception as exc:  # noqa: BLE001
            self.failed_workers.add(w)
            self._unexpected(f"sync(w{w})", exc)
            return
        self.model.synced(f"w{w}")

    def restart(self, w: int) -> None:
        try:
            self.worker(w).close()
            # close fsyncs the WAL (C-9), except that a WAL broken by a failed write or
            # fsync (W-12) closes without an fsync and without an error: count it synced
            # only when no operation of this worker failed.
            if w not in self.failed_workers:
                self.model.synced(f"w{w}")
        except SimulatedCrash:
            raise
        except Exception as exc:  # noqa: BLE001
            self._unexpected(f"close(w{w})", exc)
        if self.pids[w] in self.disk.processes():
            self.disk.kill(self.pids[w])
        self.failed_workers.discard(w)
        self.open_worker(w)

    def hand_over(self, w: int, task: str) -> None:
        """A sibling process hands ``task`` over in a hand-off WAL file (W-34) and exits;
        worker ``w``'s sweep adopts it (W-30..W-32)."""
        worker = self.worker(w)
        value = pending_value(task, False)
        sibling = self._env()
        op = self.model.add_task("hand-off", task, value)
        handoff = HandoffWal(sibling, PATH, PREFIX)
        try:
            handoff.add_task(value.context, value.publish_at, task_id=task)
            handoff.sync()
        except SimulatedCrash:
            raise
        except Exception as exc:  # noqa: BLE001 - a faulted hand-off acknowledged nothing
            self.model.failed(op)
            self._unexpected(f"hand-off of {task}", exc)
            return
        finally:
            handoff.close()
            if sibling.getpid() in self.disk.processes():
                self.disk.kill(sibling.getpid())
        self.model.acked(op, durable=True)  # fsynced, file and name (W-1, W-34)
        try:
            worker.adopt_orphans()
        except SimulatedCrash:
            raise
        except Exception as exc:  # noqa: BLE001
            self.failed_workers.add(w)
            self._unexpected(f"adopt_orphans(w{w})", exc)
            return
        self.model.synced(f"w{w}")  # W-32: the sweep fsynced every record of w's WAL

    def give_up(self, w: int, task: str) -> None:
        survive = {}
        for kind in CrashKind:
            probe = copy_model(self.model)
            probe.crash(kind)
            history = probe.wal.get(task)
            survive[kind] = history is not None and None not in history.allowed(wal=True)
        self.handoffs.append(_Handoff(task, survive))
        try:
            self.engine.handoff(HandoffOps(self, w), task)
        except _HandoffFailed:
            pass

    def step(self, step: Step) -> None:
        if step.kind == "add":
            task = f"t{self.next_task()}"
            self.owners[task] = step.worker
            self.add_task(step.worker, task, step.delayed)
        elif step.kind == "remove":
            self.remove_task(step.worker, step.task)
        elif step.kind == "remove_all":
            self.remove_all(step.worker)
        elif step.kind == "give_up":
            self.give_up(step.worker, step.task)
        elif step.kind == "remove_dead":
            self.remove_dead(step.worker, step.task)
        elif step.kind == "sync":
            self.sync(step.worker)
        elif step.kind == "restart":
            self.restart(step.worker)
        elif step.kind == "hand_over":
            task = f"t{self.next_task()}"
            self.owners[task] = step.worker
            self.hand_over(step.worker, task)
        else:
            raise ValueError(f"unknown step {step.kind!r}")

    def next_task(self) -> int:
        self.added += 1
        return self.added

    def execute(self, stop_before_step: int | None) -> bool:
        """Run the workload; True when a crash (fault) stopped it."""
        with _rotation(self.workload.rotate):
            try:
                for w in range(self.workload.workers):
                    self.open_worker(w)
                for index, step in enumerate(self.workload.steps):
                    if stop_before_step is not None and index == stop_before_step:
                        return False
                    try:
                        self.step(step)
                    except _Unusable:
                        continue
            except SimulatedCrash:
                return True
            except _Abort:
                return False
        return False

    def kill_all(self) -> None:
        for pid in self.disk.processes():
            self.disk.kill(pid)


class _Abort(Exception):
    """A worker could not open (after a fault): the workload ends at this point."""


class _Unusable(Exception):
    """The step's worker is not open (its open failed after a fault)."""


class _HandoffFailed(Exception):
    """``add_dead_task`` of a handoff failed: the task stays in the WAL (D-8)."""


_START_IMAGES: dict[tuple[str, int], Image] = {}


def _start_image(start: str, seed: int) -> Image | None:
    """The durable image a workload starts from (None: an empty root)."""
    if start == "empty":
        return None
    key = (start, seed)
    image = _START_IMAGES.get(key)
    if image is None:
        disk = SimDisk(seed)
        env = disk.process()
        with Disk(path=PATH, prefix=PREFIX, fsync_frequency=0, env=env) as backend:
            value = pending_value("p0", False)
            backend.add_task(value.context, value.publish_at, task_id="p0")
            dead = dead_value("d0")
            backend.add_dead_task("d0", dead.context, _GaveUp(dead.exception_message),
                                  task_class=dead.task_class, attempts=dead.attempts)
        disk.kill(env.getpid())
        disk.sync()
        image = disk.durable_image()
        _START_IMAGES[key] = image
    return image


def trace_workload(engine: Engine, workload: Workload, seed: int = 0) -> list[Call]:
    """Run the workload without a crash and return its seam-level calls."""
    trace: list[Call] = []
    run = _Run(engine, workload, seed, trace)
    run.execute(None)
    run.kill_all()
    return trace


def _prepare(engine: Engine, workload: Workload, point: CrashPoint, seed: int,
             trace: Sequence[Call]) -> _Run:
    run = _Run(engine, workload, seed, None)
    stop: int | None = None
    if point.kind == "sys":
        run.disk.inject(FaultRule(op="*", fault=Crash(), nth=point.index))
    elif point.kind == "torn":
        # The write of call k lands short, and the process dies before its next call.
        run.disk.inject(FaultRule(op="*", fault=Crash(), nth=point.index + 1))
        run.disk.inject(FaultRule(op="write", fault=ShortWrite(point.keep),
                                  nth=nth_of(trace, "write", point.index)))
    elif point.kind == "eio":
        run.disk.inject(FaultRule(op="fsync", fault=FsyncEio(),
                                  nth=nth_of(trace, "fsync", point.index)))
        run.faulted = True
    elif point.kind == "op":
        stop = point.index
    else:
        raise ValueError(f"unknown crash point {point}")
    if point.kind in ("sys", "torn"):
        run.faulted = True
    run.execute(stop)
    run.kill_all()
    return run


def copy_model(model: StorageModel) -> StorageModel:
    """A copy of the histories (not the in-flight table: a crash clears it anyway)."""
    out = StorageModel()
    for src, dst in ((model.wal, out.wal), (model.dead, out.dead)):
        for task_id, history in src.items():
            dst[task_id] = IdHistory(history.known,
                                     [Write(w.result, w.worker, w.status, w.durable)
                                      for w in history.writes], history.power_lost)
    return out
