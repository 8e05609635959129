"""PURE: the periodic schedules' record file, one framed line per schedule (spec/format.md F-43..F-45).

Theory of operation: the file holds, for every schedule a leader has seen, the last due
time it fired (or took as its start, Q-125): ``crc ":" "fired" SP name SP due "\\n"`` on
the line frame of every record (F-2..F-4). The whole file is written anew and renamed over
the old one (F-42), so it is never appended to and a reader expects no torn tail; a line
that fails its frame or its grammar is dropped and counted, and its schedule is treated
as one no leader has seen (F-45).

This module imports nothing that does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from deferq._core.frame import BadLine, frame, unframe

SCHEDULE_NAME_BYTES_MAX: Final = 128
_NAME_CHARS: Final = frozenset(
    b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:-")
_DUE_DIGITS_MAX: Final = 12  # epoch seconds up to year 33658


def schedule_name_problem(name: object) -> str | None:
    """What is wrong with a schedule's name (F-44), or None.

    post: __return__ is not None or isinstance(name, str)
    """
    if not isinstance(name, str):
        return f"must be a str, got {type(name).__name__}"
    raw = name.encode("utf-8", "replace")
    if not 0 < len(raw) <= SCHEDULE_NAME_BYTES_MAX or not set(raw) <= _NAME_CHARS:
        return (f"{name!r} must be 1 to {SCHEDULE_NAME_BYTES_MAX} characters of "
                "A-Z a-z 0-9 _ . : -")
    return None


def encode_schedules(fired: Mapping[str, int]) -> bytes:
    """Implements F-43: the file's bytes, one line per schedule, in name order."""
    lines = []
    for name in sorted(fired):
        due = fired[name]
        assert schedule_name_problem(name) is None and 0 <= due < 10 ** _DUE_DIGITS_MAX
        lines.append(frame(b"fired %s %d" % (name.encode("ascii"), due)))
    return b"".join(lines)


def decode_schedules(data: bytes) -> tuple[dict[str, int], int]:
    """Implements F-45: (the schedules' last fired due times, the count of lines dropped)."""
    fired: dict[str, int] = {}
    dropped = 0
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()  # the newline that ends the last line
    for line in lines:
        body = unframe(line)
        parts = None if isinstance(body, BadLine) else body.split(b" ")
        if (parts is None or len(parts) != 3 or parts[0] != b"fired"
                or schedule_name_problem(parts[1].decode("ascii", "replace")) is not None
                or not (parts[2].isdigit() and 0 < len(parts[2]) <= _DUE_DIGITS_MAX)
                or (parts[2].startswith(b"0") and parts[2] != b"0")):
            dropped += 1
            continue
        fired[parts[1].decode("ascii")] = int(parts[2])
    return fired, dropped
