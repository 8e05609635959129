"""Workload generation for the crash explorer: which operation sequences are run.

Theory of operation. A *workload* is a short sequence of engine operations on one or
two workers (``Step``): add (immediate or delayed), remove of an earlier pending task,
``remove_all`` (every task pending on a worker that holds two or more, in one
``remove_tasks`` call: one append, W-79), sync, the give-up handoff (``add_dead_task`` then ``remove_task``, one step), removal of
an earlier dead task, and a worker restart (close, then a new process opens the storage
directory and adopts the WAL), and a hand-over: a short-lived sibling process writes a new
task into a hand-off WAL file (what ``deferq dead retry`` writes, W-34) and releases it, and
a running worker's sweep adopts it (W-30..W-32). Each workload also fixes ``fsync_frequency`` (0 or 0.5),
the initial state (an empty directory, or a *seeded* one holding a durable pending task
``p0`` and a durable dead task ``d0``) and whether WAL rotation is forced (a tiny
``WAL_SIZE_LIMIT_BYTES``). ``workloads`` enumerates every such sequence of exactly
``max_ops`` steps after removing equivalent ones (see ``workloads``); every shorter
sequence is a prefix of an explored one, and the crash points of a prefix are the op
boundaries of its extensions, so they are covered.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Final

__all__ = [
    "Step",
    "Workload",
    "workloads",
]

FREQUENCIES: Final = (0.0, 0.5)
REMOVING: Final = ("remove", "remove_all", "give_up")  # the steps that may rotate a WAL (W-9)
STARTS: Final = ("empty", "seeded")


# ---------------------------------------------------------------------------- workloads


@dataclass(frozen=True, slots=True)
class Step:
    """One workload operation. ``task`` names an earlier task (``t1``.., ``p0``, ``d0``)."""

    kind: str  # add | remove | remove_all | sync | give_up | remove_dead | restart | hand_over
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
    handed_over: bool = False

    def copy(self) -> _Sym:
        return _Sym(self.workers, self.added, dict(self.owner), list(self.pending),
                    list(self.dead), set(self.dirty), self.handed_over)


def _candidates(sym: _Sym, frequency: float, workers_max: int) -> Iterator[Step]:
    usable = range(min(sym.workers + 1, workers_max))  # a new worker only as the next index
    for w in usable:
        yield Step("add", w)
        yield Step("add", w, delayed=True)
    if not sym.handed_over:
        # One hand-over per workload, to worker 0, from an empty start: a second one, one
        # to worker 1 or next to the seeded tasks runs the same sweep code on the same
        # kind of file (this keeps the CI tier's time down: 37 more workloads at 2 ops).
        yield Step("hand_over", 0)
    for task in sym.pending:
        yield Step("remove", sym.owner[task], task)
        yield Step("give_up", sym.owner[task], task)
    for w in range(sym.workers):
        # W-79's one append of several records; of one task it is ``remove`` (C-37).
        if sum(1 for task in sym.pending if sym.owner[task] == w) >= 2:
            yield Step("remove_all", w)
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
    if step.kind in ("add", "hand_over"):
        out.added += 1
        task = f"t{out.added}"
        out.owner[task] = step.worker
        out.pending.append(task)
        if step.kind == "add":
            out.dirty.add(step.worker)
        else:
            out.dirty.discard(step.worker)  # the sweep fsyncs the whole WAL (W-32)
            out.handed_over = True
    elif step.kind in ("remove", "give_up"):
        out.pending.remove(step.task)
        out.dirty.add(step.worker)
        if step.kind == "give_up":
            out.dead.append(step.task)
    elif step.kind == "remove_all":
        out.pending = [task for task in out.pending if out.owner[task] != step.worker]
        out.dirty.add(step.worker)
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
        sym.handed_over = True  # no hand-over from a seeded start (see _candidates)
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
    workload that removes from a WAL (rotation happens only in ``remove``); one
    ``hand_over``, to worker 0, and only from an empty start.
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
                if rotation and any(s.kind in REMOVING for s in steps):
                    out.append(Workload(steps, frequency, start, rotate=True))
    return out
