"""PURE: what a valid task id is (spec/format.md F-5), and the seed in its head (W-28).

Theory of operation: a task id is a non-empty ``str`` whose UTF-8 is at most
``TASK_ID_BYTES_MAX`` bytes and holds no ``:``, newline or NUL, so it can sit in
a record body between ``:`` separators and never break the line frame. The
checks come in three shapes for three callers: ``task_id_problem`` and
``check_task_id`` for ids a caller hands in (a message, or ``ValueError``),
``decode_id`` for the bytes of a record (None when not valid), and ``raw_id_ok``,
the same verdict as ``decode_id`` without building the string, for the replay
fast path.

This module imports nothing that does I/O; CrossHair checks its contracts.
"""

from __future__ import annotations

from typing import Final

from deferq._core.limits import INT_FIELD_MAX, SEED_CALLER_MAX, TASK_ID_BYTES_MAX

# Every seed up to INT_FIELD_MAX (19 digits) counts, so a generated seed, however far a
# caller's id pushed it (at most to SEED_CALLER_MAX + 1, C-24), is read back (W-28).
SEED_DIGITS_MAX: Final = 19
_FORBIDDEN_ID_CHARS: Final = (":", "\n", "\x00")


def task_id_problem(task_id: object) -> str | None:
    """Say what is wrong with a task id, or return None when it is valid (F-5).

    post: __return__ is not None or (isinstance(task_id, str) and _safe_id_chars(task_id))
    """
    if not isinstance(task_id, str):
        return f"must be a str, not {type(task_id).__name__}"
    if not task_id:
        return "must not be empty"
    for char in _FORBIDDEN_ID_CHARS:
        if char in task_id:
            return f"must not contain {char!r}"
    if not utf8_ok(task_id):
        return "must be encodable as UTF-8 (no lone surrogates)"
    if len(task_id.encode("utf-8")) > TASK_ID_BYTES_MAX:
        return f"must be at most {TASK_ID_BYTES_MAX} bytes in UTF-8"
    return None


def _safe_id_chars(text: str) -> bool:
    """A valid id can be framed: no separator, newline or NUL, UTF-8, within the size limit."""
    return (":" not in text and chr(10) not in text and chr(0) not in text and utf8_ok(text)
            and 0 < len(text.encode("utf-8")) <= TASK_ID_BYTES_MAX)


def utf8_ok(text: str) -> bool:
    """Whether ``text`` is encodable as UTF-8: Python strings can hold lone surrogates."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_task_id(task_id: object, *, argument: str = "task_id") -> str:
    """Return ``task_id`` if it is valid, else raise ``ValueError`` naming the problem."""
    problem = task_id_problem(task_id)
    if problem is not None:
        raise ValueError(f"invalid {argument} {task_id!r}: it {problem}")
    assert isinstance(task_id, str)
    return task_id


def id_seed(task_id: str) -> int:
    """The leading integer of a task id, before its first '-', or 0 (W-28, F-51).

    Only a run of 1 to SEED_DIGITS_MAX ASCII digits whose value is at most
    INT_FIELD_MAX counts, what a reader with 64-bit integers parses (F-19).

    post: 0 <= __return__ <= INT_FIELD_MAX
    """
    head = task_id.split("-", 1)[0]
    if 0 < len(head) <= SEED_DIGITS_MAX and head.isascii() and head.isdigit():
        seed = int(head)
        return seed if seed <= INT_FIELD_MAX else 0
    return 0


def caller_id_problem(task_id: str) -> str | None:
    """Say why a valid id a caller gives must not be stored, or None (C-24).

    Its seed must be at most SEED_CALLER_MAX, so that the seeds generated after it
    stay within what ``id_seed`` reads back (W-28). Cheap for usual ids: a head of
    at most 18 characters cannot hold a seed that large.

    post: __return__ is None or id_seed(task_id) > SEED_CALLER_MAX
    """
    dash = task_id.find("-")
    if (len(task_id) if dash < 0 else dash) < 19 or id_seed(task_id) <= SEED_CALLER_MAX:
        return None
    return (f"has the seed {id_seed(task_id)} (its leading integer); a caller's id may "
            f"carry at most {SEED_CALLER_MAX} (2**62), so that generated ids never repeat")


def decode_id(raw: bytes) -> str | None:
    """The task id whose UTF-8 is ``raw``, or None when ``raw`` is not a valid one (F-5)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text if task_id_problem(text) is None else None


def raw_id_ok(raw: bytes) -> bool:
    """Whether ``raw`` is the UTF-8 of a valid task id (F-5), the verdict of ``decode_id``.

    post: __return__ == (decode_id(raw) is not None)
    """
    if not 0 < len(raw) <= TASK_ID_BYTES_MAX or b":" in raw or b"\n" in raw or b"\0" in raw:
        return False
    if raw.isascii():
        return True
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
