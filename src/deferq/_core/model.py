"""PURE: the executable specification of what deferq storage must hold (spec/durability.md).

Theory of operation. The model sees the storage as its callers do. Every
operation is *issued*, then *acknowledged* (it returned), *failed* (it raised)
or left *in flight* (a crash hit it). For each task id the model keeps the
writes issued since the last point where it *knew* the id's state (the last
recovery), each with its status:

- WAL writes (``add``/``remove`` of pending tasks) are made durable by a later
  acknowledged sync of the same worker (``sync()`` returned, or the write was
  acknowledged with ``fsync_frequency=0``).
- Dead-task writes (``add_dead_task``/``remove_dead_tasks``) are durable when
  acknowledged (S-4, S-5).

After a crash the engine recovers some state; the model says whether it is
allowed, per id, as a set of allowed outcomes:

- power loss, WAL (D-1..D-4): the state after the last durable write, or the
  result of any later write (acknowledged, failed or in flight): under the
  weakest filesystem any subset of unsynced records may persist, and the last
  surviving record decides.
- process kill, WAL (D-12): the page cache survives, so the state after the
  last acknowledged write, or the result of a write in flight or failed after it.
- dead-task store (D-7, D-9, D-13): the state after the last acknowledged write,
  or the result of a failed or in-flight write after it.

Nothing outside the allowed set may appear (D-4: no invented task, no resurrected
removal beyond the contract). After the check the model adopts the observed
state as its new known state. ``Outcome`` is ``None`` for "absent", otherwise
the exact bytes and fields the engine must return.

Limits of the model, which its callers respect:
- Histories are in issue order, so concurrent callers issue each operation in
  the order it takes effect (for the dead-task store: the order of the lock).
- WAL histories are keyed by task id only: a caller adds an id in one worker's
  WAL at a time (W-15) and removes it only through that worker.
- It has no ordering of its own (newest first, S-6; first insertion, W-7), and
  does not know that a rotation makes a WAL durable (which only makes it more
  lenient).
- After a process kill, what a new reader observes of the dead-task store may
  be in the page cache only (the store fsyncs per add, not at open), so
  ``check_recovered(..., dead_durable=False)`` keeps an observed state that
  differs from the acknowledged one as a maybe, not as known.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Final


@dataclass(frozen=True, slots=True)
class Pending:
    """A pending task as ``pending_tasks`` returns it (without its id)."""

    context: bytes
    publish_at: int | None


@dataclass(frozen=True, slots=True)
class Dead:
    """The fields of a dead task the caller chose (failed_at and the rest are derived)."""

    context: bytes
    task_class: str
    attempts: int
    exception_message: str


Outcome = Pending | Dead | None
ABSENT: Final = None


class Status(enum.Enum):
    IN_FLIGHT = "in flight"
    ACKED = "acknowledged"
    FAILED = "failed"


class Crash(enum.Enum):
    PROCESS_KILL = "process kill"
    POWER_LOSS = "power loss"


@dataclass(slots=True)
class Write:
    """One issued write to one id: its result if it took effect, and what is known of it."""

    result: Outcome
    worker: str
    status: Status = Status.IN_FLIGHT
    durable: bool = False
    dead_store: bool = False  # dead-task writes are durable when acknowledged (S-4, S-5)


@dataclass(slots=True)
class IdHistory:
    """What the model knows of one id in one store."""

    known: Outcome = ABSENT  # the state at the last recovery (durable then)
    writes: list[Write] = field(default_factory=list)
    power_lost: bool = False  # a power loss happened since the state was last known

    def current(self) -> Outcome:
        """The state if every acknowledged write took effect and nothing else did."""
        state = self.known
        for write in self.writes:
            if write.status is Status.ACKED:
                state = write.result
        return state

    def allowed(self, *, wal: bool) -> set[Outcome]:
        """Every state a recovery may show for this id (see the module docstring)."""
        if wal and self.power_lost:
            base_index = max((i for i, w in enumerate(self.writes) if w.durable), default=-1)
        else:
            base_index = max((i for i, w in enumerate(self.writes) if w.status is Status.ACKED),
                             default=-1)
        base = self.known if base_index < 0 else self.writes[base_index].result
        later = self.writes[base_index + 1:]
        if not (wal and self.power_lost):
            later = [w for w in later if w.status is not Status.ACKED]
        return {base} | {w.result for w in later}


@dataclass(frozen=True, slots=True)
class Violation:
    """A recovered state the model forbids."""

    store: str
    task_id: str
    observed: Outcome
    allowed: tuple[str, ...]

    def __str__(self) -> str:
        return (f"{self.store} task {self.task_id!r}: recovered {self.observed!r}, "
                f"allowed one of {list(self.allowed)}")


class StorageModel:
    """The WALs of every worker and the dead-task store of one storage directory."""

    def __init__(self) -> None:
        self.wal: dict[str, IdHistory] = {}
        self.dead: dict[str, IdHistory] = {}
        self._ops: dict[int, list[Write]] = {}
        self._next_op = 0

    # ------------------------------------------------------------------ issuing
    def _issue(self, histories: dict[str, IdHistory], ids: list[str], result: Outcome,
               worker: str) -> int:
        writes = []
        for task_id in ids:
            write = Write(result, worker, dead_store=histories is self.dead)
            histories.setdefault(task_id, IdHistory()).writes.append(write)
            writes.append(write)
        self._next_op += 1
        self._ops[self._next_op] = writes
        return self._next_op

    def add_task(self, worker: str, task_id: str, task: Pending) -> int:
        return self._issue(self.wal, [task_id], task, worker)

    def remove_task(self, worker: str, task_id: str) -> int:
        return self._issue(self.wal, [task_id], ABSENT, worker)

    def remove_tasks(self, worker: str, task_ids: list[str]) -> int:
        """``remove_tasks`` of ids pending in ``worker``'s WAL: one removal each (W-79)."""
        return self._issue(self.wal, list(dict.fromkeys(task_ids)), ABSENT, worker)

    def add_dead(self, task_id: str, task: Dead, worker: str = "") -> int:
        return self._issue(self.dead, [task_id], task, worker)

    def remove_dead(self, ids: list[str], worker: str = "") -> int:
        return self._issue(self.dead, sorted(set(ids)), ABSENT, worker)

    # ------------------------------------------------------------------ outcomes
    def acked(self, op: int, *, durable: bool = False) -> None:
        """The operation returned; ``durable`` when it was also fsynced (fsync_frequency=0)."""
        for write in self._ops.pop(op):
            write.status = Status.ACKED
            write.durable = durable or write.dead_store

    def failed(self, op: int) -> None:
        """The operation raised: it may or may not have taken effect."""
        for write in self._ops.pop(op):
            write.status = Status.FAILED

    def synced(self, worker: str) -> None:
        """``sync()`` of this worker returned: its acknowledged WAL writes are durable."""
        for history in self.wal.values():
            for write in history.writes:
                if write.worker == worker and write.status is Status.ACKED:
                    write.durable = True

    def crash(self, kind: Crash, worker: str | None = None) -> None:
        """Processes died: their ops in flight stay so forever (they may or may not persist).

        ``worker`` limits a process kill to that worker's operations; a power loss
        kills everything.
        """
        if kind is Crash.PROCESS_KILL and worker is not None:
            for op in [op for op, writes in self._ops.items()
                       if any(w.worker == worker for w in writes)]:
                del self._ops[op]
            return
        self._ops.clear()
        if kind is Crash.POWER_LOSS:
            for history in self.wal.values():
                history.power_lost = True

    # ------------------------------------------------------------------ expectations
    def pending(self) -> dict[str, Pending]:
        """What ``pending_tasks`` must return with no crash in between (W-7)."""
        out = {}
        for task_id, history in self.wal.items():
            state = history.current()
            if isinstance(state, Pending):
                out[task_id] = state
        return out

    def dead_tasks(self) -> dict[str, Dead]:
        """What the dead-task store must hold with no crash in between."""
        out = {}
        for task_id, history in self.dead.items():
            state = history.current()
            if isinstance(state, Dead):
                out[task_id] = state
        return out

    def must_hold(self) -> tuple[set[str], set[str]]:
        """Ids that must be pending / dead after any crash now (acknowledged and durable)."""
        pending = {i for i, h in self.wal.items() if ABSENT not in _power_allowed(h)}
        dead = {i for i, h in self.dead.items() if ABSENT not in h.allowed(wal=False)}
        return pending, dead

    # ------------------------------------------------------------------ recovery check
    def check_recovered(self, pending: dict[str, Pending], dead: dict[str, Dead],
                        *, wal_ids: set[str] | None = None,
                        dead_durable: bool = True) -> list[Violation]:
        """Check a recovered state and, if it is allowed, adopt it as known (D-1..D-4, D-7..D-13).

        ``wal_ids`` limits the WAL check to the ids whose files were recovered
        (after a kill, only the dead worker's); None checks every id.
        ``dead_durable=False`` (after a process kill) keeps an observed dead-task
        state that differs from the acknowledged one as a maybe, not as known.
        """
        violations = []
        for store, histories, observed, wal in (
            ("WAL", self.wal, pending, True), ("dead-task store", self.dead, dead, False)
        ):
            ids = set(histories) | set(observed)
            if wal and wal_ids is not None:
                ids &= wal_ids | set(observed)
            for task_id in sorted(ids):
                history = histories.get(task_id, IdHistory())
                allowed = history.allowed(wal=wal)
                got: Outcome = observed.get(task_id, ABSENT)
                if got not in allowed:
                    violations.append(Violation(store, task_id, got,
                                                tuple(sorted(repr(a) for a in allowed))))
                if wal or dead_durable:
                    histories[task_id] = IdHistory(known=got)
                else:
                    acked = history.current()
                    maybe = [] if got == acked else [Write(got, "", Status.FAILED, dead_store=True)]
                    histories[task_id] = IdHistory(known=acked, writes=maybe)
        return violations


def _power_allowed(history: IdHistory) -> set[Outcome]:
    saved = history.power_lost
    history.power_lost = True
    try:
        return history.allowed(wal=True)
    finally:
        history.power_lost = saved
