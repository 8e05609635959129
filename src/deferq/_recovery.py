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

import binascii
import sys
import zlib
from array import array
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import itemgetter
from typing import Final

from deferq._format import (
    NO_PUBLISH_AT,
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

# The chunk path of FastWalReplay (W-16). After the base64 alphabet is deleted from a line,
# _SHAPE maps what is left to its class: ':', LF and '=' stay, every other byte becomes 'x'.
_SHAPE: Final = bytes(c if c in b":\n=" else 0x78 for c in range(256))
_TWO_PAD_TAILS: Final = tuple(bytes((c,)) + b"==" for c in b"AQgw")  # sextets, low 4 bits 0
_ONE_PAD_TAILS: Final = tuple(bytes((c,)) + b"=" for c in b"AEIMQUYcgkosw048")  # low 2 bits 0
_OP_BYTE: Final = itemgetter(9)  # the first byte of the op of a line with a 9-byte header
_BODY: Final = itemgetter(slice(9, None))
_SEED_PREFIX: Final = itemgetter(slice(0, SEED_DIGITS_MAX + 1))  # holds any seed and its '-'
_SELECT_ADD: Final = bytes(1 if c == 0x61 else 0 for c in range(256))  # translate: 'a' -> 1
_SELECT_REM: Final = bytes(1 if c == 0x72 else 0 for c in range(256))  # translate: 'r' -> 1
_CRC_TYPE: Final = next(t for t in "IL" if array(t).itemsize == 4)  # 32-bit unsigned items
_PUBLISH_AT_DIGITS_MAX: Final = 20  # F-6, as in _format._decode_publish_at
_REM_CRC: Final = zlib.crc32(b"rem:")  # a rem body is "rem:" and the id (F-7)


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


class FastWalReplay:
    """The replay fast path: the outcome of ``WalReplay`` on the same files, at a fraction of the cost.

    Implements W-16. Each chunk is split into lines with one ``bytes.split``.
    The complete lines of a chunk without NUL are first checked and applied all
    at once (``_apply_chunk``): a few passes in C over the whole chunk (joins,
    ``translate``, ``split``, CRC-32 of every body) prove that every line is a
    well-formed ``add`` or ``rem`` record (the same checks as ``decode_wal_line``)
    before anything is applied. If one line fails any check, nothing of the
    chunk has been applied and its lines go through the per-line loop
    (``_apply_lines``): records accepted by its checks on the raw bytes are
    applied directly, any other line goes through ``line_body`` and
    ``decode_wal_line`` exactly as in ``WalReplay.apply``. Pending records are
    kept in a dict keyed by the id's UTF-8 bytes holding the line as read; only
    the records still pending at the end get their ids decoded and their
    newline back (``result``), so memory beyond the live lines is one chunk and one partial
    line (D-14). ``tests/property/test_replay_fast_path.py`` checks the outcome
    equals ``WalReplay``'s on arbitrary damaged input and chunking.
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
                clean = len(chunk) <= LINE_BYTES_MAX and b"\0" not in chunk
                if not (clean and self._apply_chunk(lines)):
                    self._apply_lines(lines, clean)
            if last:
                held += len(last)
                if overlong or held > LINE_BYTES_MAX:
                    overlong = True
                    parts.clear()
                else:
                    parts.append(last)
        if held or overlong:
            self._fault(LineFault.TORN_TAIL)  # R-@F: whatever its bytes, a tail is only counted

    def _apply_chunk(self, lines: list[bytes]) -> bool:
        """Apply complete lines without NUL if every one is a valid record; else apply nothing.

        Returns False, having changed nothing, as soon as one check fails. The
        checks, all on whole lists or joined bytes: the op byte of each line
        sorts it into the ``add`` or the ``rem`` lines; each kind is joined with
        LF and split on ':' into its fields, 5 per ``add`` line (crc, op, id,
        publish_at, context) and 3 per ``rem`` line, and the "shape" of the
        joined lines (what is left once the base64 alphabet is deleted: the
        ':', LF and '=' and an 'x' for any other byte) must equal the shape
        built from the ids alone. That pins every ':' of every line (F-2, F-6,
        F-7), so the fields line up, and leaves non-alphabet bytes only in ids
        and '=' only in ids and contexts. Then: crc fields equal to the CRC-32
        of each body (F-3, R-@C), ops, ids (F-5), publish_at (F-6: "0" or a
        decimal without a leading zero, at most 20 digits) and contexts whose
        length is a multiple of 4 and whose '=' are all canonical padding
        (F-6: their count must equal the padding of the contexts that end in a
        valid padded quantum, so no '=' is anywhere else).
        """
        n_lines = len(lines)
        try:
            ops = bytes(map(_OP_BYTE, lines))
        except IndexError:  # a line of at most 9 bytes
            return False
        n_add = ops.count(b"a")
        n_rem = ops.count(b"r")
        if n_add + n_rem != n_lines:
            return False
        add_lines = list(compress(lines, ops.translate(_SELECT_ADD))) if n_rem else lines
        rem_lines = list(compress(lines, ops.translate(_SELECT_REM))) if n_add else lines
        ids: list[bytes] = []
        rem_ids: list[bytes] = []
        if n_add:
            text = b"\n".join(add_lines)
            fields = text.replace(b"\n", b":").split(b":")
            if len(fields) != 5 * n_add:
                return False
            ids = fields[2::5]
            shape = (text + b"\n").translate(_SHAPE, _B64_ALPHABET)
            expected = (b"::" + b"::\n::".join(ids) + b"::\n").translate(_SHAPE, _B64_ALPHABET)
            contexts = fields[4::5]
            if shape != expected and not (
                    b"=" in shape and shape.replace(b"=", b"") == expected.replace(b"=", b"")
                    and shape.count(b"=") - expected.count(b"=")
                    == 2 * sum(map(bytes.endswith, contexts, repeat(_TWO_PAD_TAILS)))
                    + sum(map(bytes.endswith, contexts, repeat(_ONE_PAD_TAILS)))):
                return False
            when = fields[3::5]
            if not (
                b":".join(fields[0::5]) == _crc_fields(add_lines)
                and fields[1::5].count(b"add") == n_add
                and b"" not in ids and max(map(len, ids)) <= TASK_ID_BYTES_MAX
                and b"" not in when and max(map(len, when)) <= _PUBLISH_AT_DIGITS_MAX
                and b"".join(when).isdigit()
                and (b":" + b":".join(when)).count(b":0") == when.count(b"0")
                and not any(size & 3 for size in set(map(len, contexts)))
                and (b"".join(ids).isascii() or all(map(raw_id_ok, ids)))
            ):
                return False
        if n_rem:
            text = b"\n".join(rem_lines)
            fields = text.replace(b"\n", b":").split(b":")
            if len(fields) != 3 * n_rem:
                return False
            rem_ids = fields[2::3]
            if not (
                (text + b"\n").translate(_SHAPE, _B64_ALPHABET)
                == (b"::" + b"\n::".join(rem_ids) + b"\n").translate(_SHAPE, _B64_ALPHABET)
                and b":".join(fields[0::3]) == _crc_fields(rem_ids, _REM_CRC)
                and fields[1::3].count(b"rem") == n_rem
                and b"" not in rem_ids and max(map(len, rem_ids)) <= TASK_ID_BYTES_MAX
                and (b"".join(rem_ids).isascii() or all(map(raw_id_ok, rem_ids)))
            ):
                return False
        # Every line is a valid record: apply them in order (R-@A, R-@I, R-@J).
        self._seed_max = max(self._seed_max, _seed_max(ids), _seed_max(rem_ids))
        self._records += n_lines
        live = self._live
        if not rem_ids:
            live.update(zip(ids, add_lines))
        elif not ids:
            deque(map(live.pop, rem_ids, repeat(None)), maxlen=0)
        elif set(ids).isdisjoint(rem_ids):  # the order between adds and removes cannot matter
            live.update(zip(ids, add_lines))
            deque(map(live.pop, rem_ids, repeat(None)), maxlen=0)
        else:
            adds = zip(ids, add_lines)
            removes = iter(rem_ids)
            for op in ops:
                if op == 0x61:
                    task_id, line = next(adds)
                    live[task_id] = line
                else:
                    live.pop(next(removes), None)
        return True

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

        Consumes the replay: the lines read are released batch by batch as their
        copies with the newline are made, so the peak stays near one copy of the
        pending lines.
        """
        fast = self._live
        keys = list(fast)
        lines = list(fast.values())
        fast.clear()
        live: dict[str, bytes] = {}
        for start in range(0, len(lines), _RESULT_BATCH):
            batch = lines[start:start + _RESULT_BATCH]
            lines[start:start + _RESULT_BATCH] = repeat(b"", len(batch))
            live.update(zip(map(bytes.decode, keys[start:start + _RESULT_BATCH]),
                            map(bytes.__add__, batch, repeat(b"\n"))))
        return WalReplay(live, dict(self._faults), self._seed_max, self._records)


_RESULT_BATCH: Final = 4096


def _crc_fields(lines: list[bytes], rem_crc: int | None = None) -> bytes:
    """The crc field each of ``lines`` must start with, joined with ':' (F-3).

    With ``rem_crc``, ``lines`` are the ids of ``rem`` lines whose bodies are
    "rem:" and the id: their CRC-32 continues from ``rem_crc``, that of "rem:".
    """
    if rem_crc is None:
        crcs = array(_CRC_TYPE, map(zlib.crc32, map(_BODY, lines)))
    else:
        crcs = array(_CRC_TYPE, map(zlib.crc32, lines, repeat(rem_crc)))
    if sys.byteorder == "little":
        crcs.byteswap()
    return binascii.hexlify(crcs, b":", 4)


def _seed_max(ids: list[bytes]) -> int:
    """The largest ``id_seed`` of ``ids`` (W-5), computed on the raw bytes.

    When the smallest and the largest id share "{head}-", every id between them
    does too, so one head settles it; otherwise each distinct prefix that can
    hold a seed is checked.
    """
    if not ids:
        return 0
    low = min(ids)
    dash = low.find(b"-")
    if dash > 0 and max(ids).startswith(low[:dash + 1]):
        return _head_seed(low[:dash])
    return max(map(_head_seed, map(_id_head, set(map(_SEED_PREFIX, ids)))))


def _id_head(prefix: bytes) -> bytes:
    return prefix.split(b"-", 1)[0]


def _head_seed(head: bytes) -> int:
    """``id_seed`` of an id whose part before its first '-' is ``head`` (W-5)."""
    return int(head) if 0 < len(head) <= SEED_DIGITS_MAX and head.isdigit() else 0
