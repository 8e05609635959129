"""Whether the model allows what the storage directory holds after a crash.

Theory of operation. ``_observe.observe`` reads the files as they are; ``Ledger`` turns the harness's event log into ``StorageModel`` calls and judges
an observation with ``check_recovered`` (D-1..D-4, D-7, D-9, D-13), plus the
explicit checks the model cannot express: a copy of a task in a second WAL
must carry bytes some add wrote for that id (D-4); an id the engine generated
must never have been seen before (W-28); a task a restarted worker adopts must
have been written by some add (D-4). Dead-store writes whose calls overlapped may
have taken the lock in either order: ``_deadwrites.DeadWrites`` keeps their time spans
and says when a rejected dead task is explained by that (D-11).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from deferq._core.model import (
    ABSENT,
    Crash,
    Dead,
    IdHistory,
    Outcome,
    Pending,
    Status,
    StorageModel,
    Write,
)
from deferq.powertest._deadwrites import DeadWrites
from deferq.powertest._observe import Observation
from deferq.powertest._workers import Event, digest

@dataclass(slots=True)
class _Op:
    kind: str
    model_op: int | None
    durable: bool
    fields: Event


def _str(value: object) -> str:
    assert isinstance(value, str), value
    return value


def _pending_of(event: Event) -> Pending:
    publish_at = event.get("p")
    assert publish_at is None or isinstance(publish_at, int)
    return Pending(_str(event["h"]).encode(), publish_at)


class Ledger:
    """The acknowledgement log of one run, fed to the model as it arrives."""

    def __init__(self) -> None:
        self.model = StorageModel()
        self._ops: dict[tuple[str, int], _Op] = {}
        self._unknown: dict[bytes, list[str]] = {}  # digest -> incarnations with such an add in flight
        self._issued: dict[str, set[Pending]] = {}
        self.ids_seen: set[str] = set()
        self.acknowledged = 0
        self.synced_acks = 0
        self.failures: dict[str, int] = {}
        self.duplicates = 0
        self.violations: list[str] = []
        self.cut_at: float | None = None  # when the power cut began (time.monotonic)
        self.late_acks = 0  # acknowledgements that returned after the cut began
        self._holders: dict[str, set[str]] = {}  # id -> live incarnations that adopted or added it
        self._live: set[str] = set()
        self.shared_ids: set[str] = set()  # ids pending in two live WALs at once (at-least-once)
        self._dead = DeadWrites()  # dead-store writes since the last check (D-11)
        self.reordered = 0  # rejected dead tasks explained by overlapping writes
        self.hit: dict[str, int] = {}  # operations in flight when a crash struck, by kind
        # Called with (incarnation, id, digest) when an add whose acknowledgement never
        # arrived is bound to the id the engine chose (the queue checks follow it too).
        self.on_bind: Callable[[str, str, bytes], None] | None = None
        self._writes: dict[tuple[str, int], Write] = {}  # (incarnation, seq) -> its WAL write

    # ------------------------------------------------------------------ events
    def on_event(self, incarnation: str, event: Event) -> None:
        kind = event["e"]
        if kind == "I":
            self._on_issue(incarnation, event)
        elif kind == "A":
            self._on_ack(incarnation, event)
        elif kind in ("F", "X"):
            failed = self._ops.get((incarnation, int(str(event.get("s", -1)))))
            if failed is not None and failed.kind in ("dead", "rdead"):
                self._dead.note(incarnation, event, failed.kind, failed.fields)
            name = _str(event["x"]) if kind == "F" else f"exit on {_str(event['x'])}"
            self.failures[name] = self.failures.get(name, 0) + 1
            if event.get("bug"):
                self.violations.append(f"{incarnation}: harness error {name}: {event.get('m')}"
                                       f"\n{event.get('tb')}")

    def _on_issue(self, inc: str, event: Event) -> None:
        kind = _str(event["k"])
        seq = event["s"]
        assert isinstance(seq, int)
        durable = bool(event.get("d"))
        model_op: int | None = None
        model = self.model
        if kind == "add":
            task = _pending_of(event)
            task_id = event.get("id")
            if task_id is None:
                self._unknown.setdefault(task.context, []).append(inc)
            else:
                task_id = _str(task_id)
                self.ids_seen.add(task_id)
                self._issued.setdefault(task_id, set()).add(task)
                model_op = model.add_task(inc, task_id, task)
                self._writes[(inc, seq)] = model.wal[task_id].writes[-1]
        elif kind == "rem":
            model_op = model.remove_task(inc, _str(event["id"]))
            self._writes[(inc, seq)] = model.wal[_str(event["id"])].writes[-1]
        if kind in ("dead", "rdead"):
            self._dead.note(inc, event, kind)
        if kind == "dead":
            n = event["n"]
            assert isinstance(n, int)
            model_op = model.add_dead(_str(event["id"]), Dead(
                _str(event["h"]).encode(), _str(event["c"]), n, _str(event["m"])))
        elif kind == "rdead":
            ids = event["ids"]
            assert isinstance(ids, list)
            model_op = model.remove_dead([_str(i) for i in ids])
        self._ops[(inc, seq)] = _Op(kind, model_op, durable, event)

    def _on_ack(self, inc: str, event: Event) -> None:
        seq = event["s"]
        assert isinstance(seq, int)
        op = self._ops.pop((inc, seq), None)
        if op is None:
            return  # an op issued before a crash check (it stays in flight)
        if op.kind == "open":
            self._live.add(inc)
            self._on_open(inc, event)
            return
        if op.kind == "add" and op.model_op is None:
            # The id the engine generated is known now, whether or not the add counts as
            # acknowledged: bind it (as an issued, in-flight write) before judging the ack.
            task_id = _str(event["id"])
            if task_id in self.ids_seen:
                self.violations.append(f"W-28: the engine generated id {task_id!r} for a new task,"
                                       f" but that id was used before")
            task = _pending_of(op.fields)
            waiting = self._unknown.get(task.context, [])
            if inc in waiting:
                waiting.remove(inc)
            self._known_add(inc, task_id, task)
            op.model_op = self.model.add_task(inc, task_id, task)
            self._writes[(inc, seq)] = self.model.wal[task_id].writes[-1]
        returned = event.get("t")
        if self.cut_at is not None and isinstance(returned, float) and returned >= self.cut_at:
            self.late_acks += 1  # returned while the power was being cut: stays in flight
            return
        self.acknowledged += 1
        if op.kind == "sync":
            upto = op.fields.get("upto")
            if isinstance(upto, list):
                # A group commit (sync_through): durable are the writes it named, which were
                # acknowledged before its ticket was read (Q-20, Q-22, W-21).
                for covered in upto:
                    write = self._writes.get((inc, int(str(covered))))
                    if write is not None and write.status is Status.ACKED:
                        write.durable = True
            else:
                self.model.synced(inc)
            self.synced_acks += 1
            return
        if op.kind == "rdead":
            n = event.get("n")
            ids = op.fields["ids"]
            assert isinstance(n, int) and isinstance(ids, list)
            if not 0 <= n <= len(set(ids)):
                self.violations.append(f"remove_dead_tasks({ids}) returned {n}")
        if op.kind in ("dead", "rdead"):
            self._dead.acked(inc, event, op.kind, op.fields)
        if op.model_op is not None:
            self.model.acked(op.model_op, durable=op.durable)

    def _known_add(self, inc: str, task_id: str, task: Pending) -> None:
        self.ids_seen.add(task_id)
        self._issued.setdefault(task_id, set()).add(task)

    def _adopt_unknown(self, task_id: str, task: Pending) -> bool:
        """A task with an id the log never named: an in-flight add whose id the engine chose."""
        waiting = self._unknown.get(task.context)
        if not waiting:
            return False
        inc = waiting.pop(0)
        self._known_add(inc, task_id, task)
        if self.on_bind is not None:
            self.on_bind(inc, task_id, task.context)
        self.model.add_task(inc, task_id, task)  # issued, in flight: either outcome is allowed
        return True

    def _on_open(self, inc: str, event: Event) -> None:
        """A restarted worker adopted WALs: every task it found must have been written (D-4)."""
        tasks = event.get("tasks", [])
        assert isinstance(tasks, list)
        for item in tasks:
            assert isinstance(item, list)
            task_id, h, publish_at = item
            task = Pending(_str(h).encode(), publish_at)
            holders = self._holders.setdefault(task_id, set())
            if holders & self._live:
                self.shared_ids.add(task_id)  # e.g. a merge cut short, then two claimants
            holders.add(inc)
            if task in self._issued.get(task_id, set()):
                continue
            if task_id not in self.ids_seen and self._adopt_unknown(task_id, task):
                continue
            self.violations.append(f"D-4: {inc} adopted task {task_id!r} with bytes no add wrote")

    def forget(self, incarnation: str) -> None:
        """The process was killed: its open operations stay in flight in the model."""
        self._live.discard(incarnation)
        self._count_hits([op for key, op in self._ops.items() if key[0] == incarnation])
        self._dead_in_flight([op for key, op in self._ops.items() if key[0] == incarnation])
        for key in [k for k in self._ops if k[0] == incarnation]:
            del self._ops[key]

    # ------------------------------------------------------------------ checks
    def check(self, obs: Observation, crash: Crash, label: str) -> list[str]:
        """Judge a recovered state and adopt it as known; return the violations found.

        The WAL is judged per id by the model's allowed set (D-1..D-3), with copies in
        several WAL files judged as at-least-once duplicates: one copy must be allowed,
        the others must carry bytes some add wrote for that id (D-4). An id two live
        workers held at once may also show a removed task's bytes (its other copy).
        """
        self.model.crash(crash)
        self._count_hits(list(self._ops.values()))
        self._dead_in_flight(list(self._ops.values()))
        self._ops.clear()
        found = [f"{label}: {p}" for p in obs.problems]
        model = self.model
        for task_id, copies in obs.pending.items():
            if task_id not in self.ids_seen:
                for copy in copies:
                    self._adopt_unknown(task_id, copy)
        for task_id in sorted(set(model.wal) | set(obs.pending)):
            history = model.wal.get(task_id)
            allowed: set[Outcome] = history.allowed(wal=True) if history else {ABSENT}
            issued = self._issued.get(task_id, set())
            copies = obs.pending.get(task_id, [])
            got: Outcome = next((c for c in copies if c in allowed), copies[0] if copies else ABSENT)
            if len(copies) > 1:
                self.duplicates += 1
            for copy in copies:
                if copy not in issued:
                    found.append(f"{label}: D-4: WAL task {task_id!r} recovered with bytes no add"
                                 f" wrote: {copy}")
            if got not in allowed and not (task_id in self.shared_ids and got in issued):
                found.append(f"{label}: WAL task {task_id!r}: recovered {got!r} in "
                             f"{len(copies)} file(s), allowed one of "
                             f"{sorted(repr(a) for a in allowed)}")
            if got is ABSENT:
                model.wal.pop(task_id, None)
            else:
                model.wal[task_id] = IdHistory(known=got)
        for violation in model.check_recovered({}, obs.dead, wal_ids=set()):
            if self._dead.reordered(violation.task_id, violation.observed):
                self.reordered += 1
            else:
                trace = self._dead.trace(violation.task_id)
                found.append(f"{label}: {violation}; its dead-store events since the last check:"
                             + "".join(f"\n    {line}" for line in trace))
        self._dead.clear()
        self._writes.clear()
        self._unknown.clear()
        self._holders.clear()
        self._live.clear()
        self.shared_ids.clear()
        self.cut_at = None
        self.violations += found
        return found

    def _count_hits(self, ops: list[_Op]) -> None:
        for op in ops:
            self.hit[op.kind] = self.hit.get(op.kind, 0) + 1

    def _dead_in_flight(self, ops: list[_Op]) -> None:
        """Operations cut off by the crash: their dead-store writes' spans stay open."""
        for op in ops:
            self._dead.in_flight(op.kind, op.fields)

    def checker_add(self, task_id: str, context: bytes) -> int:
        task = Pending(digest(context).encode(), None)
        self._known_add("checker", task_id, task)
        return self.model.add_task("checker", task_id, task)

    def checker_dead(self, task_id: str, dead: Dead) -> int:
        return self.model.add_dead(task_id, dead)
