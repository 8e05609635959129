"""PURE: the replay fast path of a tasks WAL (W-16), proven equal to ``WalReplay``.

Theory of operation: ``WalReplay`` (in ``_recovery``) applies the recovery table
one line at a time through the generic splitter and decoder; it is the reference.
``FastWalReplay`` reaches the same outcome (live set and its order, damage counts,
largest seed) with as little Python per line as possible: a whole chunk of clean
lines is proved valid by a few C passes over joined bytes and applied at once, and
anything unusual falls back to per-line checks and finally to the reference rules.
``tests/property/test_replay_fast_path.py`` checks the equality on damaged input
split at any chunk boundary.
"""

from __future__ import annotations

import binascii
import sys
import zlib
from array import array
from collections import deque
from collections.abc import Iterable
from itertools import compress, repeat
from operator import itemgetter
from typing import Final

from deferq._core.b64 import canonical_base64
from deferq._core.frame import BadLine, LineFault
from deferq._core.limits import INT_FIELD_MAX, LINE_BYTES_MAX, TASK_ID_BYTES_MAX
from deferq._core.recovery import ChunkLines, RawLine, WalReplay, capped_line, line_body
from deferq._core.taskid import SEED_DIGITS_MAX, id_seed, raw_id_ok
from deferq._core.walcodec import WalAdd, decode_wal_line

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
# F-6 and F-19: every decimal of at most 18 digits is within 2**63 - 1; a longer one (up to
# 19 digits can still be) is left to walcodec._decode_publish_at, the exact rule.
_PUBLISH_AT_DIGITS_MAX: Final = 18
_REM_CRC: Final = zlib.crc32(b"rem:")  # a rem body is "rem:" and the id (F-7)


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
        carried = ChunkLines(0, LINE_BYTES_MAX)
        for chunk in chunks:
            pos, end, spanning = carried.feed(chunk)
            if spanning is not None:  # a line that began in an earlier chunk
                if spanning.data is None:  # R-@E, after a hole's R-@K when it had one
                    if spanning.holed:
                        self._fault(LineFault.NUL_HOLE)
                    self._fault(LineFault.OVERLONG)
                else:
                    self._apply_lines([spanning.data], False)
            if pos < end:
                lines = chunk.split(b"\n")  # the chunk's own lines, in place of a sliced copy
                lines.pop()  # the bytes after the last newline: ChunkLines holds them
                if pos:
                    del lines[0]  # the end of the spanning line
                # No line of the chunk is longer than the chunk, and one scan of the chunk
                # for NUL spares a search per line.
                clean = len(chunk) <= LINE_BYTES_MAX and b"\0" not in chunk
                if not (clean and self._apply_chunk(lines)):
                    self._apply_lines(lines, clean)
        if carried.torn:
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
                    and (when == b"0" or (when.isdigit() and when[0] != 0x30
                                          and len(when) <= _PUBLISH_AT_DIGITS_MAX))
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
            # W-28: id_seed on the raw bytes, skipped for an id sharing "{seed}-" with one of
            # the last two ids computed (typically the newest adds and the oldest removes).
            if not (task_id.startswith(seed_prefix) or task_id.startswith(older_prefix)):
                dash = task_id.find(b"-")
                head = task_id if dash < 0 else task_id[:dash]
                if len(head) <= SEED_DIGITS_MAX and head.isdigit():
                    seed = int(head)
                    if seed_max < seed <= INT_FIELD_MAX:
                        seed_max = seed
                older_prefix = seed_prefix
                seed_prefix = task_id[:dash + 1] if dash > 0 else b"\n"
        self._seed_max = max(self._seed_max, seed_max)
        self._records += records

    def _apply_slow(self, line: bytes) -> None:
        """A line the fast checks did not accept: exactly ``WalReplay.apply`` (R-@A..R-@K)."""
        data, faults = line_body(capped_line(0, line, LINE_BYTES_MAX))
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
    """The largest ``id_seed`` of ``ids`` (W-28), computed on the raw bytes.

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
    """``id_seed`` of an id whose part before its first '-' is ``head`` (W-28)."""
    if 0 < len(head) <= SEED_DIGITS_MAX and head.isdigit():
        seed = int(head)
        return seed if seed <= INT_FIELD_MAX else 0
    return 0
