"""PURE: the dead-task store's record, ``dead_task`` (spec/format.md F-10..F-17).

Theory of operation: a body is ``dead_task:{id}:{json}``, the JSON one object
with exactly the ``DEAD_FIELDS`` keys in order, ASCII-escaped, its context in
canonical base64 (F-10); it is framed by frame.py's rule. Decoding is in two
steps so a reader can index lines by id without parsing JSON: ``decode_dead_line``
checks the frame and splits out the id, ``decode_dead_payload`` parses and checks
the object (F-11) against the limits of ``dead_problem`` (F-17).

Each direction has a definition and a fast path that must agree with it:
``_encode_dead_json`` and ``_decode_dead_exact`` follow the spec step by step;
``encode_dead`` and ``_decode_dead_fast`` are what runs, measured several times
cheaper, and property tests compare each pair. Decoding never raises on bad
bytes: it returns a ``BadLine`` naming the row of spec/recovery.md.

This module imports nothing that does I/O; CrossHair checks its contracts.
"""

from __future__ import annotations

import binascii
import json
from binascii import b2a_base64
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii as _json_str
from json.scanner import make_scanner
from typing import Final
from zlib import crc32

from deferq._core.b64 import canonical_base64_decode, decode_base64
from deferq._core.frame import BadLine, LineFault, frame, unframe
from deferq._core.limits import (
    BACKTRACE_FRAME_CHARS_MAX,
    BACKTRACE_FRAMES_MAX,
    CONTEXT_BYTES_MAX,
    EXCEPTION_CLASS_CHARS_MAX,
    EXCEPTION_MESSAGE_CHARS_MAX,
    INT_FIELD_MAX,
    LINE_BYTES_MAX,  # The post-condition of encode_dead names it; CrossHair reads it here.
    TASK_CLASS_BYTES_MAX,
    TASK_ID_BYTES_MAX,
)
from deferq._core.taskid import decode_id, task_id_problem, utf8_ok
from deferq._core.types import DeadTask, dead_task_of

OP_DEAD: Final = b"dead_task"
DEAD_FIELDS: Final = (
    "id",
    "task_class",
    "attempts",
    "enqueued_at",
    "failed_at",
    "exception_class",
    "exception_message",
    "backtrace",
    "context",
)


@dataclass(frozen=True, slots=True)
class DeadLine:
    """A dead-task line whose frame is valid; ``payload`` is the JSON object (F-10)."""

    task_id: str
    payload: bytes


def dead_problem(task: DeadTask) -> str | None:
    """Say which field of a dead task is outside the format's limits, or None (F-17)."""
    problem = task_id_problem(task.id)
    if problem is not None:
        return f"id {problem}"
    # Checked in this order, each message built only when its check fails: every dead task
    # read back passes through here (list and find), so the common case must stay cheap.
    if not 0 < len(task.task_class.encode("utf-8", "surrogatepass")) <= TASK_CLASS_BYTES_MAX:
        return f"task_class must be 1 to {TASK_CLASS_BYTES_MAX} bytes"
    # One encode of all text fields: Python's UTF-8 codec refuses every surrogate code point,
    # so joining strings can never turn two lone halves into something encodable.
    if not utf8_ok("\n".join((task.task_class, task.exception_class,
                                task.exception_message, *task.backtrace))):
        return "text fields must be encodable as UTF-8 (no lone surrogates)"
    if task.attempts < 0:
        return "attempts must be >= 0"
    if task.enqueued_at < 0 or task.failed_at < 0:
        return "times must be >= 0"
    # Implements F-19: what a reader with 64-bit integers holds.
    if task.attempts > INT_FIELD_MAX:
        return f"attempts must be at most {INT_FIELD_MAX}"
    if task.enqueued_at > INT_FIELD_MAX or task.failed_at > INT_FIELD_MAX:
        return f"times must be at most {INT_FIELD_MAX}"
    if len(task.exception_class) > EXCEPTION_CLASS_CHARS_MAX:
        return f"exception_class must be at most {EXCEPTION_CLASS_CHARS_MAX} characters"
    if len(task.exception_message) > EXCEPTION_MESSAGE_CHARS_MAX:
        return f"exception_message must be at most {EXCEPTION_MESSAGE_CHARS_MAX} characters"
    if len(task.backtrace) > BACKTRACE_FRAMES_MAX:
        return f"backtrace must have at most {BACKTRACE_FRAMES_MAX} frames"
    if not all(len(f) <= BACKTRACE_FRAME_CHARS_MAX for f in task.backtrace):
        return f"backtrace frames must be at most {BACKTRACE_FRAME_CHARS_MAX} characters"
    if len(task.context) > CONTEXT_BYTES_MAX:
        return f"context must be at most {CONTEXT_BYTES_MAX} bytes"
    return None


def encode_dead(task: DeadTask) -> bytes:
    """The ``dead_task`` line of a dead task (F-10). The task must be within limits.

    Builds the JSON text directly: ``encode_basestring_ascii`` is the function
    ``json.dumps(..., ensure_ascii=True)`` applies to every string, and an ``int``
    prints as it does there, so the bytes are those of ``_encode_dead_json`` (a
    property test compares the two); measured ~3x cheaper than ``json.dumps``.
    Integers that are not exactly ``int`` (``bool``, subclasses) take ``json.dumps``.

    pre: dead_problem(task) is None
    post: len(__return__) <= LINE_BYTES_MAX
    """
    attempts, enqueued_at, failed_at = task.attempts, task.enqueued_at, task.failed_at
    if type(attempts) is not int or type(enqueued_at) is not int or type(failed_at) is not int:
        return _encode_dead_json(task)
    q = _json_str
    task_id = task.id
    # The body as one text, encoded once: the JSON part is ASCII, so its UTF-8 is the
    # ASCII of F-10, and the id's is the id's UTF-8.
    body = (f'dead_task:{task_id}:{{"id":{q(task_id)},"task_class":{q(task.task_class)},'
            f'"attempts":{attempts},"enqueued_at":{enqueued_at},"failed_at":{failed_at},'
            f'"exception_class":{q(task.exception_class)},'
            f'"exception_message":{q(task.exception_message)},'
            f'"backtrace":[{",".join(map(q, task.backtrace))}],'
            f'"context":"{b2a_base64(task.context, newline=False).decode("ascii")}"}}'
            ).encode("utf-8")
    return b"%08x:%b\n" % (crc32(body), body)


def _encode_dead_json(task: DeadTask) -> bytes:
    """``encode_dead`` through ``json.dumps``: the definition of F-10's bytes."""
    payload = {
        "id": task.id,
        "task_class": task.task_class,
        "attempts": task.attempts,
        "enqueued_at": task.enqueued_at,
        "failed_at": task.failed_at,
        "exception_class": task.exception_class,
        "exception_message": task.exception_message,
        "backtrace": list(task.backtrace),
        "context": binascii.b2a_base64(task.context, newline=False).decode("ascii"),
    }
    text = json.dumps(payload, ensure_ascii=True, separators=(",", ":"))
    return frame(b"dead_task:" + task.id.encode("utf-8") + b":" + text.encode("ascii"))


def decode_dead_line(line: bytes) -> DeadLine | BadLine:
    """Check a dead-task line's frame and split out its id (F-10, R-@B..R-@D)."""
    body = unframe(line)
    if isinstance(body, BadLine):
        return body
    fields = body.split(b":", 2)
    if len(fields) != 3 or fields[0] != OP_DEAD:
        return BadLine(LineFault.BAD_BODY)
    task_id = decode_id(fields[1])
    if task_id is None:
        return BadLine(LineFault.BAD_BODY)
    return DeadLine(task_id, fields[2])


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """A JSON object hook refusing duplicate keys: F-11 wants exactly the F-10 keys."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise ValueError("duplicate key in a JSON object")
    return obj


def _natural(text: str) -> int:
    """A JSON integer as F-32 allows it: no sign (``-0`` included), so never negative."""
    if text[:1] == "-":
        raise ValueError("a signed integer in a dead-task record")
    return int(text)


# One decoder for every dead-task payload: json.loads with a hook builds a new decoder per call.
_DEAD_DECODER = json.JSONDecoder(object_pairs_hook=_unique_keys, parse_int=_natural)
# The JSON scanner behind a decoder whose objects become tuples of (key, value) pairs: a
# C builtin as the hook (no Python call per object), duplicate keys kept as they are, and
# an object told apart from an array (a list) even when empty.
_PAIRS_SCAN: Final = make_scanner(
    json.JSONDecoder(object_pairs_hook=tuple,  # type: ignore[arg-type]  # the stub wants itself
                     parse_int=_natural))


def decode_dead_payload(line: DeadLine) -> DeadTask | BadLine:
    """Decode the JSON object of a framed dead-task line (F-11, R-@G)."""
    return decode_dead_record(line.task_id, line.payload)


def decode_dead_record(task_id: str, payload: bytes) -> DeadTask | BadLine:
    """``decode_dead_payload(DeadLine(task_id, payload))`` without building the DeadLine.

    ``_decode_dead_fast`` takes the records ``encode_dead`` writes from ASCII text; it
    answers only when it is sure, and every other payload (and every one that fails)
    is decided by ``_decode_dead_exact``, so both paths give the same verdict (F-11).
    """
    task = _decode_dead_fast(task_id, payload)
    return task if task is not None else _decode_dead_exact(DeadLine(task_id, payload))


def _decode_dead_fast(line_id: str, payload: bytes) -> DeadTask | None:
    """The task ``_decode_dead_exact`` would return, or None when not sure (F-11, F-17).

    Sure means: the payload is UTF-8 that starts with ``{`` and is one JSON object
    ending at the payload's end, whose pairs have exactly the F-10 keys in order (so no
    key repeats), with F-11's types and ``id`` equal to the line's; every string is
    ASCII (``str.isascii`` is O(1): then there is no surrogate, and as many UTF-8 bytes
    as characters); the context is canonical base64; and every F-17 limit is met. The
    id is checked again (cheaply, as the ASCII string it is): a ``DeadLine`` built by
    hand need not hold a valid one. Measured per record: the JSON scan, the base64
    decode, the DeadTask and the checks here cost about 3 : 1 : 1 : 1.
    """
    if payload[:1] != b"{":
        return None
    try:
        text = payload.decode()
        obj, end = _PAIRS_SCAN(text, 0)
        ((k0, task_id), (k1, task_class), (k2, attempts), (k3, enqueued_at), (k4, failed_at),
         (k5, exc_class), (k6, exc_msg), (k7, trace), (k8, ctx)) = obj
        frames = "".join(trace)  # TypeError unless every frame is a str (JSON makes no subclass)
        # str.isascii raises AttributeError for every other JSON value (int, float, bool,
        # None, list, tuple): with these calls every text field is a str, and ASCII.
        ascii_text = (task_id.isascii() and task_class.isascii() and exc_class.isascii()
                      and exc_msg.isascii() and ctx.isascii() and frames.isascii())
    except (StopIteration, ValueError, TypeError, AttributeError, RecursionError):
        return None  # UnicodeDecodeError is a ValueError; a wrong pair count one too
    if not (ascii_text and end == len(text) and task_id == line_id
            and (k0, k1, k2, k3, k4, k5, k6, k7, k8) == DEAD_FIELDS
            and type(attempts) is int and type(enqueued_at) is int and type(failed_at) is int
            and type(trace) is list
            and 0 < len(task_id) <= TASK_ID_BYTES_MAX and ":" not in task_id
            and "\n" not in task_id and "\0" not in task_id
            and 0 < len(task_class) <= TASK_CLASS_BYTES_MAX
            and 0 <= attempts <= INT_FIELD_MAX and 0 <= enqueued_at <= INT_FIELD_MAX
            and 0 <= failed_at <= INT_FIELD_MAX
            and len(exc_class) <= EXCEPTION_CLASS_CHARS_MAX
            and len(exc_msg) <= EXCEPTION_MESSAGE_CHARS_MAX
            and len(trace) <= BACKTRACE_FRAMES_MAX
            and (len(frames) <= BACKTRACE_FRAME_CHARS_MAX
                 or max(map(len, trace)) <= BACKTRACE_FRAME_CHARS_MAX)):
        return None
    context = canonical_base64_decode(ctx.encode("ascii"))
    if context is None or len(context) > CONTEXT_BYTES_MAX:
        return None
    return dead_task_of(task_id, task_class, attempts, enqueued_at, failed_at, exc_class,
                        exc_msg, tuple(trace), context)


def _decode_dead_exact(line: DeadLine) -> DeadTask | BadLine:
    """F-11 step by step: the definition ``_decode_dead_fast`` must agree with."""
    try:
        # F-31: UTF-8 with no byte-order mark (a BOM is not JSON whitespace, so the decoder
        # refuses it); surrogates are passed on and then refused by dead_problem's UTF-8
        # check or the base64 check (F-33). A line that reaches here holds no NUL (R-@K).
        obj: object = _DEAD_DECODER.decode(line.payload.decode("utf-8", "surrogatepass"))
    except (ValueError, RecursionError):  # deeply nested JSON raises RecursionError
        return BadLine(LineFault.BAD_DEAD_PAYLOAD)
    if not isinstance(obj, dict) or tuple(obj) != DEAD_FIELDS:
        return BadLine(LineFault.BAD_DEAD_PAYLOAD)
    task_id, task_class, attempts, enqueued_at, failed_at, exc_class, exc_msg, trace, ctx = (
        obj[name] for name in DEAD_FIELDS)
    if not (
        all(isinstance(v, str) for v in (task_id, task_class, exc_class, exc_msg, ctx))
        and all(type(v) is int for v in (attempts, enqueued_at, failed_at))
        and isinstance(trace, list) and all(isinstance(f, str) for f in trace)
        and task_id == line.task_id
    ):
        return BadLine(LineFault.BAD_DEAD_PAYLOAD)
    context = decode_base64(str(ctx).encode("ascii", "replace"))
    if context is None:
        return BadLine(LineFault.BAD_DEAD_PAYLOAD)
    task = DeadTask(
        id=line.task_id,
        task_class=task_class,
        attempts=attempts,
        enqueued_at=enqueued_at,
        failed_at=failed_at,
        exception_class=exc_class,
        exception_message=exc_msg,
        backtrace=tuple(trace),
        context=context,
    )
    return BadLine(LineFault.BAD_DEAD_PAYLOAD) if dead_problem(task) is not None else task

