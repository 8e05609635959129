"""DeadWrites: when each dead-store write of a run was in progress, per task id.

Rules. Two processes' dead-store writes to one id whose calls overlapped in time may
have taken the store's lock in either order, whatever order their events reached the
harness in (D-11). So a recovered dead task that the model rejects is still allowed
when it is the result of one acknowledged write whose call overlapped another's.
A write cut off by a crash may have taken the lock at any moment after it was issued:
it counts as returning at infinity. Every issue, acknowledgement and failure of a
dead-store write is also noted as a line per id, printed with a dead-store violation
so that one sighting in a long soak can be analysed.

Theory of operation: ``Ledger`` reports each dead-store event here and asks
``reordered`` when it judges a recovered state; after each check everything is
cleared, since the recovered state becomes the known starting point.
"""

from __future__ import annotations

import math

from deferq._core.model import ABSENT, Dead, Outcome
from deferq.powertest._workers import Event


def _str(value: object) -> str:
    assert isinstance(value, str), value
    return value


def _result_of(kind: str, fields: Event) -> Outcome:
    """What a dead-store write leaves for each of its ids: removed, or the dead task."""
    if kind == "rdead":
        return ABSENT
    return Dead(_str(fields["h"]).encode(), _str(fields["c"]), int(str(fields["n"])),
                _str(fields["m"]))


def _ids_of(fields: Event) -> list[object]:
    ids = fields.get("ids") or [fields["id"]]
    assert isinstance(ids, list)
    return ids


class DeadWrites:
    """The dead-store writes since the last check: their time spans and a trace per id."""

    def __init__(self) -> None:
        # id -> (issued at, returned at, result) of acknowledged dead-store writes (and of
        # writes in flight at the crash, returned at infinity).
        self._spans: dict[str, list[tuple[float, float, Outcome]]] = {}
        # id -> the dead-store events of that id since the last check.
        self._trace: dict[str, list[str]] = {}

    def note(self, inc: str, event: Event, kind: str, issued: Event | None = None) -> None:
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
            self._trace.setdefault(str(task_id), []).append(line)

    def acked(self, inc: str, event: Event, kind: str, issued: Event) -> None:
        """An acknowledged write: note it, and keep its span when both ends carry a time."""
        self.note(inc, event, kind, issued)
        issued_at, returned_at = issued.get("t"), event.get("t")
        if isinstance(issued_at, float) and isinstance(returned_at, float):
            result = _result_of(kind, issued)
            for task_id in _ids_of(issued):
                self._spans.setdefault(_str(task_id), []).append(
                    (issued_at, returned_at, result))

    def in_flight(self, kind: str, fields: Event) -> None:
        """An operation cut off by a crash: a dead-store write's span is open-ended."""
        issued_at = fields.get("t")
        if kind not in ("dead", "rdead") or not isinstance(issued_at, float):
            return
        result = _result_of(kind, fields)
        for task_id in _ids_of(fields):
            self._spans.setdefault(_str(task_id), []).append((issued_at, math.inf, result))
            self._trace.setdefault(_str(task_id), []).append(
                f"{kind} issued at t={issued_at} was in flight at a crash")

    def reordered(self, task_id: str, observed: Outcome) -> bool:
        """Whether ``observed`` is the result of an acknowledged dead-store write whose call
        overlapped in time with another acknowledged write of the same id (either may have
        taken the store's lock last, D-11)."""
        spans = self._spans.get(task_id, [])
        return any(result == observed and issued < other_returned and other_issued < returned
                   for i, (issued, returned, result) in enumerate(spans)
                   for j, (other_issued, other_returned, _) in enumerate(spans) if i != j)

    def trace(self, task_id: str) -> list[str]:
        """The dead-store events of ``task_id`` since the last check."""
        return self._trace.get(task_id, ["(none since the last check)"])

    def clear(self) -> None:
        """A check adopted the recovered state: start afresh."""
        self._spans.clear()
        self._trace.clear()
