"""PURE: how readers split files into lines and what they do with damage.

Theory of operation: the engine reads files in bounded chunks through the
filesystem seam and feeds them to the splitters here, which hold at most one
partial line (capped at ``LINE_BYTES_MAX``) and never the whole file (D-14).
``ForwardLines`` walks a file from its start (the reference replay, verify);
``BackwardLines`` walks it from its end (list/find newest first). Each yields
``RawLine`` values: complete lines, over-long lines (data dropped), and at the
end the torn tail, if the file does not end with a newline. ``ChunkLines`` is
the forward splitter of the fast paths (replay, compaction, the dead-task
index): it hands back each chunk cut at its last newline, so they read the
chunk's lines in place, plus the line that spans chunks.

``RECOVERY_TABLE`` is spec/recovery.md's decision table as data, with the same
labels; a test checks the two agree. ``WalReplay`` applies the table to a WAL,
one line at a time: it is the reference that ``_fastreplay.FastWalReplay`` (the
path every ``Disk`` open takes) must agree with (W-16).
"""

from __future__ import annotations

import binascii
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Final

from deferq._core.frame import BadLine, LineFault
from deferq._core.limits import LINE_BYTES_MAX
from deferq._core.taskid import id_seed
from deferq._core.walcodec import NO_PUBLISH_AT, WalAdd, WalRem, decode_wal_line


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
    Rule("R-@E", f"line of more than {LINE_BYTES_MAX} bytes before its LF", "skip, count",
         "skip, count", "keep; compaction drops it"),
    Rule("R-@F", "bytes after the last newline (torn tail, zero fill)", "skip, count torn",
         "skip, count torn",
         "dead-task store: truncate to the last newline before appending; WAL: never appended to, the copy leaves it (W-3)"),
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
    Rule("R-@L", "WAL file: the NUL bytes it ends with (space reserved for records, W-25)",
         "skip, not counted: the records end before them", "n/a (R-@F)",
         "the owner writes its next record over them"),
)


@dataclass(frozen=True, slots=True)
class RawLine:
    """A line of a file: ``data`` is None for an over-long line (R-@E).

    ``offset`` is where the line starts; ``complete`` is False only for the torn
    tail (R-@F), the bytes after the file's last newline. A splitter that cuts a
    zero-filled hole off a line (R-@K, checked before R-@E) hands on one NUL in its
    place, so ``data`` is never longer than the limit plus one byte; ``holed`` says
    that a hole was cut off a line whose rest is still over-long (``data`` None).
    """

    offset: int
    data: bytes | None
    complete: bool = True
    holed: bool = False


def capped_line(offset: int, data: bytes, limit: int) -> RawLine:
    """The ``RawLine`` of a whole line in hand: R-@K's cut before R-@E's length check.

    post: __return__.data is None or len(__return__.data) <= limit + 1
    """
    if len(data) <= limit:
        return RawLine(offset, data)
    nul = data.rfind(b"\0")
    if nul < 0:
        return RawLine(offset, None)
    if len(data) - nul - 1 > limit:
        return RawLine(offset, None, holed=True)
    return RawLine(offset, data[nul:])


class ForwardLines:
    """Split chunks fed in file order into lines, holding one partial line at most.

    The per-line form of ``ChunkLines`` (which does the carrying): every line as a
    ``RawLine``, for readers that take one line at a time.
    """

    def __init__(self, start_offset: int = 0, line_bytes_max: int = LINE_BYTES_MAX) -> None:
        self._lines = ChunkLines(start_offset, line_bytes_max)
        self._line_bytes_max = line_bytes_max

    def feed(self, chunk: bytes) -> list[RawLine]:
        """Return the lines completed by ``chunk``."""
        base = self._lines.offset
        pos, end, spanning = self._lines.feed(chunk)
        out = [] if spanning is None else [spanning]
        if pos < end:
            limit = self._line_bytes_max
            for piece in chunk[pos:end - 1].split(b"\n"):
                out.append(capped_line(base + pos, piece, limit))
                pos += len(piece) + 1
        return out

    def finish(self) -> RawLine | None:
        """The torn tail (R-@F), or None when the file ended with a newline."""
        if not self._lines.torn:
            return None
        return RawLine(self._lines.line_start, self._lines.held(), complete=False)


class ChunkLines:
    """The forward splitter of the fast paths: it cuts each chunk at its last newline.

    The readers that walk a whole file (replay W-16, compaction S-15, the index
    S-10) read each chunk's own complete lines in place, as slices of the chunk,
    and only a line that spans chunks needs joining. ``feed`` does the joining
    and the carrying: it holds the bytes after a chunk's last newline (at most
    ``line_bytes_max`` of them after the last NUL, R-@K before R-@E; an over-long
    line keeps only its length)
    and hands back the line they complete, so each reader keeps only its loop
    over ``chunk[pos:end]``. ``tests/property/test_splitters.py`` checks it
    (and ``ForwardLines``, built on it) against ``bytes.split`` under any chunking.
    """

    __slots__ = ("_parts", "_held_bytes", "_overlong", "_holed", "_line_bytes_max", "line_start",
                 "offset")

    def __init__(self, start_offset: int = 0, line_bytes_max: int = LINE_BYTES_MAX) -> None:
        self._parts: list[bytes] = []
        self._held_bytes = 0
        self._overlong = False
        self._holed = False  # a NUL was met: _parts starts with one NUL standing for the hole
        self._line_bytes_max = line_bytes_max
        self.line_start = start_offset  # where the line being held (or the next one) starts
        self.offset = start_offset  # where the next chunk starts

    def feed(self, chunk: bytes) -> tuple[int, int, RawLine | None]:
        """``(pos, end, spanning)`` for the chunk that follows the previous ones.

        ``chunk[pos:end]`` holds the chunk's own complete lines, each with its
        newline (``pos == end`` when there are none; ``end`` is just past the
        chunk's last newline). ``spanning`` is the line that began in an earlier
        chunk and ends in this one (its data None when over-long, R-@E), else None.
        """
        base = self.offset
        self.offset = base + len(chunk)
        first = chunk.find(b"\n")
        if first < 0:
            self._hold(chunk)
            return 0, 0, None
        spanning = None
        pos = 0
        if self._held_bytes or self._overlong or self._holed:
            self._hold(chunk[:first])
            data = self.held()
            spanning = RawLine(self.line_start, data, holed=self._holed and data is None)
            self._parts = []
            self._held_bytes = 0
            self._overlong = False
            self._holed = False
            pos = first + 1
        end = chunk.rfind(b"\n") + 1
        self.line_start = base + end
        if end < len(chunk):
            self._hold(chunk[end:])
        return pos, end, spanning

    def _hold(self, piece: bytes) -> None:
        nul = piece.rfind(b"\0")
        if nul >= 0:  # R-@K before R-@E: only the bytes after the last NUL count
            self._holed = True
            self._overlong = False
            self._parts = [b"\0"]
            self._held_bytes = 0
            piece = piece[nul + 1:]
        self._held_bytes += len(piece)
        if self._overlong or self._held_bytes > self._line_bytes_max:
            self._overlong = True
            self._parts = []
        else:
            self._parts.append(piece)

    def held(self) -> bytes | None:
        """The bytes after the last newline fed so far (None once they passed the limit)."""
        return None if self._overlong else b"".join(self._parts)

    @property
    def torn(self) -> bool:
        """Bytes after the last newline fed so far: the torn tail, if the file ends here (R-@F)."""
        return self._held_bytes > 0 or self._holed


class BackwardLines:
    """Split chunks fed from the file's end toward its start into lines, newest first."""

    def __init__(self, end_offset: int, line_bytes_max: int = LINE_BYTES_MAX) -> None:
        self._carry: list[bytes] = []  # pieces of the current partial line, in reverse order
        self._carry_bytes = 0
        self._end = end_offset  # offset just past the partial line's last byte (its newline excluded)
        self._pos = end_offset  # offset of the first byte fed so far
        self._overlong = False
        self._holed = False  # a NUL was met: the pieces before it are the hole (R-@K)
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
        if not piece or self._holed:
            return
        nul = piece.rfind(b"\0")
        if nul >= 0:  # the last NUL of the line: R-@K before R-@E
            self._holed = True
            piece = piece[nul + 1:]
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
            if self._carry_bytes == 0 and not self._holed:
                self._reset(start - 1)
                return
        if self._overlong:
            yield RawLine(start, None, complete, self._holed)
        else:
            hole = b"\0" if self._holed else b""
            yield RawLine(start, hole + b"".join(reversed(self._carry)), complete)
        self._reset(start - 1)

    def _reset(self, end: int) -> None:
        self._carry.clear()
        self._carry_bytes = 0
        self._overlong = False
        self._holed = False
        self._end = end

    def finish(self) -> list[RawLine]:
        """The first line of the file (or the torn tail of a file with no newline)."""
        assert self._pos == 0, "feed the whole file before finish()"
        return (list(self._emit(0)) if (self._carry_bytes or self._holed or not self._at_tail)
                else [])


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
        if not raw.complete:
            return None, (LineFault.TORN_TAIL,)
        return None, ((LineFault.NUL_HOLE, LineFault.OVERLONG) if raw.holed
                      else (LineFault.OVERLONG,))
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


def live_fields(line: bytes) -> tuple[int | None, bytes]:
    """(publish_at, context) of a pending task's ``add`` line, newline included (F-6).

    A replay and the WAL keep each pending task as its line alone (no object per task:
    less memory, and nothing to build on the enqueue path); the line was checked when it
    was written or replayed, so only its fields are split here.

    pre: decode_wal_line(line[:-1]).__class__ is WalAdd
    """
    _, _, _, when, payload = line[:-1].split(b":", 4)
    return (None if when == NO_PUBLISH_AT else int(when)), binascii.a2b_base64(payload)


@dataclass(slots=True)
class WalReplay:
    """Applies WAL lines in order to the set of pending tasks (R-@A..R-@F, R-@I, R-@J)."""

    live: dict[str, bytes] = field(default_factory=dict)  # id -> its add line (see live_fields)
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
            self.live[record.task_id] = data + b"\n"
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
