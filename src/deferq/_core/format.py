"""PURE: the record codec and file names of spec/format.md.

Theory of operation: every record is one line, ``crc ":" body "\\n"``, where
``crc`` is eight lowercase hex digits of CRC-32/ISO-HDLC (``zlib.crc32``) over
the body bytes (F-3). Bodies are ASCII except task ids, which are UTF-8 and can
contain no ``:``, newline or NUL (F-5), so a body never contains a newline and
the line is self-delimiting. Decoding never raises on bad bytes: it returns a
``BadLine`` whose ``fault`` names the row of the recovery table (spec/recovery.md).

This module imports nothing that does I/O; CrossHair checks its contracts.
"""

from __future__ import annotations

import binascii
import enum
import json
import zlib
from binascii import a2b_base64, b2a_base64
from json.encoder import encode_basestring_ascii as _json_str
from json.scanner import make_scanner
from zlib import crc32
from dataclasses import dataclass
from typing import Final

from deferq._core.limits import (
    BACKTRACE_FRAME_CHARS_MAX,
    BACKTRACE_FRAMES_MAX,
    CONTEXT_BYTES_MAX,
    DEAD_STORAGE_VERSION,
    EXCEPTION_CLASS_CHARS_MAX,
    EXCEPTION_MESSAGE_CHARS_MAX,
    LINE_BYTES_MAX,
    TASK_CLASS_BYTES_MAX,
    TASK_ID_BYTES_MAX,
    WAL_STORAGE_VERSION,
)
from deferq._core.types import DeadTask, dead_task_of

CRC_HEX_BYTES: Final = 8
HEADER_BYTES: Final = CRC_HEX_BYTES + 1  # the CRC and the ':' after it
OP_ADD: Final = b"add"
OP_REM: Final = b"rem"
OP_DEAD: Final = b"dead_task"
NO_PUBLISH_AT: Final = b"0"
_NO_PUBLISH_AT_FIELD: Final = b":" + NO_PUBLISH_AT + b":"
SEED_DIGITS_MAX: Final = 12
_HEX_DIGITS: Final = frozenset(b"0123456789abcdef")
_FORBIDDEN_ID_CHARS: Final = (":", "\n", "\x00")
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


class LineFault(enum.Enum):
    """Why a line is not a valid record: the rows of spec/recovery.md."""

    CRC_MISMATCH = "R-@C"
    BAD_HEADER = "R-@B"
    BAD_BODY = "R-@D"
    OVERLONG = "R-@E"
    TORN_TAIL = "R-@F"
    BAD_DEAD_PAYLOAD = "R-@G"
    NUL_HOLE = "R-@K"


@dataclass(frozen=True, slots=True)
class BadLine:
    """A line that is not a valid record, and why."""

    fault: LineFault


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


@dataclass(frozen=True, slots=True)
class DeadLine:
    """A dead-task line whose frame is valid; ``payload`` is the JSON object (F-10)."""

    task_id: str
    payload: bytes


# ----------------------------------------------------------------------------- validation


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
    if not _utf8_ok(task_id):
        return "must be encodable as UTF-8 (no lone surrogates)"
    if len(task_id.encode("utf-8")) > TASK_ID_BYTES_MAX:
        return f"must be at most {TASK_ID_BYTES_MAX} bytes in UTF-8"
    return None


def _safe_id_chars(text: str) -> bool:
    """A valid id can be framed: no separator, newline or NUL, UTF-8, within the size limit."""
    return (":" not in text and chr(10) not in text and chr(0) not in text and _utf8_ok(text)
            and 0 < len(text.encode("utf-8")) <= TASK_ID_BYTES_MAX)


def _utf8_ok(text: str) -> bool:
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
    """The leading integer of a task id, before its first '-', or 0 (W-5, F-10).

    Only a run of 1 to SEED_DIGITS_MAX ASCII digits counts, so a caller's id
    like ``99999999999999999999-x`` cannot push generated ids absurdly far.

    post: 0 <= __return__ < 10 ** SEED_DIGITS_MAX
    """
    head = task_id.split("-", 1)[0]
    if 0 < len(head) <= SEED_DIGITS_MAX and head.isascii() and head.isdigit():
        return int(head)
    return 0


# ----------------------------------------------------------------------------- framing


def crc_hex(body: bytes) -> bytes:
    """The eight lowercase hex digits of CRC-32/ISO-HDLC over ``body`` (F-3).

    post: len(__return__) == CRC_HEX_BYTES
    """
    return b"%08x" % zlib.crc32(body)


def frame(body: bytes) -> bytes:
    """Turn a body into a complete line (F-2).

    pre: bytes([10]) not in body
    post: __return__.endswith(bytes([10])) and __return__.count(bytes([10])) == 1
    """
    return crc_hex(body) + b":" + body + b"\n"


def unframe(line: bytes) -> bytes | BadLine:
    """Check a line's frame (without its newline) and return its body (F-4, R-@B, R-@C).

    post: isinstance(__return__, BadLine) or frame(__return__) == line + bytes([10])
    """
    if len(line) < HEADER_BYTES or line[CRC_HEX_BYTES] != 0x3A:
        return BadLine(LineFault.BAD_HEADER)
    head = line[:CRC_HEX_BYTES]
    body = line[HEADER_BYTES:]
    if crc_hex(body) != head:
        # Slow path only for damage: a matching CRC already proves the header is hex.
        if not all(byte in _HEX_DIGITS for byte in head):
            return BadLine(LineFault.BAD_HEADER)
        return BadLine(LineFault.CRC_MISMATCH)
    if b"\n" in body:
        return BadLine(LineFault.BAD_BODY)
    return body


# ----------------------------------------------------------------------------- WAL records


def encode_add(task_id: str, publish_at: int | None, context: bytes) -> bytes:
    """The ``add`` line of a pending task (F-6). Arguments must be valid.

    pre: task_id_problem(task_id) is None
    pre: publish_at is None or publish_at > 0
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


def decode_wal_line(line: bytes) -> WalAdd | WalRem | BadLine:
    """Decode one WAL line without its newline (F-6, F-7, R-@A..R-@D)."""
    body = unframe(line)
    if isinstance(body, BadLine):
        return body
    op, sep, rest = body.partition(b":")
    if not sep:
        return BadLine(LineFault.BAD_BODY)
    if op == OP_REM:
        task_id = _decode_id(rest)
        return BadLine(LineFault.BAD_BODY) if task_id is None else WalRem(task_id)
    if op != OP_ADD:
        return BadLine(LineFault.BAD_BODY)
    fields = rest.split(b":", 2)
    if len(fields) != 3:
        return BadLine(LineFault.BAD_BODY)
    raw_id, raw_when, payload = fields
    task_id = _decode_id(raw_id)
    publish_at = _decode_publish_at(raw_when)
    context = _decode_base64(payload)
    if task_id is None or publish_at is False or context is None:
        return BadLine(LineFault.BAD_BODY)
    return WalAdd(task_id, publish_at, context)


def _decode_id(raw: bytes) -> str | None:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text if task_id_problem(text) is None else None


def _decode_publish_at(raw: bytes) -> int | None | bool:
    """``None`` for "0", the integer for a canonical positive decimal, else False."""
    if raw == NO_PUBLISH_AT:
        return None
    if not raw or not raw.isdigit() or raw[0] == 0x30 or len(raw) > 20:
        return False
    return int(raw)


_B64_ALPHABET: Final = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_B64_BEFORE_ONE_PAD: Final = frozenset(b"AEIMQUYcgkosw048")  # sextets whose low 2 bits are 0
_B64_BEFORE_TWO_PADS: Final = frozenset(b"AQgw")  # sextets whose low 4 bits are 0


def canonical_base64(raw: bytes) -> bool:
    """Whether ``raw`` is the canonical padded base64 of some bytes (F-6), without decoding it.

    The replay fast path's check: the same verdict as ``_decode_base64``, which
    decodes and re-encodes. Canonical means: whole quanta of the standard
    alphabet, ``=`` only as the last one or two characters, and zero padding bits.

    post: __return__ == (_decode_base64(raw) is not None)
    """
    if len(raw) % 4:
        return False
    rest = raw.translate(None, _B64_ALPHABET)
    if not rest:
        return True
    if rest == b"=":
        return raw[-1] == 0x3D and raw[-2] in _B64_BEFORE_ONE_PAD
    if rest == b"==":
        return raw[-2:] == b"==" and raw[-3] in _B64_BEFORE_TWO_PADS
    return False


def raw_id_ok(raw: bytes) -> bool:
    """Whether ``raw`` is the UTF-8 of a valid task id (F-5), the verdict of ``_decode_id``.

    post: __return__ == (_decode_id(raw) is not None)
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


def _decode_base64(raw: bytes) -> bytes | None:
    try:
        data = binascii.a2b_base64(raw, strict_mode=True)
    except binascii.Error:
        return None
    # strict_mode still accepts some non-canonical padding bits; F-6 requires canonical form.
    return data if binascii.b2a_base64(data, newline=False) == raw else None


# ----------------------------------------------------------------------------- dead-task records


def dead_problem(task: DeadTask) -> str | None:
    """Say which field of a dead task is outside the format's limits, or None (F-12)."""
    problem = task_id_problem(task.id)
    if problem is not None:
        return f"id {problem}"
    # Checked in this order, each message built only when its check fails: every dead task
    # read back passes through here (list and find), so the common case must stay cheap.
    if not 0 < len(task.task_class.encode("utf-8", "surrogatepass")) <= TASK_CLASS_BYTES_MAX:
        return f"task_class must be 1 to {TASK_CLASS_BYTES_MAX} bytes"
    # One encode of all text fields: Python's UTF-8 codec refuses every surrogate code point,
    # so joining strings can never turn two lone halves into something encodable.
    if not _utf8_ok("\n".join((task.task_class, task.exception_class,
                                task.exception_message, *task.backtrace))):
        return "text fields must be encodable as UTF-8 (no lone surrogates)"
    if task.attempts < 0:
        return "attempts must be >= 0"
    if task.enqueued_at < 0 or task.failed_at < 0:
        return "times must be >= 0"
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
    task_id = _decode_id(fields[1])
    if task_id is None:
        return BadLine(LineFault.BAD_BODY)
    return DeadLine(task_id, fields[2])


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """A JSON object hook refusing duplicate keys: F-11 wants exactly the F-10 keys."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise ValueError("duplicate key in a JSON object")
    return obj


# One decoder for every dead-task payload: json.loads with a hook builds a new decoder per call.
_DEAD_DECODER = json.JSONDecoder(object_pairs_hook=_unique_keys)
# The JSON scanner behind a decoder whose objects become tuples of (key, value) pairs: a
# C builtin as the hook (no Python call per object), duplicate keys kept as they are, and
# an object told apart from an array (a list) even when empty.
_PAIRS_SCAN: Final = make_scanner(
    json.JSONDecoder(object_pairs_hook=tuple))  # type: ignore[arg-type]  # the stub wants itself


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


def _canonical_base64_decode(raw: bytes) -> bytes | None:
    """``_decode_base64(raw)`` without re-encoding: strict decoding refuses every
    non-canonical form but a length that is not a multiple of 4 and non-zero padding
    bits, which are checked here (F-6).

    post: __return__ == _decode_base64(raw)
    """
    if len(raw) % 4:
        return None
    try:
        data = a2b_base64(raw, strict_mode=True)
    except binascii.Error:
        return None
    if raw[-1:] == b"=":
        if raw[-2:] == b"==":
            if raw[-3] not in _B64_BEFORE_TWO_PADS:
                return None
        elif raw[-2] not in _B64_BEFORE_ONE_PAD:
            return None
    return data


def _decode_dead_fast(line_id: str, payload: bytes) -> DeadTask | None:
    """The task ``_decode_dead_exact`` would return, or None when not sure (F-11, F-12).

    Sure means: the payload is UTF-8 that starts with ``{`` and is one JSON object
    ending at the payload's end, whose pairs have exactly the F-10 keys in order (so no
    key repeats), with F-11's types and ``id`` equal to the line's; every string is
    ASCII (``str.isascii`` is O(1): then there is no surrogate, and as many UTF-8 bytes
    as characters); the context is canonical base64; and every F-12 limit is met. The
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
            and attempts >= 0 and enqueued_at >= 0 and failed_at >= 0
            and len(exc_class) <= EXCEPTION_CLASS_CHARS_MAX
            and len(exc_msg) <= EXCEPTION_MESSAGE_CHARS_MAX
            and len(trace) <= BACKTRACE_FRAMES_MAX
            and (len(frames) <= BACKTRACE_FRAME_CHARS_MAX
                 or max(map(len, trace)) <= BACKTRACE_FRAME_CHARS_MAX)):
        return None
    context = _canonical_base64_decode(ctx.encode("ascii"))
    if context is None or len(context) > CONTEXT_BYTES_MAX:
        return None
    return dead_task_of(task_id, task_class, attempts, enqueued_at, failed_at, exc_class,
                        exc_msg, tuple(trace), context)


def _decode_dead_exact(line: DeadLine) -> DeadTask | BadLine:
    """F-11 step by step: the definition ``_decode_dead_fast`` must agree with."""
    try:
        # Exactly what json.loads does with bytes that start with "{" or a UTF-8 BOM (a line that
        # reaches here holds no NUL, R-@K): UTF-8, BOM dropped, surrogates passed on (and then
        # refused by dead_problem's UTF-8 check or the base64 check).
        obj: object = _DEAD_DECODER.decode(line.payload.decode("utf-8-sig", "surrogatepass"))
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
    context = _decode_base64(str(ctx).encode("ascii", "replace"))
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


# ----------------------------------------------------------------------------- file names


def wal_glob_prefix(prefix: str) -> str:
    """Every WAL file name of ``prefix`` starts with this (F-1)."""
    return f"{prefix}{WAL_STORAGE_VERSION}-"


def to_base36(number: int) -> str:
    """Lowercase base 36 without padding (F-1).

    pre: number >= 0
    post: int(__return__, 36) == number
    """
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    text = ""
    while True:
        number, rest = divmod(number, 36)
        text = digits[rest] + text
        if number == 0:
            return text


def wal_file_name(prefix: str, date_yyyymmdd: str, pid: int, rand_u32: int) -> str:
    """``{prefix}{version}-{YYYYMMDD}-{pid}-{rand base36}`` (F-1).

    pre: len(date_yyyymmdd) == 8 and date_yyyymmdd.isascii() and date_yyyymmdd.isdigit()
    pre: 0 <= pid < 10 ** 10 and 0 <= rand_u32 < 2 ** 32
    post: is_wal_file_name(prefix, __return__)
    """
    return f"{wal_glob_prefix(prefix)}{date_yyyymmdd}-{pid}-{to_base36(rand_u32)}"


def is_wal_file_name(prefix: str, name: str) -> bool:
    """Whether ``name`` is a WAL file of ``prefix`` (F-1): exactly the pattern, nothing looser."""
    start = wal_glob_prefix(prefix)
    if not name.startswith(start):
        return False
    parts = name[len(start):].split("-")
    if len(parts) != 3:
        return False
    date, pid, rand = parts
    return (
        len(date) == 8 and date.isascii() and date.isdigit()
        and 0 < len(pid) <= 10 and pid.isascii() and pid.isdigit()
        and 0 < len(rand) <= 7 and all(c in "0123456789abcdefghijklmnopqrstuvwxyz" for c in rand)
        and int(rand, 36) < 2 ** 32
    )


def dead_data_name(prefix: str) -> str:
    """The dead-task store's data file (F-9)."""
    return f"{prefix}dead_tasks-{DEAD_STORAGE_VERSION}"


def dead_lock_name(prefix: str) -> str:
    """The dead-task store's lock file, never renamed or unlinked (F-9)."""
    return f"{prefix}dead_tasks.lock"


def dead_tmp_name(prefix: str) -> str:
    """The dead-task store's compaction staging file (F-9)."""
    return f"{dead_data_name(prefix)}.tmp"
