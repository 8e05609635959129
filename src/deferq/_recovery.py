"""PURE: how readers split files into lines and what they do with damage.

Theory of operation: the engine reads files in bounded chunks through the
filesystem seam and feeds them to the splitters here, which hold at most one
partial line (capped at ``LINE_BYTES_MAX``) and never the whole file (D-14).
``ForwardLines`` walks a file from its start (replay, compaction, verify);
``BackwardLines`` walks it from its end (list/find newest first). Each yields
``RawLine`` values: complete lines, over-long lines (data dropped), and at the
end the torn tail, if the file does not end with a newline.

``RECOVERY_TABLE`` is spec/recovery.md's decision table as data, with the same
labels; a test checks the two agree. ``WalReplay`` applies the table to a WAL.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Final

from deferq._format import (
    SEED_DIGITS_MAX,
    BadLine,
    LineFault,
    WalAdd,
    WalRem,
    canonical_base64,
    decode_wal_line,
    id_seed,
    raw_id_ok,
)
from deferq._limits import LINE_BYTES_MAX, TASK_ID_BYTES_MAX

_B64_ALPHABET: Final = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


@dataclass(frozen=True, slots=True)
class Rule:
    """One row of the recovery decision table (spec/recovery.md)."""

    label: str
    condition: str
    wal_reader: str
    dead_reader: str
    writer: str


RECOVERY_TABLE: Final = (
    Rule("R-@A", "complete line, valid frame and body", "apply", "keep", "keep"),
    Rule("R-@B", "complete line, header is not 8 lowercase hex digits and ':'",
         "skip, count", "skip, count", "keep; compaction drops it"),
    Rule("R-@C", "complete line, CRC does not match the body", "skip, count", "skip, count",
         "keep; compaction drops it"),
    Rule("R-@D", "complete line, valid CRC, body does not parse", "skip, count", "skip, count",
         "keep; compaction drops it"),
    Rule("R-@E", f"line longer than {LINE_BYTES_MAX} bytes", "skip, count", "skip, count",
         "keep; compaction drops it"),
    Rule("R-@F", "bytes after the last newline (torn tail, zero fill)", "skip, count torn",
         "skip, count torn", "truncate to the last newline before appending"),
    Rule("R-@G", "dead-task line, valid frame, JSON payload invalid", "n/a", "skip, log error",
         "keep; compaction keeps it"),
    Rule("R-@H", "dead-task id written more than once", "n/a", "latest record wins, once",
         "keep; compaction removes all on remove"),
    Rule("R-@I", "WAL rem of an id that is not pending", "no-op", "n/a", "keep"),
    Rule("R-@J", "WAL add of an id already pending", "replace, keep position", "n/a", "keep"),
    Rule("R-@K", "complete line containing NUL bytes (a zero-filled hole before a record)",
         "count, read the bytes after the last NUL as the line",
         "count, read the bytes after the last NUL as the line",
         "compaction keeps only the bytes after the last NUL, if valid"),
)


@dataclass(frozen=True, slots=True)
class RawLine:
    """A line of a file: ``data`` is None for an over-long line (R-@E).

    ``offset`` is where the line starts; ``complete`` is False only for the torn
    tail (R-@F), the bytes after the file's last newline.
    """

    offset: int
    data: bytes | None
    complete: bool = True


class ForwardLines:
    """Split chunks fed in file order into lines, holding one partial line at most."""

    def __init__(self, start_offset: int = 0, line_bytes_max: int = LINE_BYTES_MAX) -> None:
        self._parts: list[bytes] = []
        self._held_bytes = 0
        self._line_start = start_offset
        self._overlong = False
        self._line_bytes_max = line_bytes_max

    def feed(self, chunk: bytes) -> list[RawLine]:
        """Return the lines completed by ``chunk``."""
        out: list[RawLine] = []
        pieces = chunk.split(b"\n")
        for piece in pieces[:-1]:
            length = self._held_bytes + len(piece)
            if self._overlong or length > self._line_bytes_max:
                out.append(RawLine(self._line_start, None))
            elif self._parts:
                out.append(RawLine(self._line_start, b"".join(self._parts) + piece))
            else:
                out.append(RawLine(self._line_start, piece))
            self._line_start += length + 1
            self._parts.clear()
            self._held_bytes = 0
            self._overlong = False
        self._hold(pieces[-1])
        return out

    def _hold(self, piece: bytes) -> None:
        if not piece:
            return
        self._held_bytes += len(piece)
        if self._overlong or self._held_bytes > self._line_bytes_max:
            self._overlong = True
            self._parts.clear()
        else:
            self._parts.append(piece)

    def finish(self) -> RawLine | None:
        """The torn tail (R-@F), or None when the file ended with a newline."""
        if self._held_bytes == 0:
            return None
        data = None if self._overlong else b"".join(self._parts)
        return RawLine(self._line_start, data, complete=False)


class BackwardLines:
    """Split chunks fed from the file's end toward its start into lines, newest first."""

    def __init__(self, end_offset: int, line_bytes_max: int = LINE_BYTES_MAX) -> None:
        self._carry: list[bytes] = []  # pieces of the current partial line, in reverse order
        self._carry_bytes = 0
        self._end = end_offset  # offset just past the partial line's last byte (its newline excluded)
        self._pos = end_offset  # offset of the first byte fed so far
        self._overlong = False
        self._at_tail = True
        self._line_bytes_max = line_bytes_max

    def feed(self, chunk: bytes) -> list[RawLine]:
        """``chunk`` ends where the previous one began. Return the lines it completes."""
        out: list[RawLine] = []
        self._pos -= len(chunk)
        pieces = chunk.split(b"\n")
        piece_end = self._pos + len(chunk)
        for piece in reversed(pieces[1:]):
            start = piece_end - len(piece)
            self._add(piece)
            out.extend(self._emit(start))
            piece_end = start - 1
        self._add(pieces[0])
        return out

    def _add(self, piece: bytes) -> None:
        if not piece:
            return
        self._carry_bytes += len(piece)
        if self._overlong or self._carry_bytes > self._line_bytes_max:
            self._overlong = True
            self._carry.clear()
        else:
            self._carry.append(piece)

    def _emit(self, start: int) -> Iterator[RawLine]:
        complete = not self._at_tail
        if self._at_tail:
            self._at_tail = False
            if self._carry_bytes == 0:
                self._reset(start - 1)
                return
        if self._overlong:
            yield RawLine(start, None, complete)
        else:
            yield RawLine(start, b"".join(reversed(self._carry)), complete)
        self._reset(start - 1)

    def _reset(self, end: int) -> None:
        self._carry.clear()
        self._carry_bytes = 0
        self._overlong = False
        self._end = end

    def finish(self) -> list[RawLine]:
        """The first line of the file (or the torn tail of a file with no newline)."""
        assert self._pos == 0, "feed the whole file before finish()"
        return list(self._emit(0)) if (self._carry_bytes or not self._at_tail) else []


def strip_nul_damage(data: bytes) -> tuple[bytes, bool]:
    """Split off a zero-filled hole glued in front of a line (R-@K).

    No valid record contains a NUL byte (F-4, F-5), so everything up to the
    last NUL is damage: typically the zeros a power loss leaves where data
    was never written (A-5, A-7) in front of a record written after it.
    Returns the rest and whether anything was cut.

    post: __return__[1] == (bytes([0]) in data)
    post: bytes([0]) not in __return__[0] and data.endswith(__return__[0])
    """
    index = data.rfind(b"\0")
    return (data, False) if index < 0 else (data[index + 1:], True)


def line_body(raw: RawLine) -> tuple[bytes | None, tuple[LineFault, ...]]:
    """The bytes of a line that are left to decode, and the damage met before decoding.

    Every reader applies the same first rows of the table here: a torn tail
    (R-@F) or an over-long line (R-@E) has nothing to decode; a zero-filled
    hole (R-@K) is cut off and what follows it, if anything, is decoded.
    """
    if raw.data is None:
        return None, (LineFault.OVERLONG if raw.complete else LineFault.TORN_TAIL,)
    if not raw.complete:
        return None, (LineFault.TORN_TAIL,)
    data, holed = strip_nul_damage(raw.data)
    if not holed:
        return data, ()
    return (data if data else None), (LineFault.NUL_HOLE,)


def tail_cut(chunk: bytes, chunk_offset: int) -> int | None:
    """Where tail repair truncates, given a chunk that ends at the file's end (R-@F).

    Returns the offset just after the chunk's last newline, or None when the
    chunk holds no newline (scan further back; at offset 0 the answer is 0).

    post: __return__ is None or chunk_offset < __return__ <= chunk_offset + len(chunk)
    """
    index = chunk.rfind(b"\n")
    return None if index < 0 else chunk_offset + index + 1


@dataclass(slots=True)
class LiveTask:
    """A pending task during replay: its publish time and its ``add`` line (newline included)."""

    publish_at: int | None
    line: bytes


@dataclass(slots=True)
class WalReplay:
    """Applies WAL lines in order to the set of pending tasks (R-@A..R-@F, R-@I, R-@J)."""

    live: dict[str, LiveTask] = field(default_factory=dict)
    faults: dict[LineFault, int] = field(default_factory=dict)
    seed_max: int = 0
    records: int = 0

    def apply(self, raw: RawLine) -> bytes | None:
        """Apply one line; return the valid record's bytes (to copy), or None for damage."""
        data, faults = line_body(raw)
        for fault in faults:
            self._fault(fault)
        if data is None:
            return None
        record = decode_wal_line(data)
        if isinstance(record, BadLine):
            self._fault(record.fault)
            return None
        self.records += 1
        self.seed_max = max(self.seed_max, id_seed(record.task_id))
        if isinstance(record, WalAdd):
            self.live[record.task_id] = LiveTask(record.publish_at, data + b"\n")
        else:
            assert isinstance(record, WalRem)
            self.live.pop(record.task_id, None)
        return data

    def apply_file(self, chunks: Iterable[bytes]) -> None:
        """Apply every line of one file, given as its chunks in order, the torn tail last."""
        splitter = ForwardLines()
        for chunk in chunks:
            for raw in splitter.feed(chunk):
                self.apply(raw)
        tail = splitter.finish()
        if tail is not None:
            self.apply(tail)

    def _fault(self, fault: LineFault) -> None:
        self.faults[fault] = self.faults.get(fault, 0) + 1

    @property
    def corrupt(self) -> int:
        """Lines skipped as damage, torn tail included."""
        return sum(self.faults.values())


class FastWalReplay:
    """The replay fast path: the outcome of ``WalReplay`` on the same files, at a fraction of the cost.

    Implements W-16. Each chunk is split with one ``bytes.split``; a line that
    is a well-formed ``add`` or ``rem`` record (no NUL, CRC matching, every field
    valid: the same checks as ``decode_wal_line``, done on the raw bytes) is
    applied to a dict keyed by the id's UTF-8 bytes holding the line as read;
    any other line goes through ``line_body`` and ``decode_wal_line`` exactly as
    in ``WalReplay.apply``. Only the records still pending at the end are decoded
    into ``LiveTask`` values (``result``), so memory beyond the live lines is one
    partial line (D-14). ``tests/property/test_replay_fast_path.py`` checks the
    outcome equals ``WalReplay``'s on arbitrary damaged input and chunking.
    """

    __slots__ = ("_live", "_faults", "_seed_max", "_records")

    def __init__(self) -> None:
        self._live: dict[bytes, bytes] = {}  # id (UTF-8) -> its add line, newline excluded
        self._faults: dict[LineFault, int] = {}
        self._seed_max = 0
        self._records = 0

    def apply_file(self, chunks: Iterable[bytes]) -> None:
        """Apply every line of one file, given as its chunks in order, the torn tail last (R-@F)."""
        parts: list[bytes] = []  # the partial line carried over chunk boundaries
        held = 0
        overlong = False
        for chunk in chunks:
            lines = chunk.split(b"\n")
            last = lines.pop()
            if lines and (held or overlong):
                first = lines.pop(0)
                if overlong or held + len(first) > LINE_BYTES_MAX:
                    self._fault(LineFault.OVERLONG)  # R-@E
                else:
                    parts.append(first)
                    self._apply_lines([b"".join(parts)], False)
                parts.clear()
                held = 0
                overlong = False
            if lines:
                # No line of the chunk is longer than the chunk, and one scan of the chunk
                # for NUL spares a search per line.
                self._apply_lines(lines, len(chunk) <= LINE_BYTES_MAX and b"\0" not in chunk)
            if last:
                held += len(last)
                if overlong or held > LINE_BYTES_MAX:
                    overlong = True
                    parts.clear()
                else:
                    parts.append(last)
        if held or overlong:
            self._fault(LineFault.TORN_TAIL)  # R-@F: whatever its bytes, a tail is only counted

    def _apply_lines(self, lines: list[bytes], clean: bool) -> None:
        """The hot loop: apply complete lines; ``clean``: none is over-long or holds a NUL."""
        live = self._live
        seed_prefix = older_prefix = b"\n"  # "{seed}-" of the last two ids whose seed was computed
        seed_max = self._seed_max
        records = 0
        slow = self._apply_slow
        crc32 = zlib.crc32
        for line in lines:
            if (line[8:9] != b":" or b"%08x" % crc32(line[9:]) != line[:8]
                    or not (clean or (len(line) <= LINE_BYTES_MAX and b"\0" not in line))):
                slow(line)
                continue
            op = line[9:13]
            if op == b"add:":
                end = line.find(b":", 13)
                when_end = line.find(b":", end + 1) if end > 0 else -1
                if when_end < 0:
                    slow(line)
                    continue
                task_id = line[13:end]
                when = line[end + 1:when_end]
                payload = line[when_end + 1:]
                # F-5, F-6 on the raw bytes (no ':', LF or NUL can be in the id here); the
                # common case of canonical_base64 (no padding) is inlined.
                if not (
                    0 < len(task_id) <= TASK_ID_BYTES_MAX
                    and (task_id.isascii() or raw_id_ok(task_id))
                    and (when == b"0" or (when.isdigit() and when[0] != 0x30 and len(when) <= 20))
                    and ((not len(payload) & 3 and not payload.translate(None, _B64_ALPHABET))
                         or canonical_base64(payload))
                ):
                    slow(line)
                    continue
                live[task_id] = line
            elif op == b"rem:":
                task_id = line[13:]
                if not ((0 < len(task_id) <= TASK_ID_BYTES_MAX and task_id.isascii()
                         and b":" not in task_id) or raw_id_ok(task_id)):
                    slow(line)
                    continue
                live.pop(task_id, None)
            else:
                slow(line)
                continue
            records += 1
            # W-5: id_seed on the raw bytes, skipped for an id sharing "{seed}-" with one of
            # the last two ids computed (typically the newest adds and the oldest removes).
            if not (task_id.startswith(seed_prefix) or task_id.startswith(older_prefix)):
                dash = task_id.find(b"-")
                head = task_id if dash < 0 else task_id[:dash]
                if len(head) <= SEED_DIGITS_MAX and head.isdigit():
                    seed = int(head)
                    if seed > seed_max:
                        seed_max = seed
                older_prefix = seed_prefix
                seed_prefix = task_id[:dash + 1] if dash > 0 else b"\n"
        self._seed_max = max(self._seed_max, seed_max)
        self._records += records

    def _apply_slow(self, line: bytes) -> None:
        """A line the fast checks did not accept: exactly ``WalReplay.apply`` (R-@A..R-@K)."""
        data, faults = line_body(RawLine(0, line if len(line) <= LINE_BYTES_MAX else None))
        for fault in faults:
            self._fault(fault)
        if data is None:
            return
        record = decode_wal_line(data)
        if isinstance(record, BadLine):
            self._fault(record.fault)
            return
        self._records += 1
        self._seed_max = max(self._seed_max, id_seed(record.task_id))
        key = record.task_id.encode("utf-8")
        if isinstance(record, WalAdd):
            self._live[key] = data
        else:
            self._live.pop(key, None)

    def _fault(self, fault: LineFault) -> None:
        self._faults[fault] = self._faults.get(fault, 0) + 1

    def result(self) -> WalReplay:
        """The replay's outcome as a ``WalReplay``: live tasks decoded, in order, each line once.

        Consumes the replay: each line read is released as soon as its copy with the
        newline exists, so the peak stays near one copy of the pending lines.
        """
        live: dict[str, LiveTask] = {}
        fast = self._live
        for key, line in fast.items():
            end = line.find(b":", 13)
            when = line[end + 1:line.find(b":", end + 1)]
            live[key.decode("utf-8")] = LiveTask(None if when == b"0" else int(when), line + b"\n")
            fast[key] = b""  # same keys, so iterating on is allowed
        fast.clear()
        return WalReplay(live, dict(self._faults), self._seed_max, self._records)
