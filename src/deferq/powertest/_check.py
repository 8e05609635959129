"""What the storage directory holds after a crash, and whether the model allows it.

Theory of operation. ``observe`` reads every file of the storage directory
directly (no ``Disk``, so nothing is repaired or merged before it is seen):
each WAL file is replayed on its own with the engine's ``WalReplay`` (a task
may be pending in two WALs at once: at-least-once); the dead-task data file is
read forward with the engine's decoders, the latest framed record of an id
deciding (R-@H). Torn tails (bytes after the last newline, R-@F) and damaged
complete lines are counted separately; a file that cannot be read is a problem.

``Ledger`` turns the harness's event log into ``StorageModel`` calls and judges
an observation with ``check_recovered`` (D-1..D-4, D-7, D-9, D-13), plus the
explicit checks the model cannot express: a copy of a task in a second WAL
must carry bytes some add wrote for that id (D-4); an id the engine generated
must never have been seen before (W-5); a task a restarted worker adopts must
have been written by some add (D-4).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from deferq._core.deadcodec import decode_dead_line, decode_dead_payload
from deferq._core.frame import BadLine
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
from deferq._core.names import dead_data_name, is_wal_file_name
from deferq._core.walcodec import WalAdd, decode_wal_line
from deferq.powertest._workers import Event, digest
from deferq._core.recovery import ForwardLines, RawLine, WalReplay

_CHUNK = 64 * 1024


@dataclass(frozen=True, slots=True)
class FileScan:
    """One file as read after a crash."""

    name: str
    size: int
    records: int
    torn_bytes: int  # bytes after the last newline (R-@F)
    damaged: int  # complete lines that do not decode (R-@B..R-@E)


@dataclass(slots=True)
class Observation:
    pending: dict[str, list[Pending]] = field(default_factory=dict)  # id -> one copy per WAL
    dead: dict[str, Dead] = field(default_factory=dict)
    files: list[FileScan] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def torn(self) -> int:
        return sum(1 for f in self.files if f.torn_bytes)

    @property
    def damaged(self) -> int:
        return sum(f.damaged for f in self.files)


def _lines(path: str, *, wal: bool) -> tuple[list[RawLine], int]:
    """The lines of a file, and the size they span: for a WAL file the NUL bytes it ends
    with are its reserved space, not lines (R-@L, W-25)."""
    with open(path, "rb") as f:
        data = f.read()
    size = len(data.rstrip(b"\0")) if wal else len(data)
    splitter = ForwardLines()
    out: list[RawLine] = []
    for start in range(0, size, _CHUNK):
        out.extend(splitter.feed(data[start:min(size, start + _CHUNK)]))
    tail = splitter.finish()
    if tail is not None:
        out.append(tail)
    return out, size


def _torn(lines: list[RawLine], size: int) -> int:
    return size - lines[-1].offset if lines and not lines[-1].complete else 0


def observe(path: str, prefix: str) -> Observation:
    """Read every WAL file and the dead-task data file of ``path`` as they are now."""
    obs = Observation()
    try:
        names = sorted(os.listdir(path))
    except FileNotFoundError:
        return obs  # cut before any Disk made the directory durable: the model judges that
    except OSError as exc:
        obs.problems.append(f"cannot list {path}: {exc}")
        return obs
    for name in names:
        full = os.path.join(path, name)
        try:
            if is_wal_file_name(prefix, name):
                _observe_wal(obs, name, full)
            elif name == dead_data_name(prefix):
                _observe_dead(obs, name, full)
        except OSError as exc:
            obs.problems.append(f"cannot read {name}: {exc}")
    return obs


def _observe_wal(obs: Observation, name: str, full: str) -> None:
    lines, size = _lines(full, wal=True)
    replay = WalReplay()
    damaged = 0
    for raw in lines:
        if not replay.apply(raw) and raw.complete:
            damaged += 1
    for task_id, line in replay.live.items():
        record = decode_wal_line(line[:-1])
        assert isinstance(record, WalAdd)
        obs.pending.setdefault(task_id, []).append(
            Pending(digest(record.context).encode(), record.publish_at))
    obs.files.append(FileScan(name, size, replay.records, _torn(lines, size), damaged))


def _observe_dead(obs: Observation, name: str, full: str) -> None:
    lines, size = _lines(full, wal=False)
    latest: dict[str, bytes] = {}
    damaged = records = 0
    for raw in lines:
        if not raw.complete:
            continue
        framed = decode_dead_line(raw.data) if raw.data is not None else None
        if framed is None or isinstance(framed, BadLine):
            damaged += 1
            continue
        records += 1
        latest.pop(framed.task_id, None)
        assert raw.data is not None
        latest[framed.task_id] = raw.data
    for task_id, data in latest.items():
        framed = decode_dead_line(data)
        assert not isinstance(framed, BadLine)
        task = decode_dead_payload(framed)
        if isinstance(task, BadLine):
            damaged += 1  # R-@G: the latest record of this id does not decode; it is not listed.
            continue
        obs.dead[task_id] = Dead(digest(task.context).encode(), task.task_class, task.attempts,
                                 task.exception_message)
    obs.files.append(FileScan(name, size, records, _torn(lines, size), damaged))


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
        # id -> (issued at, returned at, result) of acknowledged dead-store writes (and of
        # writes in flight at the crash, returned at infinity): two processes' writes to one
        # id whose calls overlapped may have taken the lock in either order, whatever order
        # their events reached the harness in.
        self._dead_acked: dict[str, list[tuple[float, float, Outcome]]] = {}
        self.reordered = 0
        # id -> the dead-store events of that id since the last check, printed with a
        # dead-store violation so that one sighting in a long soak can be analysed.
        self._dead_trace: dict[str, list[str]] = {}
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
                self._trace(incarnation, event, failed.kind, failed.fields)
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
            self._trace(inc, event, kind)
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
                self.violations.append(f"W-5: the engine generated id {task_id!r} for a new task,"
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
            self._trace(inc, event, op.kind, op.fields)
            issued_at, returned_at = op.fields.get("t"), event.get("t")
            if isinstance(issued_at, float) and isinstance(returned_at, float):
                ids = op.fields.get("ids") or [op.fields["id"]]
                assert isinstance(ids, list)
                result: Outcome = ABSENT if op.kind == "rdead" else Dead(
                    _str(op.fields["h"]).encode(), _str(op.fields["c"]),
                    int(str(op.fields["n"])), _str(op.fields["m"]))
                for task_id in ids:
                    self._dead_acked.setdefault(_str(task_id), []).append(
                        (issued_at, returned_at, result))
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
            if self._reordered(violation.task_id, violation.observed):
                self.reordered += 1
            else:
                trace = self._dead_trace.get(violation.task_id, ["(none since the last check)"])
                found.append(f"{label}: {violation}; its dead-store events since the last check:"
                             + "".join(f"\n    {line}" for line in trace))
        self._dead_acked.clear()
        self._dead_trace.clear()
        self._writes.clear()
        self._unknown.clear()
        self._holders.clear()
        self._live.clear()
        self.shared_ids.clear()
        self.cut_at = None
        self.violations += found
        return found

    def _trace(self, inc: str, event: Event, kind: str, issued: Event | None = None) -> None:
        """Note a dead-store issue (or, with ``issued``, its acknowledgement) per id."""
        fields = issued if issued is not None else event
        ids = fields.get("ids") or [fields.get("id")]
        assert isinstance(ids, list)
        line = f"{inc} {event['e']} {kind} s={event.get('s')} t={event.get('t')}"
        if event["e"] == "F":
            line += f" {event.get('x')}: {event.get('m')}"
        if "n" in event and kind == "rdead":
            line += f" removed={event['n']}"
        if "g" in fields:
            line += f" tag={fields['g']}"
        if issued is None and len(ids) > 1:
            line += f" ids={ids}"
        for task_id in ids:
            self._dead_trace.setdefault(str(task_id), []).append(line)

    def _count_hits(self, ops: list[_Op]) -> None:
        for op in ops:
            self.hit[op.kind] = self.hit.get(op.kind, 0) + 1

    def _dead_in_flight(self, ops: list[_Op]) -> None:
        """Dead-store writes cut off by the crash may have taken the store's lock at any
        moment after they were issued: after an acknowledged write of the same id, too."""
        for op in ops:
            issued_at = op.fields.get("t")
            if op.kind not in ("dead", "rdead") or not isinstance(issued_at, float):
                continue
            ids = op.fields.get("ids") or [op.fields["id"]]
            assert isinstance(ids, list)
            result: Outcome = ABSENT if op.kind == "rdead" else Dead(
                _str(op.fields["h"]).encode(), _str(op.fields["c"]), int(str(op.fields["n"])),
                _str(op.fields["m"]))
            for task_id in ids:
                self._dead_acked.setdefault(_str(task_id), []).append(
                    (issued_at, math.inf, result))
                self._dead_trace.setdefault(_str(task_id), []).append(
                    f"{op.kind} issued at t={issued_at} was in flight at a crash")

    def _reordered(self, task_id: str, observed: Outcome) -> bool:
        """Whether ``observed`` is the result of an acknowledged dead-store write whose call
        overlapped in time with another acknowledged write of the same id (either may have
        taken the store's lock last, D-11)."""
        acked = self._dead_acked.get(task_id, [])
        return any(result == observed and issued < other_returned and other_issued < returned
                   for i, (issued, returned, result) in enumerate(acked)
                   for j, (other_issued, other_returned, _) in enumerate(acked) if i != j)

    def checker_add(self, task_id: str, context: bytes) -> int:
        task = Pending(digest(context).encode(), None)
        self._known_add("checker", task_id, task)
        return self.model.add_task("checker", task_id, task)

    def checker_dead(self, task_id: str, dead: Dead) -> int:
        return self.model.add_dead(task_id, dead)
