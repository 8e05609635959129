"""Running one workload to one crash point, and checking what a fresh worker recovers.

Theory of operation. The engine under test is an ``Engine``: a ``Disk`` class (possibly
a mutant) and its give-up handoff order (``HandoffOps``, ``standard_handoff``). A run
executes a workload on a fresh ``SimDisk`` with ``deferq._core.model.StorageModel`` kept in
step. ``trace_workload`` runs it once without a crash through a ``TracingEnv`` that
records every seam-level call. Then, for every *crash point* (``crash_points``), the
workload is re-run from scratch up to that point (``_prepare``):

- ``sys:k``: a ``Crash`` fault fires before the k-th file or namespace call (any process);
- ``torn:k:n``: the k-th call is a ``write``; it writes only its first n bytes
  (``ShortWrite``) and the process dies before its next call (a torn write in the cache);
- ``eio:k``: the k-th call is a file ``fsync``; it fails with Linux semantics
  (``FsyncEio``), the workload runs on, and the crash comes at the end;
- ``op:i``: the crash comes after the first i steps have returned (``op:n`` = the end).

At the crash every process dies. ``_recover`` boots a crash state, opens a fresh ``Disk``
in a new process, reads the pending tasks and the dead tasks, then *probes*: adds one
pending and one dead task, closes, reopens and checks both probes are there and nothing
else changed (D-5, D-12: a torn tail must be cut before the next append). ``_check``
judges the recovered tasks with the model, fed with exactly which operations were
acknowledged, failed or in flight at the crash, plus the handoff rule D-13 (a task whose
give-up started while it had to survive must be in the WAL or the dead-task store).
Which crash states to recover is the explorer's job (``deferq.crashtest._explore``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final

import deferq._engine.wal as _wal_module
from deferq._core.model import Crash as CrashKind
from deferq._core.model import Dead, IdHistory, Pending, StorageModel, Write
from deferq.backends import Disk
from deferq.crashtest._faults import Crash, FaultRule, FsyncEio, ShortWrite, SimulatedCrash
from deferq.crashtest._oplog import Image
from deferq.crashtest._simdisk import SimDisk
from deferq.crashtest._simenv import SimEnv
from deferq.crashtest._tracing import Call, TracingEnv
from deferq.crashtest._workloads import Step, Workload

__all__ = [
    "CrashPoint",
    "Engine",
    "HandoffOps",
    "PATH",
    "PREFIX",
    "Recovered",
    "crash_points",
    "standard_handoff",
    "trace_workload",
]

PATH: Final = "/s"
PREFIX: Final = "deferred-"
DELAY_S: Final = 2_000_000_000
# Small enough that a remove after one add rotates; above 2 so that 1.5x growth terminates.
ROTATE_LIMIT_BYTES: Final = 40
PROBE_PENDING: Final = "probe-p"
PROBE_DEAD: Final = "probe-d"
_TORN_KEEP: Final = (1, 9)  # plus len//2 and len-1 of each write


# ---------------------------------------------------------------------------- engine seam


class HandoffOps:
    """The two calls of a give-up handoff, each with its model bookkeeping."""

    def __init__(self, run: _Run, worker: int) -> None:
        self._run = run
        self._worker = worker

    def add_dead(self, task_id: str) -> None:
        """``add_dead_task`` of this task (the dead record the model expects)."""
        self._run.add_dead(self._worker, task_id)

    def remove_task(self, task_id: str) -> None:
        """``remove_task`` of this task on its worker."""
        self._run.remove_task(self._worker, task_id)


Handoff = Callable[[HandoffOps, str], None]


def standard_handoff(ops: HandoffOps, task_id: str) -> None:
    """The queue's give-up order (D-13): the dead record first, the WAL removal only after."""
    ops.add_dead(task_id)
    ops.remove_task(task_id)


@dataclass(frozen=True, slots=True)
class Engine:
    """The engine under test: the ``Disk`` class (possibly a mutant) and the handoff order."""

    name: str = "deferq"
    disk_class: type[Disk] = Disk
    handoff: Handoff = standard_handoff


class _GaveUp(Exception):
    """The exception recorded with every dead task of a workload."""


def _pending_value(task: str, delayed: bool) -> Pending:
    return Pending(f"ctx-{task}".encode(), DELAY_S if delayed else None)


def _dead_value(task: str) -> Dead:
    return Dead(f"dead-{task}".encode(), "job.Task", 3, f"gave up {task}")


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


@dataclass(frozen=True, slots=True)
class CrashPoint:
    """Where a run stops (see the module docstring): ``sys``, ``torn``, ``eio`` or ``op``."""

    kind: str
    index: int
    keep: int = 0

    def __str__(self) -> str:
        if self.kind == "torn":
            return f"torn:{self.index}:{self.keep}"
        return f"{self.kind}:{self.index}"

    @staticmethod
    def parse(text: str) -> CrashPoint:
        parts = text.split(":")
        return CrashPoint(parts[0], int(parts[1]), int(parts[2]) if len(parts) > 2 else 0)


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
            self.model.acked(self.model.add_task("w0", "p0", _pending_value("p0", False)),
                             durable=True)
            self.model.acked(self.model.add_dead("d0", _dead_value("d0")))
        self.added = 0
        self.failed_workers: set[int] = set()

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
        value = _pending_value(task, delayed)
        op = self.model.add_task(f"w{w}", task, value)
        self._call(op, f"add_task({task})",
                   lambda: self.worker(w).add_task(value.context, value.publish_at, task_id=task),
                   worker=w, durable=self.workload.fsync_frequency == 0)

    def remove_task(self, w: int, task: str) -> None:
        op = self.model.remove_task(f"w{w}", task)
        self._call(op, f"remove_task({task})", lambda: self.worker(w).remove_task(task),
                   worker=w, durable=self.workload.fsync_frequency == 0)

    def add_dead(self, w: int, task: str) -> None:
        value = _dead_value(task)
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

    def give_up(self, w: int, task: str) -> None:
        survive = {}
        for kind in CrashKind:
            probe = _copy_model(self.model)
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
            self.add_task(step.worker, f"t{self.next_task()}", step.delayed)
        elif step.kind == "remove":
            self.remove_task(step.worker, step.task)
        elif step.kind == "give_up":
            self.give_up(step.worker, step.task)
        elif step.kind == "remove_dead":
            self.remove_dead(step.worker, step.task)
        elif step.kind == "sync":
            self.sync(step.worker)
        elif step.kind == "restart":
            self.restart(step.worker)
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
            value = _pending_value("p0", False)
            backend.add_task(value.context, value.publish_at, task_id="p0")
            dead = _dead_value("d0")
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


def crash_points(trace: Sequence[Call], workload: Workload) -> list[CrashPoint]:
    """Every crash point of a traced workload (see the module docstring)."""
    points = [CrashPoint("sys", k) for k in range(1, len(trace) + 1)]
    for k, call in enumerate(trace, start=1):
        if call.op == "write" and call.nbytes > 1:
            keeps = sorted({n for n in (*_TORN_KEEP, call.nbytes // 2, call.nbytes - 1)
                            if 0 < n < call.nbytes})
            points.extend(CrashPoint("torn", k, n) for n in keeps)
        if call.op == "fsync":
            points.append(CrashPoint("eio", k))
    points.extend(CrashPoint("op", i) for i in range(len(workload.steps) + 1))
    return points


def _nth_of(trace: Sequence[Call], op: str, k: int) -> int:
    """Which call of ``op`` the k-th call overall is (1-based, from the traced run)."""
    return sum(1 for call in trace[:k] if call.op == op)


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
                                  nth=_nth_of(trace, "write", point.index)))
    elif point.kind == "eio":
        run.disk.inject(FaultRule(op="fsync", fault=FsyncEio(),
                                  nth=_nth_of(trace, "fsync", point.index)))
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


# ---------------------------------------------------------------------------- recovery


@dataclass(frozen=True, slots=True)
class Recovered:
    """What a fresh worker read from a crash state, and what its probe found wrong."""

    pending: dict[str, Pending]
    dead: dict[str, Dead]
    problems: tuple[str, ...]


def _recover(engine: Engine, disk: SimDisk) -> Recovered:
    env = disk.process()
    try:
        backend = engine.disk_class(path=PATH, prefix=PREFIX, fsync_frequency=0, env=env)
    except Exception as exc:  # noqa: BLE001 - any failure to recover is a violation (D-5)
        return Recovered({}, {}, (f"recovery failed to open: {type(exc).__name__}: {exc}",))
    problems: list[str] = []
    try:
        pending = _read_pending(backend)
        dead = _read_dead(backend)
        backend.add_task(b"probe", None, task_id=PROBE_PENDING)
        backend.add_dead_task(PROBE_DEAD, b"probe", _GaveUp("probe"), task_class="probe",
                              attempts=1)
        backend.close()
    except Exception as exc:  # noqa: BLE001
        return Recovered({}, {}, (f"recovery failed: {type(exc).__name__}: {exc}",))
    disk.kill(env.getpid())
    env = disk.process()
    try:
        with engine.disk_class(path=PATH, prefix=PREFIX, fsync_frequency=0, env=env) as again:
            pending2 = _read_pending(again)
            dead2 = _read_dead(again)
    except Exception as exc:  # noqa: BLE001
        return Recovered(pending, dead, (f"reopen after probe failed: {type(exc).__name__}: {exc}",))
    want_pending = dict(pending, **{PROBE_PENDING: Pending(b"probe", None)})
    want_dead = dict(dead, **{PROBE_DEAD: Dead(b"probe", "probe", 1, "probe")})
    if pending2 != want_pending:
        problems.append(f"after a probe add_task and reopen the WAL holds {sorted(pending2)},"
                        f" expected {sorted(want_pending)} (D-5/D-12)")
    if dead2 != want_dead:
        problems.append(f"after a probe add_dead_task and reopen the store holds {sorted(dead2)},"
                        f" expected {sorted(want_dead)} (D-7/D-12)")
    return Recovered(pending, dead, tuple(problems))


def _read_pending(backend: Disk) -> dict[str, Pending]:
    out: dict[str, Pending] = {}
    for task in backend.pending_tasks():
        out[task.task_id] = Pending(task.context, task.publish_at)
    return out


def _read_dead(backend: Disk) -> dict[str, Dead]:
    return {t.id: Dead(t.context, t.task_class, t.attempts, t.exception_message)
            for t in backend.list_dead_tasks()}


def _copy_model(model: StorageModel) -> StorageModel:
    """A copy of the histories (not the in-flight table: a crash clears it anyway)."""
    out = StorageModel()
    for src, dst in ((model.wal, out.wal), (model.dead, out.dead)):
        for task_id, history in src.items():
            dst[task_id] = IdHistory(history.known,
                                     [Write(w.result, w.worker, w.status, w.durable)
                                      for w in history.writes], history.power_lost)
    return out


def _check(run: _Run, kind: CrashKind, got: Recovered) -> list[str]:
    """The model's verdict on one recovered state, plus D-13 and the probe."""
    model = _copy_model(run.model)
    model.crash(kind)
    out = [str(v) for v in model.check_recovered(got.pending, got.dead)]
    for handoff in run.handoffs:
        if handoff.must_survive[kind] and handoff.task not in got.pending \
                and handoff.task not in got.dead:
            out.append(f"task {handoff.task!r} is in neither store after its give-up handoff (D-13)")
    out.extend(got.problems)
    out.extend(f"without a fault, {a}" for a in run.anomalies)
    return out
