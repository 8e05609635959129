"""The optional fields of the task context record, after ``attempts`` (spec/queue.md Q-53, Q-65, Q-66).

Rules: the fields come in one fixed order, ``key`` (Q-53), ``enqueued_at`` (Q-65), then
``meta`` (Q-66), and
each is written only when the task has it, so a record without them keeps the exact bytes
of the previous record version (Q-5). Reading checks each one and raises ``ContextError``
naming the field; a record of the previous version (none of them) reads as "not known".
Kept apart from serialize.py so that the record's core stays one module of one job.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, NamedTuple

from deferq._core.ctxmeta import meta_problem
from deferq._core.limits import INT_FIELD_MAX
from deferq._runtime.errors import ContextError

OPTIONAL_KEYS: Final = ("key", "enqueued_at", "meta")


class Extras(NamedTuple):
    """The optional fields of one record; None where the record has none."""

    key: str | None = None
    enqueued_at: int | None = None
    meta: dict[str, str] | None = None


def check_meta(meta: object) -> dict[str, str] | None:
    """A task's metadata as the record stores it: a copy, None when empty; raise ``ValueError``
    naming what is wrong, before anything is stored (Q-66)."""
    if meta is None:
        return None
    copy = dict(meta) if isinstance(meta, Mapping) else meta
    problem = meta_problem(copy)
    if problem is not None:
        raise ValueError(f"meta {problem}")
    assert isinstance(copy, dict)
    return copy or None


def put_extras(record: dict[str, object], key: str | None, enqueued_at: int | None,
               meta: dict[str, str] | None = None) -> None:
    """Append the optional fields the task has to ``record``, in their fixed order."""
    if key is not None:
        record["key"] = key
    if enqueued_at is not None:
        record["enqueued_at"] = enqueued_at
    if meta is not None:
        record["meta"] = meta


def read_extras(record: dict[str, object]) -> Extras:
    """The optional fields of a decoded record, checked; raise ContextError naming one."""
    key = record.get("key")
    if "key" in record and (not isinstance(key, str) or not key):
        raise ContextError(f"context field 'key' is {key!r}, not a non-empty str")
    enqueued_at = record.get("enqueued_at")
    if "enqueued_at" in record and not enqueued_at_ok(enqueued_at):
        raise ContextError(f"context field 'enqueued_at' is {enqueued_at!r}, not an int in "
                           f"[0, {INT_FIELD_MAX}]")
    meta = record.get("meta")
    if "meta" in record:
        problem = meta_problem(meta)
        if problem is not None:
            raise ContextError(f"context field 'meta' {problem}")
    assert key is None or isinstance(key, str)
    assert enqueued_at is None or isinstance(enqueued_at, int)
    assert meta is None or isinstance(meta, dict)
    return Extras(key, enqueued_at, meta)


def enqueued_at_ok(value: object) -> bool:
    """Whether ``value`` is an epoch second a record can hold (Q-65)."""
    return type(value) is int and 0 <= value <= INT_FIELD_MAX


def enqueue_time(now: float) -> int | None:
    """The epoch second a task enqueued at ``now`` records (Q-65), or None for a clock that
    gives no such second (before the epoch, or past what the format holds)."""
    # One expression, no call: this runs on every enqueue. ``int`` of a number in
    # [0, INT_FIELD_MAX] is an int in that range, which is what ``enqueued_at_ok`` checks.
    return int(now) if 0 <= now <= INT_FIELD_MAX else None


def pickled_extras(key: str | None, enqueued_at: int | None,
                   meta: dict[str, str] | None = None) -> tuple[object, ...]:
    """The elements a pickled record (Q-18) carries after ``attempts``: none, ``(key,)``
    (Q-53), ``(key or None, enqueued_at)`` once the task has an enqueue time (Q-65), and
    ``(key or None, enqueued_at or None, meta)`` once it has metadata (Q-66)."""
    if meta is not None:
        return (key, enqueued_at, meta)
    if enqueued_at is not None:
        return (key, enqueued_at)
    return () if key is None else (key,)


def unpickled_extras(rest: tuple[object, ...]) -> Extras | None:
    """The optional fields of a pickled record's elements after ``attempts``, or None when
    they are not a shape ``pickled_extras`` writes."""
    if not rest:
        return Extras()
    key = rest[0]
    if not (key is None and len(rest) > 1 or isinstance(key, str) and key):
        return None
    assert key is None or isinstance(key, str)
    if len(rest) == 1:
        return Extras(key)
    enqueued_at = rest[1]
    if len(rest) > 3 or not (enqueued_at_ok(enqueued_at) or len(rest) == 3 and enqueued_at is None):
        return None
    assert enqueued_at is None or isinstance(enqueued_at, int)
    if len(rest) == 2:
        return Extras(key, enqueued_at)
    meta = rest[2]
    if meta_problem(meta) is not None:
        return None
    assert isinstance(meta, dict)
    return Extras(key, enqueued_at, meta)
