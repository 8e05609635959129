"""Queue-level checks of the power test: tasks followed from enqueue to their end.

Theory of operation. ``QueueLedger`` reads the same event log as ``Ledger``
(every backend call of every role) plus the queue roles' own events (task
executions, queue starts, storage-error log lines) and follows each enqueued
task by its token (a unique first argument named in the enqueue's add event):

- an id carries the tokens of the enqueue that created it; a retry re-add
  keeps its id; an operator retry (Q-33) gives a new id the tokens of the dead
  ids it retried. An id that a storage-level role added or removed is
  *foreign* (its bytes may no longer be a queue context) and is left to the
  storage model alone.
- As the log arrives: a queue may remove a task from its WAL only after the
  task ran to success or after its dead-task write returned (D-13, Q-8); a
  task that gives up records the attempts its class allows (``AlwaysFail``:
  max_retries + 1, ``fn_fail``: 1; tasks that eventually succeed must never be
  dead-lettered, Q-2, Q-3), and when one process saw all of an ``AlwaysFail``
  task's attempts they were 1..max_retries + 1; a queue runs only tasks some
  enqueue wrote, with that enqueue's arguments (nothing invented).
- After each crash: a task a queue removed before the crash is pending, dead,
  or ran to success, or an operator removed or retried its dead record: a
  give-up never loses the task (D-13). Every dead task of a queue class on disk
  has the attempts its class allows.
- After the final drain (a queue that ran every task to its end, Q-9): every
  task whose enqueue was acknowledged and durable (fsync_frequency=0, or a
  later ``sync()`` returned, before any power cut began) ran to success, or is
  dead, or an operator removed its dead record; nothing due is left pending.
- The queue's storage-error log lines outside a power cut are violations
  (work continues), except a dead-task lock timeout (D-8).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from deferq.powertest._observe import Observation
from deferq.powertest._queue_roles import ALWAYS_FAIL_MAX_RETRIES, GIVE_UP_ATTEMPTS, AlwaysFail
from deferq.powertest._workers import Event

ALLOWED_LOG_ERRORS = frozenset({"DeadTasksLockTimeout"})


def _s(value: object) -> str:
    assert isinstance(value, str), value
    return value


def _f(value: object) -> float | None:
    return value if isinstance(value, float) else None


@dataclass(slots=True)
class QueueStats:
    """What the queue roles did, for the details line."""

    starts: int = 0
    replayed: int = 0
    runs: int = 0
    ok_runs: int = 0
    gave_up: int = 0
    durable_enqueues: int = 0
    removals_judged: int = 0
    accounted: int = 0
    foreign: int = 0
    storage_log_errors: dict[str, int] = field(default_factory=dict)


class QueueLedger:
    """Follows every queue task through the event log and judges what the files show."""

    def __init__(self, queue_roles: Collection[str]) -> None:
        self.queue_roles = set(queue_roles)
        self.tokens: dict[str, set[str]] = {}  # id -> tokens of the enqueues it carries
        self.token_class: dict[str, str] = {}  # token -> task class name
        self.by_digest: dict[str, Event] = {}  # context digest of a tagged add -> its tag
        self.foreign: set[str] = set()
        self.ok_tokens: set[str] = set()
        self._ok_in: dict[str, set[str]] = {}  # incarnation -> tokens that ran ok in it
        self._ops: dict[tuple[str, int], Event] = {}
        self._dead: dict[tuple[str, str], tuple[int, bool]] = {}  # (inc, id) -> (seq, returned)
        self._dead_seq: dict[tuple[str, int], str] = {}  # dead writes in flight -> id
        self._runs: dict[tuple[str, str], list[int]] = {}  # (inc, id) -> attempts run
        self._removed: set[str] = set()  # ids a queue removed (before any cut) since the check
        self.removed_dead: set[str] = set()  # ids an operator removal named
        self.retried_dead: set[str] = set()  # ids an operator retry named
        self.uncertain: set[str] = set()  # tokens whose retry began after a power cut began
        self.durable_tokens: set[str] = set()
        # incarnation -> (seq, token) of enqueues acknowledged but not yet durable
        self._unsynced: dict[str, list[tuple[int, str]]] = {}
        self.cut_at: float | None = None
        self.expect_errors = False
        self.stats = QueueStats()
        self.violations: list[str] = []

    # ------------------------------------------------------------------ events
    def is_queue(self, inc: str) -> bool:
        return inc.split("#")[0] in self.queue_roles

    def _late(self, t: object) -> bool:
        return self.cut_at is not None and isinstance(t, float) and t >= self.cut_at

    def on_event(self, inc: str, event: Event) -> None:
        kind = event["e"]
        if kind == "I":
            self._on_issue(inc, event)
        elif kind == "A":
            self._on_ack(inc, event)
        elif kind == "F":
            self._ops.pop((inc, int(str(event["s"]))), None)
            self._dead_seq.pop((inc, int(str(event["s"]))), None)
        elif kind == "Q":
            self._on_queue(inc, event)
        elif kind == "L":
            name = _s(event["x"])
            errors = self.stats.storage_log_errors
            errors[name] = errors.get(name, 0) + 1
            if not self.expect_errors and name not in ALLOWED_LOG_ERRORS:
                self.violations.append(f"{inc}: the queue hit a storage error outside a crash: "
                                       f"{name}: {event.get('m')}")

    def _on_issue(self, inc: str, event: Event) -> None:
        kind = _s(event["k"])
        seq = int(str(event["s"]))
        queue = self.is_queue(inc)
        task_id = event.get("id")
        if kind == "add":
            if not queue:
                if task_id is not None:
                    self.foreign.add(_s(task_id))
                self._ops[(inc, seq)] = event
                return
            tag = event.get("g")
            if task_id is None:
                if isinstance(tag, dict):
                    token = tag.get("tok")
                    if isinstance(token, str):
                        self.token_class[token] = _s(tag["c"])
                    self.by_digest[_s(event["h"])] = tag
                self._ops[(inc, seq)] = event
        elif kind == "rem":
            self._on_remove(inc, _s(task_id), event)
        elif kind == "dead":
            if queue:
                self._on_dead(inc, seq, _s(task_id), event)
            else:
                self.foreign.add(_s(task_id))
        elif kind == "rdead":
            tag = event.get("g")
            ids = [_s(i) for i in event["ids"]] if isinstance(event["ids"], list) else []
            if isinstance(tag, dict) and "retry" in tag:
                self.retried_dead.update(ids)
                if self._late(event.get("t")):
                    for task_id in ids:
                        self.uncertain.update(self.tokens.get(task_id, set()))
            else:
                self.removed_dead.update(ids)
        elif kind == "sync":
            self._ops[(inc, seq)] = event

    def _on_ack(self, inc: str, event: Event) -> None:
        seq = int(str(event["s"]))
        if (inc, seq) in self._dead_seq:
            task_id = self._dead_seq.pop((inc, seq))
            if self._dead.get((inc, task_id), (None, False))[0] == seq:
                self._dead[(inc, task_id)] = (seq, True)
            return
        op = self._ops.pop((inc, seq), None)
        if op is None:
            return
        late = self._late(event.get("t"))
        if op["k"] == "sync":
            upto = op.get("upto")
            if not late:
                waiting = self._unsynced.pop(inc, [])
                covered = ({int(str(s)) for s in upto} if isinstance(upto, list)
                           else {s for s, _ in waiting})
                self.durable_tokens.update(t for s, t in waiting if s in covered)
                left = [(s, t) for s, t in waiting if s not in covered]
                if left:
                    self._unsynced[inc] = left
            return
        new_id = event.get("id")
        if not isinstance(new_id, str):
            return
        self._bind(inc, new_id, _s(op["h"]), op.get("g"))
        tag = op.get("g")
        if isinstance(tag, dict) and isinstance(tag.get("tok"), str) and not late:
            token = _s(tag["tok"])
            if op.get("d"):
                self.durable_tokens.add(token)
            else:
                self._unsynced.setdefault(inc, []).append((seq, token))

    def bind_unknown(self, inc: str, task_id: str, digest: bytes) -> None:
        """The model bound an add whose acknowledgement never arrived to ``task_id``."""
        tag = self.by_digest.get(digest.decode()) if self.is_queue(inc) else None
        self._bind(inc, task_id, digest.decode(), tag)

    def _bind(self, inc: str, task_id: str, digest: str, tag: object) -> None:
        if not self.is_queue(inc) or not isinstance(tag, dict):
            self.foreign.add(task_id)
            return
        tokens = self.tokens.setdefault(task_id, set())
        token = tag.get("tok")
        if isinstance(token, str):
            tokens.add(token)
        retried = tag.get("retry")
        if isinstance(retried, list):
            for old in retried:
                tokens.update(self.tokens.get(_s(old), set()))
                if old in self.foreign:
                    self.foreign.add(task_id)
            if not tokens:
                self.foreign.add(task_id)  # a retried dead task no queue enqueued

    def _lineage(self, task_id: str) -> set[str] | None:
        """The tokens of a queue-lineage id, None for a foreign or unknown one."""
        tokens = self.tokens.get(task_id)
        return tokens if tokens and task_id not in self.foreign else None

    def _on_remove(self, inc: str, task_id: str, event: Event) -> None:
        if not self.is_queue(inc):
            self.foreign.add(task_id)
            return
        seq, returned = self._dead.get((inc, task_id), (None, False))
        if seq is not None and not returned:
            self.violations.append(
                f"D-13: {inc} removed {task_id!r} from its WAL while its dead-task write had not "
                f"returned")
        tokens = self._lineage(task_id)
        if tokens is None:
            return
        self.stats.removals_judged += 1
        if not (tokens & self._ok_in.get(inc, set())) and not returned:
            self.violations.append(
                f"D-13/Q-8: {inc} removed {task_id!r} ({sorted(tokens)}) from its WAL, but it "
                f"neither ran to success nor was its dead-task write acknowledged")
        if not self._late(event.get("t")):
            self._removed.add(task_id)

    def _on_dead(self, inc: str, seq: int, task_id: str, event: Event) -> None:
        self._dead[(inc, task_id)] = (seq, False)
        self._dead_seq[(inc, seq)] = task_id
        self.stats.gave_up += 1
        tokens = self._lineage(task_id)
        if tokens is None:
            return
        task_class = _s(event["c"])
        attempts = int(str(event["n"]))
        self._judge_dead(f"{inc} dead-lettered", task_id, task_class, attempts)
        runs = self._runs.get((inc, task_id), [])
        if runs and runs[-1] != attempts:
            self.violations.append(f"{inc} dead-lettered {task_id!r} with attempts={attempts} "
                                   f"after running attempt {runs[-1]}")
        full = list(range(1, ALWAYS_FAIL_MAX_RETRIES + 2))
        if (task_class == AlwaysFail.task_name and runs and runs[0] == 1
                and sorted(set(runs)) != full):
            self.violations.append(f"{inc} ran {task_id!r} (always fails) with attempts {runs}, "
                                   f"not {full}, before it gave up")

    def _judge_dead(self, where: str, task_id: str, task_class: str, attempts: int) -> None:
        if task_class not in GIVE_UP_ATTEMPTS:
            self.violations.append(f"{where} queue task {task_id!r} as {task_class!r}: its "
                                   f"context should have loaded (Q-9)")
            return
        expected = GIVE_UP_ATTEMPTS[task_class]
        if expected is None:
            self.violations.append(f"{where} {task_id!r} of {task_class}, a task that succeeds "
                                   f"within its retries (Q-3)")
        elif attempts != expected:
            self.violations.append(f"{where} {task_id!r} of {task_class} with attempts="
                                   f"{attempts}, expected {expected} (Q-2, Q-3)")

    def _on_queue(self, inc: str, event: Event) -> None:
        kind = event["k"]
        if kind == "start":
            self.stats.starts += 1
            self.stats.replayed += int(str(event.get("n", 0)))
            return
        if kind != "run":
            return
        self.stats.runs += 1
        token = _s(event["tok"])
        task_id = event.get("id")
        if token not in self.token_class:
            self.violations.append(f"{inc} ran a task with token {token!r} that no enqueue "
                                   f"wrote (nothing invented)")
        if isinstance(task_id, str):
            tokens = self.tokens.get(task_id)
            if tokens and task_id not in self.foreign and token not in tokens:
                self.violations.append(f"{inc} ran {task_id!r} with the arguments of {token!r}, "
                                       f"but it carries {sorted(tokens)}")
            attempt = event.get("n")
            if isinstance(attempt, int):
                self._runs.setdefault((inc, task_id), []).append(attempt)
        if event["r"] == "ok":
            self.stats.ok_runs += 1
            self.ok_tokens.add(token)
            self._ok_in.setdefault(inc, set()).add(token)

    def forget(self, inc: str) -> None:
        """The incarnation is gone: what it had in flight stays in flight."""
        self._ok_in.pop(inc, None)
        self._unsynced.pop(inc, None)
        for key in [k for k in self._ops if k[0] == inc]:
            del self._ops[key]

    # ------------------------------------------------------------------ checks
    def check(self, obs: Observation, label: str) -> None:
        """After a crash: a removed queue task must have an explanation (D-13)."""
        for task_id in sorted(self._removed):
            tokens = self._lineage(task_id)
            if tokens is None or task_id in obs.pending or task_id in obs.dead:
                continue
            if tokens & self.ok_tokens or task_id in self.removed_dead | self.retried_dead:
                continue
            self.violations.append(
                f"{label}: D-13: {task_id!r} ({sorted(tokens)}) left the WAL but is not dead, "
                f"never ran to success, and no operator removed or retried it")
        for task_id, dead in obs.dead.items():
            if self._lineage(task_id) is not None:
                self._judge_dead(f"{label}: the dead-task store holds", task_id,
                                 dead.task_class, dead.attempts)
        self._removed.clear()
        self._ops.clear()
        self._dead_seq.clear()
        self._unsynced.clear()
        self._ok_in.clear()
        self.cut_at = None

    def account(self, obs: Observation, label: str) -> None:
        """After the final drain: every durable enqueue ended (ran ok, dead, or removed)."""
        lineage: dict[str, list[str]] = {}
        for task_id, tokens in self.tokens.items():
            for token in tokens:
                lineage.setdefault(token, []).append(task_id)
        for token in sorted(self.durable_tokens):
            ids = lineage.get(token, [])
            self.stats.durable_enqueues += 1
            if any(i in self.foreign for i in ids) or token in self.uncertain:
                self.stats.foreign += 1
                continue
            if (token in self.ok_tokens or any(i in obs.dead for i in ids)
                    or any(i in self.removed_dead for i in ids)):
                self.stats.accounted += 1
                continue
            self.violations.append(
                f"{label}: the durable enqueue {token!r} (ids {sorted(ids)}) was lost: it never "
                f"ran to success, is not dead, and no operator removed it")
