"""PURE: the WAL's records, ``add`` and ``rem`` (spec/format.md F-6, F-7).

Theory of operation: an ``add`` body is ``add:{id}:{publish_at}:{base64 context}``
with ``publish_at`` a canonical positive decimal or ``0`` for "now"; a ``rem``
body is ``rem:{id}``. Each body is framed by frame.py's rule. Encoding takes
valid fields (the contracts say so) and is on the hot path of every enqueue, so
it builds the line in one expression; decoding never raises on bad bytes: it
returns a ``BadLine`` naming the row of spec/recovery.md.

This module imports nothing that does I/O; CrossHair checks its contracts.
"""

from __future__ import annotations

from binascii import b2a_base64
from dataclasses import dataclass
from typing import Final
from zlib import crc32

from deferq._core.b64 import decode_base64
from deferq._core.frame import BadLine, LineFault, unframe
from deferq._core.limits import INT_FIELD_MAX
# The pre-conditions of the encoders name task_id_problem; CrossHair reads it here.
from deferq._core.taskid import decode_id, task_id_problem

OP_ADD: Final = b"add"
OP_REM: Final = b"rem"
NO_PUBLISH_AT: Final = b"0"
_NO_PUBLISH_AT_FIELD: Final = b":" + NO_PUBLISH_AT + b":"


@dataclass(frozen=True, slots=True)
class WalAdd:
    """A decoded ``add`` record (F-6)."""

    task_id: str
    publish_at: int | None
    context: bytes


@dataclass(frozen=True, slots=True)
class WalRem:
    """A decoded ``rem`` record (F-7)."""

    task_id: str


def encode_add(task_id: str, publish_at: int | None, context: bytes) -> bytes:
    """The ``add`` line of a pending task (F-6). Arguments must be valid.

    pre: task_id_problem(task_id) is None
    pre: publish_at is None or 0 < publish_at <= INT_FIELD_MAX
    post: decode_wal_line(__return__[:-1]) == WalAdd(task_id, publish_at, context)
    """
    # The same bytes as frame(); concatenation measured faster than %-formatting the body
    # (the hot path of every enqueue).
    body = (b"add:" + task_id.encode()
            + (_NO_PUBLISH_AT_FIELD if publish_at is None else b":%d:" % publish_at)
            + b2a_base64(context, newline=False))
    return b"%08x:%b\n" % (crc32(body), body)


def encode_rem(task_id: str) -> bytes:
    """The ``rem`` line that removes a task (F-7).

    pre: task_id_problem(task_id) is None
    post: decode_wal_line(__return__[:-1]) == WalRem(task_id)
    """
    body = b"rem:" + task_id.encode()
    return b"%08x:%b\n" % (crc32(body), body)


def encode_rems(task_ids: list[str]) -> bytes:
    """The ``rem`` lines of ``task_ids``, in order, as one string of bytes (W-79).

    pre: all(task_id_problem(t) is None for t in task_ids)
    post: __return__ == b"".join(encode_rem(t) for t in task_ids)
    """
    # One call for a batch of removals: encode_rem's framing, inlined in the loop.
    lines = []
    for task_id in task_ids:
        body = b"rem:" + task_id.encode()
        lines.append(b"%08x:%b\n" % (crc32(body), body))
    return b"".join(lines)


def decode_wal_line(line: bytes) -> WalAdd | WalRem | BadLine:
    """Decode one WAL line without its newline (F-6, F-7, R-@A..R-@D)."""
    body = unframe(line)
    if isinstance(body, BadLine):
        return body
    op, sep, rest = body.partition(b":")
    if not sep:
        return BadLine(LineFault.BAD_BODY)
    if op == OP_REM:
        task_id = decode_id(rest)
        return BadLine(LineFault.BAD_BODY) if task_id is None else WalRem(task_id)
    if op != OP_ADD:
        return BadLine(LineFault.BAD_BODY)
    fields = rest.split(b":", 2)
    if len(fields) != 3:
        return BadLine(LineFault.BAD_BODY)
    raw_id, raw_when, payload = fields
    task_id = decode_id(raw_id)
    publish_at = _decode_publish_at(raw_when)
    context = decode_base64(payload)
    if task_id is None or publish_at is False or context is None:
        return BadLine(LineFault.BAD_BODY)
    return WalAdd(task_id, publish_at, context)


def _decode_publish_at(raw: bytes) -> int | None | bool:
    """``None`` for "0", the integer for a canonical positive decimal, else False.

    Implements F-19: a time above 2**63 - 1 is a body that does not parse (R-@D).
    """
    if raw == NO_PUBLISH_AT:
        return None
    if not raw or not raw.isdigit() or raw[0] == 0x30 or len(raw) > 20:
        return False
    value = int(raw)
    return value if value <= INT_FIELD_MAX else False
