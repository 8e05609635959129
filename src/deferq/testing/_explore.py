"""Bounded-exhaustive crash exploration of the storage engine (``Disk`` on a ``SimDisk``).

Theory of operation. A *workload* is a short sequence of engine operations on one or
two workers (``Step``): add (immediate or delayed), remove of an earlier pending task,
sync, the give-up handoff (``add_dead_task`` then ``remove_task``, one step), removal of
an earlier dead task, and a worker restart (close, then a new process opens the storage
directory and adopts the WAL). Each workload also fixes ``fsync_frequency`` (0 or 0.5),
the initial state (an empty directory, or a *seeded* one holding a durable pending task
``p0`` and a durable dead task ``d0``) and whether WAL rotation is forced (a tiny
``WAL_SIZE_LIMIT_BYTES``). ``workloads`` enumerates every such sequence of exactly
``max_ops`` steps after removing equivalent ones (see ``workloads``); every shorter
sequence is a prefix of an explored one, and the crash points of a prefix are the op
boundaries of its extensions, so they are covered.

For each workload the explorer runs it once on a fresh ``SimDisk`` through a tracing
``Env`` that records every seam-level call. Then, for every *crash point* it re-runs the
workload from scratch up to that point:

- ``sys:k``: a ``Crash`` fault fires before the k-th file or namespace call (any process);
- ``torn:k:n``: the k-th call is a ``write``; it writes only its first n bytes
  (``ShortWrite``) and the process dies before its next call (a torn write in the cache);
- ``eio:k``: the k-th call is a file ``fsync``; it fails with Linux semantics
  (``FsyncEio``), the workload runs on, and the crash comes at the end;
- ``op:i``: the crash comes after the first i steps have returned (``op:n`` = the end).

At the crash every process dies. Two crash kinds follow. *Process kill*: recovery reads
the volatile image (the page cache survives). *Power loss*, for each persistence model:
every state of ``SimDisk.crash_states(model, bound)``. A recovery boots the state, opens
a fresh ``Disk`` in a new process, reads the pending tasks and the dead tasks, then
*probes*: adds one pending and one dead task, closes, reopens and checks both probes are
there and nothing else changed (D-5, D-12: a torn tail must be cut before the next
append). The recovered tasks are checked by ``deferq._model.StorageModel``, fed with
exactly which operations were acknowledged, failed or in flight at the crash, plus the
handoff rule D-13 (a task whose give-up started while it had to survive must be in the
WAL or the dead-task store). Recoveries are cached by image digest, so a state reached
from many crash points is recovered once.

Everything is deterministic given the seed: workloads are enumerated in a fixed order,
the simulated machine is seeded, and the random part of ``Bound`` uses the seed. Each
violation carries a replay token (``deferq crash-test --replay TOKEN``).
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Final

import deferq._wal as _wal_module
from deferq._env import Cancel as _Cancel
from deferq._env import FileStat as _FileStat
from deferq._env import OpenFlag as _OpenFlag
from deferq._model import Crash as CrashKind
from deferq._model import Dead, IdHistory, Pending, StorageModel, Write
from deferq.backends import Disk
from deferq.testing._faults import Crash, FaultRule, FsyncEio, ShortWrite, SimulatedCrash
from deferq.testing._oplog import Image
from deferq.testing._persistence import (
    Bound,
    Ext4Ordered,
    PersistenceModel,
    Prefix,
    Weakest,
)
from deferq.testing._simdisk import SimDisk
from deferq.testing._simenv import SimEnv

__all__ = [
    "BOUNDS",
    "CI_BOUND",
    "Call",
    "CrashPoint",
    "Engine",
    "ExploreBound",
    "ExploreReport",
    "ExploreViolation",
    "FULL_BOUND",
    "HandoffOps",
    "ModelStats",
    "Mutant",
    "MutantResult",
    "PATH",
    "PREFIX",
    "Recovered",
    "Step",
    "TracingEnv",
    "Workload",
    "check_case",
    "check_disk",
    "check_mutant",
    "crash_points",
    "decode_token",
    "encode_token",
    "explore",
    "explore_models",
    "load_catalogue",
    "replay",
    "standard_handoff",
    "trace_workload",
    "workloads",
]

PATH: Final = "/s"
PREFIX: Final = "deferred-"
DELAY_S: Final = 2_000_000_000
# Small enough that a remove after one add rotates; above 2 so that 1.5x growth terminates.
ROTATE_LIMIT_BYTES: Final = 40
PROBE_PENDING: Final = "probe-p"
PROBE_DEAD: Final = "probe-d"
FREQUENCIES: Final = (0.0, 0.5)
STARTS: Final = ("empty", "seeded")
_TORN_KEEP: Final = (1, 9)  # plus len//2 and len-1 of each write


# ---------------------------------------------------------------------------- models


def explore_models(names: Sequence[str], *, tear_head_bytes: int = 64,
                   tear_points_max: int = 128) -> dict[str, PersistenceModel]:
    """The persistence models by name; ``weakest`` has atomic renames (A-11)."""
    out: dict[str, PersistenceModel] = {}
    for name in names:
        if name == "weakest":
            out[name] = Weakest(atomic_rename=True, tear_head_bytes=tear_head_bytes,
                                tear_points_max=tear_points_max)
        elif name == "ext4_ordered":
            out[name] = Ext4Ordered()
        elif name == "prefix":
            out[name] = Prefix()
        else:
            raise ValueError(f"unknown model {name!r}; use weakest, ext4_ordered or prefix")
    return out


@dataclass(frozen=True, slots=True)
class ExploreBound:
    """The bound of one exploration: how crash states are enumerated, how writes tear."""

    name: str
    bound: Bound
    tear_head_bytes: int
    tear_points_max: int

    def describe(self) -> str:
        b = self.bound
        return (f"{self.name}: exhaustive_max={b.exhaustive_max} random_states={b.random_states}"
                f" weakest tears: first {self.tear_head_bytes} bytes + last byte + "
                f"{self.tear_points_max} sector points")


CI_BOUND: Final = ExploreBound("ci", Bound(exhaustive_max=256, random_states=4), 10, 2)
FULL_BOUND: Final = ExploreBound("full", Bound(exhaustive_max=4096, random_states=64), 64, 128)
BOUNDS: Final = {"ci": CI_BOUND, "full": FULL_BOUND}


# ---------------------------------------------------------------------------- workloads


@dataclass(frozen=True, slots=True)
class Step:
    """One workload operation. ``task`` names an earlier task (``t1``.., ``p0``, ``d0``)."""

    kind: str  # add | remove | sync | give_up | remove_dead | restart
    worker: int = 0
    task: str = ""
    delayed: bool = False

    def __str__(self) -> str:
        if self.kind == "add":
            return f"add{'_delayed' if self.delayed else ''}(w{self.worker})"
        if self.task:
            return f"{self.kind}(w{self.worker},{self.task})"
        return f"{self.kind}(w{self.worker})"


@dataclass(frozen=True, slots=True)
class Workload:
    """A sequence of steps plus the settings it runs with."""

    steps: tuple[Step, ...]
    fsync_frequency: float = 0.0
    start: str = "empty"
    rotate: bool = False

    @property
    def workers(self) -> int:
        return 1 + max((s.worker for s in self.steps), default=0)

    def __str__(self) -> str:
        flags = f"f={self.fsync_frequency:g} start={self.start}" + (" rotate" if self.rotate else "")
        return f"[{'; '.join(str(s) for s in self.steps)}] {flags}"

    def to_json(self) -> dict[str, object]:
        return {"f": self.fsync_frequency, "s": self.start, "r": self.rotate,
                "o": [[s.kind, s.worker, s.task, s.delayed] for s in self.steps]}

    @staticmethod
    def from_json(data: dict[str, object]) -> Workload:
        ops = data["o"]
        assert isinstance(ops, list)
        steps = []
        for item in ops:
            assert isinstance(item, list)
            kind, worker, task, delayed = item
            steps.append(Step(str(kind), int(worker), str(task), bool(delayed)))
        f = data["f"]
        assert isinstance(f, (int, float))
        return Workload(tuple(steps), float(f), str(data["s"]), bool(data["r"]))


@dataclass(slots=True)
class _Sym:
    """The symbolic state used while enumerating workloads (what may be referenced next)."""

    workers: int = 0
    added: int = 0
    owner: dict[str, int] = field(default_factory=dict)
    pending: list[str] = field(default_factory=list)
    dead: list[str] = field(default_factory=list)
    dirty: set[int] = field(default_factory=set)

    def copy(self) -> _Sym:
        return _Sym(self.workers, self.added, dict(self.owner), list(self.pending),
                    list(self.dead), set(self.dirty))


def _candidates(sym: _Sym, frequency: float, workers_max: int) -> Iterator[Step]:
    usable = range(min(sym.workers + 1, workers_max))  # a new worker only as the next index
    for w in usable:
        yield Step("add", w)
        yield Step("add", w, delayed=True)
    for task in sym.pending:
        yield Step("remove", sym.owner[task], task)
        yield Step("give_up", sym.owner[task], task)
    for task in sym.dead:
        for w in usable:
            yield Step("remove_dead", w, task)
    for w in range(sym.workers):
        if frequency > 0 and w in sym.dirty:
            yield Step("sync", w)
        yield Step("restart", w)


def _apply(sym: _Sym, step: Step) -> _Sym:
    out = sym.copy()
    out.workers = max(out.workers, step.worker + 1)
    if step.kind == "add":
        out.added += 1
        task = f"t{out.added}"
        out.owner[task] = step.worker
        out.pending.append(task)
        out.dirty.add(step.worker)
    elif step.kind in ("remove", "give_up"):
        out.pending.remove(step.task)
        out.dirty.add(step.worker)
        if step.kind == "give_up":
            out.dead.append(step.task)
    elif step.kind == "remove_dead":
        out.dead.remove(step.task)
    elif step.kind in ("sync", "restart"):
        out.dirty.discard(step.worker)
    return out


def _initial(start: str) -> _Sym:
    sym = _Sym()
    if start == "seeded":
        sym.workers = 1
        sym.owner["p0"] = 0
        sym.pending.append("p0")
        sym.dead.append("d0")
    return sym


def workloads(max_ops: int = 3, *, workers_max: int = 2,
              frequencies: Sequence[float] = FREQUENCIES,
              starts: Sequence[str] = STARTS, rotation: bool = True) -> list[Workload]:
    """Every distinct workload of exactly ``max_ops`` steps, in a fixed order.

    Equivalences removed: workers are numbered in order of first use; with
    ``fsync_frequency=0`` there is no ``sync`` step (every write is synced already) and
    with 0.5 a ``sync`` only of a worker with unsynced writes; a restart only of a
    worker in use; remove and give-up only of a task still pending, ``remove_dead``
    only of a task still dead (others are no-ops, W-6, S-5); forced rotation only in a
    workload that removes from a WAL (rotation happens only in ``remove``).
    """
    out: list[Workload] = []
    for start in starts:
        for frequency in frequencies:
            def extend(prefix: tuple[Step, ...], sym: _Sym) -> Iterator[tuple[Step, ...]]:
                if len(prefix) == max_ops:
                    yield prefix
                    return
                for step in _candidates(sym, frequency, workers_max):
                    yield from extend(prefix + (step,), _apply(sym, step))

            for steps in extend((), _initial(start)):
                out.append(Workload(steps, frequency, start))
                if rotation and any(s.kind in ("remove", "give_up") for s in steps):
                    out.append(Workload(steps, frequency, start, rotate=True))
    return out


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


# ---------------------------------------------------------------------------- tracing Env


@dataclass(frozen=True, slots=True)
class Call:
    """One seam-level file or namespace call of the traced run."""

    op: str
    path: str
    nbytes: int
    pid: int


class TracingEnv:
    """An ``Env`` that records every file and namespace call of a ``SimEnv``, in order."""

    def __init__(self, inner: SimEnv, trace: list[Call]) -> None:
        self.inner = inner
        self._trace = trace
        self._pid = inner.getpid()

    def _rec(self, op: str, path: str, nbytes: int = 0) -> None:
        self._trace.append(Call(op, path, nbytes, self._pid))

    def _fd_path(self, fd: int) -> str:
        try:
            return self.inner.path_of(fd)
        except OSError:
            return "?"

    def open(self, path: str, flags: _OpenFlag, mode: int = 0o600) -> int:
        self._rec("open", path)
        return self.inner.open(path, flags, mode)

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        self._rec("pread", self._fd_path(fd))
        return self.inner.pread(fd, size, offset)

    def write(self, fd: int, data: bytes) -> int:
        self._rec("write", self._fd_path(fd), len(data))
        return self.inner.write(fd, data)

    def fsync(self, fd: int) -> None:
        self._rec("fsync", self._fd_path(fd))
        self.inner.fsync(fd)

    def ftruncate(self, fd: int, size: int) -> None:
        self._rec("ftruncate", self._fd_path(fd))
        self.inner.ftruncate(fd, size)

    def fstat(self, fd: int) -> _FileStat:
        self._rec("fstat", self._fd_path(fd))
        return self.inner.fstat(fd)

    def close(self, fd: int) -> None:
        self._rec("close", self._fd_path(fd))
        self.inner.close(fd)

    def flock_exclusive_nb(self, fd: int) -> bool:
        self._rec("flock_exclusive_nb", self._fd_path(fd))
        return self.inner.flock_exclusive_nb(fd)

    def flock_unlock(self, fd: int) -> None:
        self._rec("flock_unlock", self._fd_path(fd))
        self.inner.flock_unlock(fd)

    def rename(self, src: str, dst: str) -> None:
        self._rec("rename", src)
        self.inner.rename(src, dst)

    def unlink(self, path: str) -> None:
        self._rec("unlink", path)
        self.inner.unlink(path)

    def makedirs(self, path: str, mode: int = 0o700) -> None:
        self._rec("makedirs", path)
        self.inner.makedirs(path, mode)

    def listdir(self, path: str) -> list[str]:
        self._rec("listdir", path)
        return self.inner.listdir(path)

    def fsync_dir(self, path: str) -> None:
        self._rec("fsync_dir", path)
        self.inner.fsync_dir(path)

    def time(self) -> float:
        return self.inner.time()

    def monotonic(self) -> float:
        return self.inner.monotonic()

    def sleep(self, seconds: float) -> None:
        self.inner.sleep(seconds)

    def getpid(self) -> int:
        return self.inner.getpid()

    def random_u32(self) -> int:
        return self.inner.random_u32()

    def local_date(self) -> str:
        return self.inner.local_date()

    def call_every(self, interval_s: float, callback: Callable[[], None]) -> _Cancel:
        return self.inner.call_every(interval_s, callback)

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


# ---------------------------------------------------------------------------- the explorer


@dataclass(slots=True)
class ModelStats:
    """Numbers of one crash kind / persistence model."""

    states: int = 0
    recoveries: int = 0
    violations: int = 0


@dataclass(frozen=True, slots=True)
class ExploreViolation:
    """One recovered state the guarantees forbid, with everything needed to replay it."""

    engine: str
    workload: str
    point: str
    crash: str  # "kill" or a model name
    state_index: int
    state: str
    message: str
    token: str

    @property
    def replay_command(self) -> str:
        return f"deferq crash-test --replay {self.token}"

    def __str__(self) -> str:
        return (f"{self.engine}: {self.workload} crash at {self.point} ({self.crash} state "
                f"#{self.state_index}: {self.state}): {self.message}\n  replay: "
                f"{self.replay_command}")


@dataclass(slots=True)
class ExploreReport:
    """The outcome of ``explore``."""

    engine: str
    seed: int
    max_ops: int
    bound: str
    models: tuple[str, ...]
    sequences: int = 0  # distinct workloads of exactly max_ops steps
    workloads: int = 0  # explored
    crash_points: int = 0
    syscalls: int = 0
    states: int = 0  # distinct crash states, summed over crash points and kinds
    recoveries: int = 0  # distinct images actually recovered (the cache misses)
    violations: list[ExploreViolation] = field(default_factory=list)
    per_model: dict[str, ModelStats] = field(default_factory=dict)
    elapsed_s: float = 0.0
    stopped_early: str = ""

    def summary(self) -> str:
        lines = [f"engine {self.engine}: seed={self.seed} max_ops={self.max_ops} bound {self.bound}",
                 f"  workloads explored {self.workloads}/{self.sequences}, crash points "
                 f"{self.crash_points} ({self.syscalls} traced syscalls), distinct states "
                 f"{self.states}, recoveries {self.recoveries}, {self.elapsed_s:.1f}s"]
        for name, stats in self.per_model.items():
            lines.append(f"  {name:<13} states={stats.states} violations={stats.violations}")
        if self.stopped_early:
            lines.append(f"  STOPPED EARLY: {self.stopped_early}")
        return "\n".join(lines)


def encode_token(engine: str, workload: Workload, point: CrashPoint, crash: str, state: int,
                 seed: int, bound: str) -> str:
    """A replay token: the case as compact JSON in URL-safe base64."""
    data = {"e": engine, "w": workload.to_json(), "p": str(point), "c": crash, "i": state,
            "s": seed, "b": bound}
    raw = json.dumps(data, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_token(token: str) -> dict[str, object]:
    raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    data = json.loads(raw)
    assert isinstance(data, dict)
    return data


def check_case(engine: Engine, workload: Workload, point: CrashPoint, *, seed: int = 0,
               models: dict[str, PersistenceModel], bound: Bound,
               kill: bool = True, cache: dict[bytes, Recovered] | None = None,
               only: tuple[str, int] | None = None, trace: Sequence[Call] | None = None,
               on_state: Callable[[str, int, str, Recovered, list[str]], None] | None = None,
               ) -> tuple[dict[str, ModelStats], list[tuple[str, int, str, str]]]:
    """Run one crash point and check every crash state; return stats and (crash, i, state, msg).

    ``only`` restricts the check to one (crash, state index), for replays.
    """
    cache = {} if cache is None else cache
    if trace is None:
        trace = trace_workload(engine, workload, seed)
    run = _prepare(engine, workload, point, seed, trace)
    stats: dict[str, ModelStats] = {}
    found: list[tuple[str, int, str, str]] = []
    verdicts: dict[tuple[CrashKind, bytes], list[str]] = {}

    def judge(kind: CrashKind, crash: str, index: int, desc: str, image: Image,
              boot: Callable[[], SimDisk]) -> None:
        st = stats.setdefault(crash, ModelStats())
        st.states += 1
        key = image.key()
        got = cache.get(key)
        if got is None:
            got = _recover(engine, boot())
            cache[key] = got
            st.recoveries += 1
        vkey = (kind, key)
        msgs = verdicts.get(vkey)
        if msgs is None:
            msgs = _check(run, kind, got)
            verdicts[vkey] = msgs
        if on_state is not None:
            on_state(crash, index, desc, got, msgs)
        if msgs:
            st.violations += 1
            found.append((crash, index, desc, "; ".join(msgs)))

    if kill and (only is None or only[0] == "kill"):
        image = run.disk.volatile_image()
        judge(CrashKind.PROCESS_KILL, "kill", 0, "volatile image", image,
              lambda: SimDisk(seed, image=image))
    for name, model in models.items():
        if only is not None and only[0] != name:
            continue
        for state in run.disk.crash_states(model, bound):
            if only is not None and state.index != only[1]:
                continue
            judge(CrashKind.POWER_LOSS, name, state.index, state.description, state.image,
                  state.to_disk)
    return stats, found


def explore(engine: Engine | None = None, *, max_ops: int = 3, seed: int = 0,
            models: Sequence[str] = ("weakest", "ext4_ordered", "prefix"),
            bound: ExploreBound = CI_BOUND, seconds: float | None = None,
            workload_list: Sequence[Workload] | None = None,
            stop_after_violations: int | None = None,
            progress: Callable[[str], None] | None = None, jobs: int = 1) -> ExploreReport:
    """Explore every workload of ``max_ops`` steps at every crash point (module docstring).

    Args:
        engine: the engine under test (default: the real one).
        max_ops: the workload length N.
        seed: seeds the machine and the random part of the bound.
        models: persistence models for power loss (the process kill is always checked).
        bound: how crash states are enumerated (``CI_BOUND`` or ``FULL_BOUND``).
        seconds: a time budget; the report says when it stopped early.
        workload_list: explore these instead of ``workloads(max_ops)``.
        stop_after_violations: stop once this many violations were found.
        progress: called with a line now and then.
        jobs: worker processes (shards of the workload list, merged in shard order);
            the engine must be picklable (the real one is), else the run is serial.
    """
    engine = engine if engine is not None else Engine()
    if jobs > 1:
        return _explore_parallel(engine, jobs, max_ops=max_ops, seed=seed, models=models,
                                 bound=bound, seconds=seconds, workload_list=workload_list,
                                 stop_after_violations=stop_after_violations,
                                 progress=progress)
    chosen = explore_models(models, tear_head_bytes=bound.tear_head_bytes,
                            tear_points_max=bound.tear_points_max)
    state_bound = Bound(exhaustive_max=bound.bound.exhaustive_max,
                        random_states=bound.bound.random_states, seed=seed)
    todo = list(workload_list) if workload_list is not None else workloads(max_ops)
    if workload_list is not None:
        max_ops = max((len(w.steps) for w in todo), default=0)
    report = ExploreReport(engine.name, seed, max_ops, bound.describe(), tuple(models),
                           sequences=len(todo))
    report.per_model = {"kill": ModelStats(), **{m: ModelStats() for m in models}}
    start = time.monotonic()
    cache: dict[bytes, Recovered] = {}
    with _quiet():
        _explore_loop(engine, todo, report, chosen, state_bound, bound, seed, seconds,
                      stop_after_violations, progress, cache, start)
    report.elapsed_s = time.monotonic() - start
    return report


def _signature(point: CrashPoint, message: str) -> str:
    """A violation's kind: its crash-point kind and its message without ids and values."""
    return point.kind + ":" + re.sub(r"'[^']*'|\[.*?\]|\(.*?\)", "_", message)


def _shard(engine: Engine, todo: list[Workload], max_ops: int, seed: int,
           models: tuple[str, ...], bound: ExploreBound, seconds: float | None,
           stop_after_violations: int | None) -> ExploreReport:
    return explore(engine, max_ops=max_ops, seed=seed, models=models, bound=bound,
                   seconds=seconds, workload_list=todo,
                   stop_after_violations=stop_after_violations)


def _explore_parallel(engine: Engine, jobs: int, *, max_ops: int, seed: int,
                      models: Sequence[str], bound: ExploreBound, seconds: float | None,
                      workload_list: Sequence[Workload] | None,
                      stop_after_violations: int | None,
                      progress: Callable[[str], None] | None) -> ExploreReport:
    import multiprocessing  # noqa: PLC0415
    import pickle  # noqa: PLC0415
    from concurrent.futures import ProcessPoolExecutor  # noqa: PLC0415

    todo = list(workload_list) if workload_list is not None else workloads(max_ops)
    try:
        pickle.dumps(engine)
    except (pickle.PicklingError, AttributeError, TypeError):
        return explore(engine, max_ops=max_ops, seed=seed, models=models, bound=bound,
                       seconds=seconds, workload_list=todo,
                       stop_after_violations=stop_after_violations, progress=progress)
    start = time.monotonic()
    shards = [todo[i::jobs] for i in range(jobs)]
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        futures = [pool.submit(_shard, engine, shard, max_ops, seed, tuple(models), bound,
                               seconds, stop_after_violations) for shard in shards]
        parts = [f.result() for f in futures]
    merged = ExploreReport(engine.name, seed, max_ops, bound.describe(), tuple(models),
                           sequences=len(todo))
    merged.per_model = {"kill": ModelStats(), **{m: ModelStats() for m in models}}
    for part in parts:
        merged.workloads += part.workloads
        merged.crash_points += part.crash_points
        merged.syscalls += part.syscalls
        merged.states += part.states
        merged.recoveries += part.recoveries
        merged.violations.extend(part.violations)
        for name, stats in part.per_model.items():
            total = merged.per_model.setdefault(name, ModelStats())
            total.states += stats.states
            total.recoveries += stats.recoveries
            total.violations += stats.violations
        if part.stopped_early:
            merged.stopped_early = "; ".join(filter(None, (merged.stopped_early,
                                                           part.stopped_early)))
    merged.elapsed_s = time.monotonic() - start
    if progress is not None:
        progress(f"  {jobs} shards done in {merged.elapsed_s:.0f}s")
    return merged


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence the engine's corruption warnings: the explorer causes thousands on purpose."""
    logger = logging.getLogger("deferq")
    saved = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(saved)


def _explore_loop(engine: Engine, todo: Sequence[Workload], report: ExploreReport,
                  chosen: dict[str, PersistenceModel], state_bound: Bound, bound: ExploreBound,
                  seed: int, seconds: float | None, stop_after_violations: int | None,
                  progress: Callable[[str], None] | None, cache: dict[bytes, Recovered],
                  start: float) -> None:
    done = False
    shown: set[str] = set()  # kinds of violation already shown through ``progress``
    for number, workload in enumerate(todo):
        if seconds is not None and time.monotonic() - start > seconds:
            report.stopped_early = (f"time budget of {seconds:g}s ran out after {number} of "
                                    f"{len(todo)} workloads")
            break
        trace = trace_workload(engine, workload, seed)
        report.workloads += 1
        report.syscalls += len(trace)
        for point in crash_points(trace, workload):
            report.crash_points += 1
            stats, found = check_case(engine, workload, point, seed=seed, models=chosen,
                                      bound=state_bound, cache=cache, trace=trace)
            for name, st in stats.items():
                total = report.per_model.setdefault(name, ModelStats())
                total.states += st.states
                total.recoveries += st.recoveries
                total.violations += st.violations
                report.states += st.states
                report.recoveries += st.recoveries
            for crash, index, desc, message in found:
                token = encode_token(engine.name, workload, point, crash, index, seed, bound.name)
                violation = ExploreViolation(engine.name, str(workload), str(point), crash,
                                             index, desc, message, token)
                report.violations.append(violation)
                signature = _signature(point, message)
                if progress is not None and signature not in shown and len(shown) < 50:
                    shown.add(signature)
                    progress(f"VIOLATION {violation}")
            if stop_after_violations is not None and \
                    len(report.violations) >= stop_after_violations:
                report.stopped_early = f"stopped after {len(report.violations)} violation(s)"
                done = True
                break
        if progress is not None and (number + 1) % 25 == 0:
            progress(f"  {number + 1}/{len(todo)} workloads, {report.states} states, "
                     f"{len(report.violations)} violations, {time.monotonic() - start:.0f}s")
        if done:
            break


def replay(engine: Engine, token: str, *, out: Callable[[str], None] = print) -> list[str]:
    """Re-run one case from a replay token, verbosely; return its violation messages."""
    data = decode_token(token)
    wj = data["w"]
    assert isinstance(wj, dict)
    workload = Workload.from_json(wj)
    point = CrashPoint.parse(str(data["p"]))
    crash = str(data["c"])
    index = data["i"]
    seed = data["s"]
    assert isinstance(index, int) and isinstance(seed, int)
    bound = BOUNDS[str(data["b"])]
    models = explore_models(["weakest", "ext4_ordered", "prefix"],
                            tear_head_bytes=bound.tear_head_bytes,
                            tear_points_max=bound.tear_points_max)
    out(f"engine:   {engine.name}")
    out(f"workload: {workload}")
    trace = trace_workload(engine, workload, seed)
    out(f"trace:    {len(trace)} calls")
    for k, call in enumerate(trace, start=1):
        mark = "  <-- crash point" if k == point.index and point.kind != "op" else ""
        out(f"  {k:4d} pid {call.pid} {call.op:<18} {call.path} "
            f"{call.nbytes if call.op == 'write' else ''}{mark}")
    out(f"crash:    {point} then {crash} state #{index} (seed {seed}, bound {bound.name})")
    messages: list[str] = []

    def show(kind: str, i: int, desc: str, got: Recovered, msgs: list[str]) -> None:
        out(f"state:    {kind} #{i}: {desc}")
        out(f"recovered pending: {sorted(got.pending.items())}")
        out(f"recovered dead:    {sorted((k, v.context) for k, v in got.dead.items())}")
        for message in msgs:
            out(f"VIOLATION: {message}")
        messages.extend(msgs)

    state_bound = Bound(exhaustive_max=bound.bound.exhaustive_max,
                        random_states=bound.bound.random_states, seed=seed)
    check_case(engine, workload, point, seed=seed, models=models, bound=state_bound,
               only=(crash, index), on_state=show, trace=trace)
    if not messages:
        out("no violation")
    return messages


# ---------------------------------------------------------------------------- mutants


@dataclass(frozen=True, slots=True)
class Mutant:
    """A deliberately broken engine (they live under tests/mutants, never in the product).

    Caught either by the exploration of ``workloads`` or by a targeted ``scenario``
    (concurrency bugs need an interleaving): a callable that runs the engine it is given
    and returns violation messages (empty for a correct engine).
    """

    name: str
    breaks: str
    caught_by: str
    engine: Engine
    workloads: tuple[Workload, ...] = ()
    scenario: Callable[[Engine], list[str]] | None = None


@dataclass(slots=True)
class MutantResult:
    """Whether a mutant was caught, and whether the real engine passed the same checks."""

    name: str
    violations: list[str]
    real_violations: list[str]
    elapsed_s: float

    @property
    def caught(self) -> bool:
        return bool(self.violations)


def check_mutant(mutant: Mutant, *, seed: int = 0, bound: ExploreBound = CI_BOUND,
                 models: Sequence[str] = ("weakest", "ext4_ordered", "prefix"),
                 seconds: float | None = None) -> MutantResult:
    """Run a mutant's checks on the mutant and on the real engine."""
    start = time.monotonic()
    real = Engine()
    if mutant.scenario is not None:
        with _quiet():
            found = _run_scenario(mutant.scenario, mutant.engine)
            real_found = _run_scenario(mutant.scenario, real)
    else:
        report = explore(mutant.engine, workload_list=mutant.workloads, seed=seed,
                         models=models, bound=bound, seconds=seconds,
                         stop_after_violations=1)
        found = [str(v) for v in report.violations]
        real_report = explore(real, workload_list=mutant.workloads, seed=seed, models=models,
                              bound=bound, seconds=seconds)
        real_found = [str(v) for v in real_report.violations]
    return MutantResult(mutant.name, found, real_found, time.monotonic() - start)


def _run_scenario(scenario: Callable[[Engine], list[str]], engine: Engine) -> list[str]:
    try:
        return scenario(engine)
    except Exception as exc:  # noqa: BLE001 - a scenario that cannot finish is a finding
        return [f"scenario {getattr(scenario, '__name__', '?')} raised "
                f"{type(exc).__name__}: {exc}"]


def check_disk(engine: Engine, disk: SimDisk, model: StorageModel, *,
               models: Sequence[str] = ("weakest",), bound: ExploreBound = CI_BOUND,
               seed: int = 0) -> list[str]:
    """Crash a scenario's machine now (every process dies) and check every recovery.

    For targeted scenarios: ``model`` must hold the scenario's operations with their
    outcomes. Checks the process kill and every power-loss state of ``models``.
    """
    for pid in disk.processes():
        disk.kill(pid)
    run = _Run.__new__(_Run)
    run.model = model
    run.handoffs = []
    run.anomalies = []
    out: list[str] = []
    image = disk.volatile_image()
    with _quiet():
        got = _recover(engine, SimDisk(seed, image=image))
        out.extend(f"process kill: {m}" for m in _check(run, CrashKind.PROCESS_KILL, got))
        chosen = explore_models(models, tear_head_bytes=bound.tear_head_bytes,
                                tear_points_max=bound.tear_points_max)
        for name, persistence in chosen.items():
            for state in disk.crash_states(persistence, bound.bound):
                got = _recover(engine, state.to_disk())
                out.extend(f"{state}: {m}" for m in _check(run, CrashKind.POWER_LOSS, got))
    return out


def load_catalogue(directory: str) -> tuple[Mutant, ...]:
    """The ``MUTANTS`` of ``DIRECTORY/catalogue.py`` (imported by path)."""
    import importlib.util  # noqa: PLC0415 - only the CLI needs it
    import sys  # noqa: PLC0415

    path = f"{directory.rstrip('/')}/catalogue.py"
    spec = importlib.util.spec_from_file_location("deferq_mutant_catalogue", path)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    mutants = getattr(module, "MUTANTS")  # noqa: B009
    if not isinstance(mutants, tuple) or not all(isinstance(m, Mutant) for m in mutants):
        raise TypeError(f"{path}: MUTANTS must be a tuple of deferq.testing.Mutant")
    return mutants
