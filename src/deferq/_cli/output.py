"""How the operator commands write what they found: JSON for programs, tables for people
(spec/queue.md Q-26..Q-28).

Rules:
- ``--json`` prints exactly one JSON document on standard output, whatever happens: the
  command's result, or ``{"error": ..., "status": ...}`` when it fails (Q-26). Text is
  written as it is stored (``ensure_ascii=False``; a lone surrogate becomes ``\\udxxx``,
  which JSON can carry); a context is written so that its exact bytes can be had back
  (Q-27): ``{"encoding": "json", "json": VALUE, "bytes": N}`` when it is UTF-8 JSON whose
  canonical dump gives back those bytes (every context the queue writes), else
  ``{"encoding": "base64", "base64": ..., "bytes": N}``.
- Text for people escapes every character of stored data that could act on a terminal:
  C0 and C1 controls, DEL and the bidirectional formatting characters are shown as
  ``\\xNN`` / ``\\uNNNN`` (Q-28). Times are UTC ISO-8601 (``2026-12-04T16:48:07Z``).
- Tables have a header and columns aligned on the widest cell; the last column is not
  padded.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import json
import re
import sys
from collections.abc import Sequence
from typing import Final

from deferq._core.types import DeadTask

# Characters of stored data that a terminal may act on: C0 controls (tab and newline
# included: a value never spans cells or lines), DEL, C1 controls, and the Unicode
# bidirectional formatting characters that can reorder what is displayed.
# Lone surrogates (stored text may hold them, escaped by the writer) cannot be printed at all.
_UNSAFE: Final = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_SURROGATE: Final = re.compile("[\ud800-\udfff]")
TIME_FORMAT: Final = "%Y-%m-%dT%H:%M:%SZ"


def when(epoch: int) -> str:
    """An epoch second as UTC ISO-8601; a value no calendar holds is shown as the number."""
    try:
        return datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime(TIME_FORMAT)
    except (OverflowError, OSError, ValueError):
        return f"{epoch} (epoch seconds)"


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe(text: str) -> str:
    """Implements Q-28: ``text`` with every terminal-active character escaped."""
    return _UNSAFE.sub(_escape, text)


def one_line(text: str, width: int = 80) -> str:
    """The first line of ``text``, escaped and cut to ``width`` characters."""
    first = safe(text.splitlines()[0]) if text else ""
    return first if len(first) <= width else first[: width - 3] + "..."


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Lines of an aligned table: the header, then one line per row (cells already escaped)."""
    widths = [len(h) for h in headers]
    for row in rows:
        for index, cell in enumerate(row):
            widths[index] = max(widths[index], len(cell))
    out = []
    for row in (headers, *rows):
        cells = [cell.ljust(widths[i]) if i < len(row) - 1 else cell for i, cell in enumerate(row)]
        out.append("  ".join(cells).rstrip())
    return out


def context_json(context: bytes) -> dict[str, object]:
    """Implements Q-27: a context in JSON, from which its exact bytes can be had back."""
    try:
        value = json.loads(context.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError):
        value = None
    else:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        if text.encode("utf-8", "surrogatepass") == context:
            return {"encoding": "json", "json": value, "bytes": len(context)}
    return {"encoding": "base64", "base64": base64.b64encode(context).decode("ascii"),
            "bytes": len(context)}


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")  # NaN and Infinity: not in a JSON document


def context_bytes(view: dict[str, object]) -> bytes:
    """The inverse of ``context_json`` (what a program reading the JSON does)."""
    if view["encoding"] == "json":
        return json.dumps(view["json"], ensure_ascii=False,
                          separators=(",", ":")).encode("utf-8", "surrogatepass")
    text = view["base64"]
    assert isinstance(text, str)
    try:
        return base64.b64decode(text, validate=True)
    except binascii.Error as exc:
        raise ValueError(f"not base64: {exc}") from exc


def dead_json(task: DeadTask) -> dict[str, object]:
    """A dead task as a JSON object (Q-26, Q-67): its fields, times as epoch seconds, and its
    metadata (``{}`` when it has none)."""
    return {"id": task.id, "task_class": task.task_class, "attempts": task.attempts,
            "enqueued_at": task.enqueued_at, "failed_at": task.failed_at,
            "exception_class": task.exception_class, "exception_message": task.exception_message,
            "backtrace": list(task.backtrace), "context": context_json(task.context),
            "meta": task.meta}


def context_summary(context: bytes) -> tuple[str, str]:
    """(task name, attempts) of a queue context for people; ``?`` when it does not decode."""
    # The codec (pickle, hmac) on demand: `dead list` never shows a context.
    from deferq._runtime.serialize import ContextError, decode_context  # noqa: PLC0415
    try:
        decoded = decode_context(context)
    except ContextError:
        # A record this process cannot decode in full (a tagged version 2 record, Q-30) may
        # still name its task and attempts; never unpickle or build anything to find out.
        try:
            record = json.loads(context.decode("utf-8"), parse_constant=_no_constant)
        except (UnicodeDecodeError, ValueError, RecursionError):
            return "<undecodable>", "?"
        if isinstance(record, dict) and isinstance(record.get("task"), str):
            attempts = record.get("attempts")
            return safe(str(record["task"])), str(attempts) if type(attempts) is int else "?"
        return "<undecodable>", "?"
    return safe(decoded.task), str(decoded.attempts)


def context_text(context: bytes) -> str:
    """A context for people: the JSON text when it is UTF-8, else base64, escaped."""
    view = context_json(context)
    if view["encoding"] == "json":
        return safe(json.dumps(view["json"], ensure_ascii=False))
    return f"base64:{view['base64']} ({len(context)} bytes)"


def print_json(document: object) -> None:
    """Implements Q-26: one JSON document on standard output.

    A lone surrogate in stored text cannot be encoded as UTF-8, so it is written as its
    ``\\udxxx`` escape, which JSON readers decode to the same string.
    """
    text = json.dumps(document, indent=2, ensure_ascii=False)
    sys.stdout.write(_SURROGATE.sub(_escape, text) + "\n")
