"""A reader of deferq storage directories written from spec/ alone (standard library only).

Usage: ``python3 reference_reader.py DIRECTORY PREFIX`` prints one JSON document on stdout:
``{"prefix", "pending", "dead", "damage": {"wal": {label: n}, "dead": {label: n}}}`` (see
conformance/README.md). It never writes to DIRECTORY.

Theory of operation, with the spec statement each step follows:

- WAL files are the names that match F-1 for PREFIX (matched by structure, format.md section 1 notes),
  read one after another in name order (W-15); every line is classified by recovery.md's order (steps
  0 to 8) and valid records are applied to one ordered map of pending tasks (R-@I, R-@J).
- The dead-task data file ``{PREFIX}dead_tasks-0`` (F-9) is split into lines the same way (without the
  R-@L cut) and walked from its end: each id once, at its latest record with a valid frame (R-@H, S-6),
  decoded by F-11; an undecodable latest record hides the id (R-@G).
- Damage is reported per recovery-table label: every "count" cell, plus R-@G for the records a reader
  logs as errors. R-@F is the torn tail. Rows that are not damage (R-@A, R-@H to R-@J, R-@L) are absent.

Decisions the spec left open (each is listed in conformance/README.md as a spec gap):

- "Name order" is taken as the byte order of the file names (os.listdir on bytes).
- A line whose last byte before LF is NUL (R-@K) leaves no bytes "after the last NUL"; it is counted
  once as R-@K and nothing more (the spec's "if any").
- The lines after an R-@K cut are counted under their own row too, so one line can count twice.
- Only regular files (symlinks followed) are read; the spec does not say what a directory named like a
  WAL file is.
- The staging file and the lock file's content are ignored: no reader in spec/ reads them.
- This reader holds a whole file in memory, which D-14 forbids the engine but not a checker.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import stat
import sys
import zlib

LINE_BYTES_MAX = 8_388_608
TASK_ID_BYTES_MAX = 256
CONTEXT_BYTES_MAX = 4_194_304
TASK_CLASS_BYTES_MAX = 1024
EXCEPTION_CLASS_CHARS_MAX = 1024
EXCEPTION_MESSAGE_CHARS_MAX = 65_536
BACKTRACE_FRAMES_MAX = 20
BACKTRACE_FRAME_CHARS_MAX = 4096
INT_FIELD_MAX = 2**63 - 1  # F-19: every integer a record stores
HEX = frozenset(b"0123456789abcdef")
DIGITS = frozenset(b"0123456789")
BASE36 = frozenset(b"0123456789abcdefghijklmnopqrstuvwxyz")
DEAD_KEYS = ("id", "task_class", "attempts", "enqueued_at", "failed_at", "exception_class",
             "exception_message", "backtrace", "context")


def is_wal_name(name: bytes, prefix: bytes) -> bool:
    """F-1 by structure: ``{prefix}0-`` then exactly date-pid-rand."""
    head = prefix + b"0-"
    if not name.startswith(head):
        return False
    parts = name[len(head):].split(b"-")
    if len(parts) != 3:
        return False
    date, pid, rand = parts
    if len(date) != 8 or not set(date) <= DIGITS:
        return False
    if not 1 <= len(pid) <= 10 or not set(pid) <= DIGITS:
        return False
    if not 1 <= len(rand) <= 7 or not set(rand) <= BASE36:
        return False
    return int(rand, 36) < 2**32


def valid_id(raw: bytes) -> str | None:
    """F-5: 1 to 256 bytes of UTF-8 without ':', LF or NUL."""
    if not 1 <= len(raw) <= TASK_ID_BYTES_MAX or any(b in raw for b in (b":", b"\n", b"\0")):
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def canonical_b64(text: bytes) -> bytes | None:
    """F-6: standard alphabet, padded, and re-encoding gives the same bytes."""
    try:
        decoded = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
    return decoded if base64.b64encode(decoded) == text else None


def parse_wal_body(body: bytes) -> tuple[str, str, bytes] | None:
    """F-6 / F-7: ("add", id, line body) or ("rem", id, b""); None when the grammar fails."""
    if body.startswith(b"add:"):
        parts = body.split(b":", 3)
        if len(parts) != 4:
            return None
        task_id = valid_id(parts[1])
        when = parts[2]
        if task_id is None or not set(when) <= DIGITS or not 1 <= len(when) <= 20:
            return None
        if when != b"0" and when.startswith(b"0"):
            return None
        if int(when) > INT_FIELD_MAX:
            return None
        if canonical_b64(parts[3]) is None:
            return None
        return ("add", task_id, body)
    if body.startswith(b"rem:"):
        task_id = valid_id(body[4:])
        return None if task_id is None else ("rem", task_id, b"")
    return None


def parse_dead_body(body: bytes) -> tuple[str, bytes] | None:
    """F-10's frame grammar: ``dead_task:{id}:{json}``; the JSON is judged later (F-11)."""
    if not body.startswith(b"dead_task:"):
        return None
    raw_id, sep, payload = body[len(b"dead_task:"):].partition(b":")
    task_id = valid_id(raw_id)
    if not sep or task_id is None:
        return None
    return (task_id, payload)


def split_lines(data: bytes, damage: dict[str, int]) -> list[bytes]:
    """Recovery steps 1 to 3: complete lines (LF removed), the torn tail counted as R-@F."""
    last = data.rfind(b"\n")
    if last + 1 < len(data):
        count(damage, "R-@F")
    out: list[bytes] = []
    for line in data[:last + 1].split(b"\n")[:-1]:
        if b"\0" in line:  # step 2, R-@K, before step 3, R-@E
            count(damage, "R-@K")
            line = line[line.rfind(b"\0") + 1:]
            if not line:  # "the bytes after it, if any": none left, nothing more to judge.
                continue
        if len(line) > LINE_BYTES_MAX:
            count(damage, "R-@E")
            continue
        out.append(line)
    return out


def frame_body(line: bytes, damage: dict[str, int]) -> bytes | None:
    """Recovery steps 3 and 4 (R-@B, R-@C): the body of a line whose frame is valid."""
    if len(line) < 9 or not set(line[:8]) <= HEX or line[8:9] != b":":
        count(damage, "R-@B")
        return None
    body = line[9:]
    if line[:8] != b"%08x" % zlib.crc32(body):
        count(damage, "R-@C")
        return None
    return body


def count(damage: dict[str, int], label: str) -> None:
    damage[label] = damage.get(label, 0) + 1


def read_file(path: bytes) -> bytes | None:
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def read_wal(directory: bytes, prefix: bytes, damage: dict[str, int]) -> list[dict[str, object]]:
    """W-15, R-@I, R-@J: apply every file's records in file order, files in name order."""
    pending: dict[str, bytes] = {}  # insertion order is the order of pending_tasks (W-7)
    for name in sorted(n for n in os.listdir(directory) if is_wal_name(n, prefix)):
        data = read_file(os.path.join(directory, name))
        if data is None:
            continue
        data = data.rstrip(b"\0")  # R-@L: the trailing NUL run is reserved space, not damage
        for line in split_lines(data, damage):
            body = frame_body(line, damage)
            record = None if body is None else parse_wal_body(body)
            if body is not None and record is None:
                count(damage, "R-@D")
            if record is None:
                continue
            op, task_id, add_body = record
            if op == "add":
                pending[task_id] = add_body  # R-@J: a dict keeps the first insertion's place
            else:
                pending.pop(task_id, None)  # R-@I: a rem of a task that is not pending is a no-op
    tasks: list[dict[str, object]] = []
    for task_id, body in pending.items():
        when = body.split(b":", 3)[2]
        tasks.append({"id": task_id, "publish_at": None if when == b"0" else int(when),
                      "context_base64": body.split(b":", 3)[3].decode("ascii")})
    return tasks


class _NotJson(ValueError):
    pass


def _pairs(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """F-11: no duplicate key; with none, the dict keeps the keys in the file's order."""
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise _NotJson("duplicate key")
    return dict(pairs)


def _refuse(text: str) -> object:
    """F-11: a number with a fraction or an exponent (or NaN/Infinity) is not an int."""
    raise _NotJson(text)


def _natural(text: str) -> int:
    """F-32: an integer has no sign, so ``-0`` is refused too."""
    if text.startswith("-"):
        raise _NotJson(text)
    return int(text)


def decode_dead(task_id: str, payload: bytes) -> dict[str, object] | None:
    """F-11, F-31 to F-33 and F-17's limits: the JSON object, or None (R-@G)."""
    try:  # json.loads refuses a BOM in a str (F-31); strict UTF-8 refuses encoded surrogates
        obj: object = json.loads(payload.decode("utf-8"), object_pairs_hook=_pairs,
                                 parse_float=_refuse, parse_constant=_refuse,
                                 parse_int=_natural)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict) or tuple(obj) != DEAD_KEYS:
        return None
    texts = [obj[k] for k in ("id", "task_class", "exception_class", "exception_message",
                              "context")]
    numbers = [obj[k] for k in ("attempts", "enqueued_at", "failed_at")]
    frames = obj["backtrace"]
    if (not all(isinstance(v, str) for v in texts)
            or not all(isinstance(v, int) and not isinstance(v, bool)
                       and 0 <= v <= INT_FIELD_MAX for v in numbers)
            or not isinstance(frames, list) or not all(isinstance(f, str) for f in frames)):
        return None
    line_id, task_class, exception_class, message, context_text = (str(v) for v in texts)
    if line_id != task_id:
        return None
    try:  # F-33: no text field may hold a surrogate (a lone \\uD800 escape)
        class_bytes = len(task_class.encode("utf-8"))
        "".join((exception_class, message, *(str(f) for f in frames))).encode("utf-8")
    except UnicodeEncodeError:
        return None
    context = canonical_b64(context_text.encode("utf-8"))
    if (not 1 <= class_bytes <= TASK_CLASS_BYTES_MAX
            or len(exception_class) > EXCEPTION_CLASS_CHARS_MAX
            or len(message) > EXCEPTION_MESSAGE_CHARS_MAX
            or len(frames) > BACKTRACE_FRAMES_MAX
            or any(len(str(f)) > BACKTRACE_FRAME_CHARS_MAX for f in frames)
            or context is None or len(context) > CONTEXT_BYTES_MAX):
        return None
    return obj


def read_dead(directory: bytes, prefix: bytes, damage: dict[str, int]) -> list[dict[str, object]]:
    """S-6: newest first, each id once at its latest record with a valid frame (R-@H, R-@G)."""
    data = read_file(os.path.join(directory, prefix + b"dead_tasks-0"))
    if data is None:
        return []
    records: list[tuple[str, bytes]] = []
    for line in split_lines(data, damage):
        body = frame_body(line, damage)
        record = None if body is None else parse_dead_body(body)
        if body is not None and record is None:
            count(damage, "R-@D")
        if record is not None:
            records.append(record)
    seen: set[str] = set()
    out: list[dict[str, object]] = []
    for task_id, payload in reversed(records):
        if task_id in seen:
            continue  # R-@H: an older record of an id already met is never decoded
        seen.add(task_id)
        obj = decode_dead(task_id, payload)
        if obj is None:
            count(damage, "R-@G")
        else:
            out.append(obj)
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: reference_reader.py DIRECTORY PREFIX", file=sys.stderr)
        return 2
    directory, prefix = os.fsencode(argv[1]), os.fsencode(argv[2])
    wal_damage: dict[str, int] = {}
    dead_damage: dict[str, int] = {}
    report = {
        "prefix": argv[2],
        "pending": read_wal(directory, prefix, wal_damage),
        "dead": read_dead(directory, prefix, dead_damage),
        "damage": {"wal": wal_damage, "dead": dead_damage},
    }
    sys.stdout.write(json.dumps(report, ensure_ascii=True, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
