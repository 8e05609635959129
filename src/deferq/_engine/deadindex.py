"""The dead-task store's per-process index and its needle scan (spec/dead-tasks.md S-10..S-13).

Theory of operation: ``DeadIndex`` maps each task id to the place of its latest
record with a valid frame in one data file, and keeps every indexed record in
file order, so ``list(offset, limit)`` and ``find(id)`` read only the records they
return (S-11). It also keeps where each damaged line lies and how many faults it
holds, so readers count damage exactly as the backward scan would (S-7, S-12).
It is only ever used under the store's locks, and only after ``usable`` has
checked the data file (opened by path, S-3) against what the index was built
from (S-10): same device and inode, not smaller than the indexed bytes, the
indexed file's last bytes unchanged at the same place, and the lock file's ctime
unchanged (every compaction truncates the lock file twice, S-9). Bytes appended
after the indexed end are then indexed in place (``extend``); anything else drops
the index. The bytes after the last newline (a torn tail, R-@F) are never
indexed: readers look at them on every call.

``NeedleScan`` is the cold ``find``: it searches the file backwards, chunk by
chunk, for the requested id's ``dead_task:{id}:`` body prefix and yields only the
lines that contain it, newest first; S-7 already limits ``find``'s damage count
to those lines, so it is exactly the line-by-line scan minus the lines it skips.

Memory (D-18): per indexed record 8 + 8 bytes of offsets and lengths plus one
reference to its id string; per distinct id one dict entry and the id itself;
per damaged line one small record.
"""

from __future__ import annotations

import zlib
from array import array
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import accumulate, repeat
from operator import add

from deferq._core.deadbatch import check_run
from deferq._core.deadcodec import DeadLine, decode_dead_line
from deferq._core.frame import CRC_HEX_BYTES, HEADER_BYTES, BadLine
from deferq._core.limits import LINE_BYTES_MAX, READ_CHUNK_BYTES, TASK_ID_BYTES_MAX
from deferq._core.recovery import ChunkLines, RawLine, capped_line, line_body
from deferq._engine.env import Env, FileStat


def dead_line(raw: RawLine) -> tuple[DeadLine | None, bytes | None, int]:
    """One line's framed record, its bytes (after any R-@K hole) and its damage count."""
    data, faults = line_body(raw)
    if data is None:
        return None, None, len(faults)
    framed = decode_dead_line(data)
    if isinstance(framed, BadLine):
        return None, None, len(faults) + 1
    return framed, data, len(faults)


DEAD_BODY_PREFIX = b"dead_task:"
ID_START = HEADER_BYTES + len(DEAD_BODY_PREFIX)


def clean_id(chunk: bytes, start: int, end: int) -> bytes | None:
    """The raw id of the dead-task line ``chunk[start:end]`` when it is clean, else None.

    The caller has checked that the line holds no NUL and no newline. When this
    returns an id, ``decode_dead_line`` of the line returns a ``DeadLine`` of that id
    (decoded as ASCII): the same header, CRC, ``dead_task`` tag and id checks (F-3,
    F-5, F-10), without copying the payload; an ASCII id of 1 to ``TASK_ID_BYTES_MAX``
    bytes ending at a ``:`` has no forbidden character. None means "not sure": the
    caller decodes the line in full.
    """
    id_start = start + ID_START
    if end <= id_start or chunk[start + CRC_HEX_BYTES] != 0x3A or not chunk.startswith(
            DEAD_BODY_PREFIX, start + HEADER_BYTES):
        return None
    body = memoryview(chunk)[start + HEADER_BYTES:end]
    if b"%08x" % zlib.crc32(body) != chunk[start:start + CRC_HEX_BYTES]:
        return None
    colon = chunk.find(b":", id_start, end)
    if colon <= id_start:
        return None
    raw_id = chunk[id_start:colon]
    return raw_id if raw_id.isascii() and len(raw_id) <= TASK_ID_BYTES_MAX else None


def fast_dead_id(line: bytes) -> str | None:
    """``clean_id`` of a whole line as a ``str``; None for a line with a NUL or a newline."""
    if b"\0" in line or b"\n" in line:
        return None
    raw_id = clean_id(line, 0, len(line))
    return None if raw_id is None else raw_id.decode("ascii")


def index_matches(env: Env, fd: int, stat: FileStat, lock_ctime_ns: int,
                  built: tuple[object, object, object, int, int, object]) -> bool:
    """Implements S-45: is ``fd`` the file an index of ``built`` describes?

    ``built`` is (device, inode, lock ctime, indexed end, check start, check CRC).
    """
    device, inode, built_ctime, end, check_start, check_crc = built
    if (stat.device, stat.inode) != (device, inode):
        return False  # another file (a compaction's rename, a re-creation)
    if stat.size < end or lock_ctime_ns != built_ctime:
        return False  # cut into the indexed bytes, or a compaction happened (S-9)
    if end:
        window = env.pread(fd, end - check_start, check_start)
        if len(window) != end - check_start or zlib.crc32(window) != check_crc:
            return False  # the indexed bytes were replaced (inode number reused)
    return True


class StaleIndex(Exception):
    """A record read through the index is not the record the index names (S-10)."""


@dataclass(frozen=True, slots=True)
class Damage:
    """A damaged line of the indexed bytes (R-@B..R-@F, R-@K).

    ``key`` orders it among the records: the line's start, or, for a line whose
    zero-filled hole hides a valid record, that record's start.
    """

    key: int
    start: int
    length: int  # without the newline
    faults: int
    readable: bool  # False for an over-long line (R-@E): readers see no bytes


class DeadIndex:
    """Where every record of one data file lies (S-10, S-11). Not thread-safe: lock first."""

    def __init__(self, stat: FileStat, lock_ctime_ns: int) -> None:
        self.device = stat.device
        self.inode = stat.inode
        self.lock_ctime_ns = lock_ctime_ns
        self.end = 0  # indexed bytes: just after the last newline
        self.offs = array("q")  # record start, in file order
        self.lens = array("q")  # record length without the newline
        self.ids: list[str] = []
        self.latest: dict[str, int] = {}  # id -> position in offs/lens/ids
        self.stale = 0  # positions superseded by a later record of the same id (R-@H)
        self.damage: list[Damage] = []
        self.damage_keys: list[int] = []
        self.check_start = 0  # the bytes [check_start, end) are checked by usable()
        self.check_crc = 0

    # ------------------------------------------------------------------ validity

    def usable(self, env: Env, fd: int, stat: FileStat, lock_ctime_ns: int) -> bool:
        """Implements S-10: may this index describe the data file open as ``fd``?"""
        return index_matches(env, fd, stat, lock_ctime_ns, (
            self.device, self.inode, self.lock_ctime_ns, self.end, self.check_start,
            self.check_crc))

    # ------------------------------------------------------------------ building

    def extend(self, env: Env, fd: int, size: int) -> None:
        """Index the complete lines of ``fd[end:size]`` (S-10); the torn tail stays unindexed."""
        if size <= self.end:
            return
        lines = ChunkLines(self.end, LINE_BYTES_MAX)
        last_start = -1
        while lines.offset < size:
            base = lines.offset
            want = min(READ_CHUNK_BYTES, size - base)
            chunk = env.pread(fd, want, base)
            if len(chunk) != want:
                raise OSError(f"short read at offset {base}: file changed while locked")
            pos, end, spanning = lines.feed(chunk)
            if spanning is not None:  # a line that began in an earlier chunk
                last_start = spanning.offset
                self._add_line(spanning, base + pos - 1 - last_start)
            clean = b"\0" not in chunk
            if clean and pos < end:  # S-40: the chunk's own lines checked as one run
                run = check_run(b"\n" + chunk[pos:end])
                if run is not None:
                    self._add_run(run[0], run[1], base + pos)
                    last_start = self.offs[-1]
                    pos = end
            while pos < end:
                newline = chunk.find(b"\n", pos)
                short = newline - pos <= LINE_BYTES_MAX
                raw_id = clean_id(chunk, pos, newline) if clean and short else None
                if raw_id is not None:
                    self._add_record(raw_id.decode("ascii"), base + pos, newline - pos)
                elif not short:  # R-@K is cut before R-@E is checked
                    self._add_line(capped_line(base + pos, chunk[pos:newline], LINE_BYTES_MAX),
                                   newline - pos)
                else:
                    self._add_line(RawLine(base + pos, chunk[pos:newline]), newline - pos)
                last_start = base + pos
                pos = newline + 1
        if last_start >= 0:
            self.end = lines.line_start  # just past the last complete line
            self.check_start = max(last_start, self.end - READ_CHUNK_BYTES)
            window = env.pread(fd, self.end - self.check_start, self.check_start)
            if len(window) != self.end - self.check_start:
                raise OSError("short read of the indexed end: file changed while locked")
            self.check_crc = zlib.crc32(window)

    def _add_line(self, raw: RawLine, length: int) -> None:
        start, data = raw.offset, raw.data
        if data is None:
            self._add_damage(Damage(start, start, length, 2 if raw.holed else 1, False))
            return
        if b"\0" not in data:  # line_body() returns it unchanged
            framed = decode_dead_line(data)
            if isinstance(framed, BadLine):
                self._add_damage(Damage(start, start, length, 1, True))
            else:
                self._add_record(framed.task_id, start, length)
            return
        found, body, faults = dead_line(RawLine(start, data))
        record_start = start if body is None else start + length - len(body)
        # A line longer than the limit was cut at its last NUL by the splitter (R-@K before
        # R-@E): readers see only the bytes from that NUL on, ``data``.
        seen, size = (start, length) if length <= LINE_BYTES_MAX else (
            start + length - len(data), len(data))
        self._add_damage(Damage(record_start if found else seen, seen, size, faults, True))
        if found is not None and body is not None:
            self._add_record(found.task_id, record_start, len(body))

    def _add_run(self, raw_ids: list[bytes], payloads: list[bytes], start: int) -> None:
        """Index the records of a run ``check_run`` vouched for, the first one at ``start``.

        Each line is ``ID_START`` bytes of header and tag, the id, ``:`` and the payload;
        the lists are walked by C-level maps, not by a loop per record.
        """
        count = len(raw_ids)
        lens = list(map(add, map(add, map(len, raw_ids), map(len, payloads)),
                        repeat(ID_START + 1)))
        offs = list(accumulate(map(add, lens, repeat(1)), initial=start))
        del offs[count]
        first = len(self.offs)
        self.offs.extend(offs)
        self.lens.extend(lens)
        names = list(map(bytes.decode, raw_ids))  # ASCII: check_run's pattern
        self.ids.extend(names)
        latest = self.latest
        before = len(latest)
        latest.update(zip(names, range(first, first + count)))
        self.stale += count - (len(latest) - before)

    def _add_damage(self, damage: Damage) -> None:
        self.damage.append(damage)
        self.damage_keys.append(damage.key)

    def _add_record(self, task_id: str, start: int, length: int) -> None:
        position = len(self.offs)
        self.offs.append(start)
        self.lens.append(length)
        self.ids.append(task_id)
        if self.latest.get(task_id) is not None:
            self.stale += 1
        self.latest[task_id] = position

    # ------------------------------------------------------------------ queries

    def newest(self, skip: int) -> Iterator[int]:
        """Positions of each id's latest record, newest first, after skipping ``skip`` of them."""
        if self.stale == 0:
            yield from range(len(self.offs) - 1 - skip, -1, -1)
            return
        latest, ids = self.latest, self.ids
        for position in range(len(self.offs) - 1, -1, -1):
            if latest[ids[position]] != position:
                continue
            if skip:
                skip -= 1
                continue
            yield position

    def key(self, position: int) -> int:
        """Where the record at ``position`` starts: the stop point of a scan that ends there."""
        return self.offs[position]

    def damage_from(self, key: int) -> list[Damage]:
        """The damaged lines at or after ``key``: those a backward scan stopping there meets."""
        return self.damage[bisect_left(self.damage_keys, key):]

    def memory_items(self) -> int:
        """Indexed records plus damaged lines: what the index's memory is proportional to."""
        return len(self.offs) + len(self.damage)


class RecordReader:
    """The payloads of indexed records, read newest first, several per read (S-10, S-11).

    A read that misses the current window fetches the wanted record together with up
    to ``ahead - 1`` records before it, within ``READ_CHUNK_BYTES`` (never less than
    the record itself), so a page of adjacent records costs a few reads, not one per
    record, and memory stays bounded whatever the file's size (D-14).
    """

    def __init__(self, index: DeadIndex, env: Env, fd: int) -> None:
        self._index = index
        self._env = env
        self._fd = fd
        self._start = 0
        self._end = 0
        self._data = b""
        self._view = memoryview(self._data)

    def read(self, position: int, ahead: int) -> bytes:
        """The JSON payload of the record at ``position``; ``StaleIndex`` if it is not there.

        Not there means: ``decode_dead_line`` of the bytes at the indexed place is not a
        ``DeadLine`` of the indexed id (S-10). That is decided without splitting the
        line: the CRC matches, the body starts with ``dead_task:{id}:`` (an indexed id
        is valid, so it holds no ``:``) and the line holds no newline.
        """
        index = self._index
        start = index.offs[position]
        end = start + index.lens[position]
        if start < self._start or end > self._end:
            low = index.offs[max(position - ahead + 1, 0)] if ahead > 1 else start
            low = min(start, max(low, end - READ_CHUNK_BYTES))
            window = self._env.pread(self._fd, end - low, low)
            if len(window) != end - low:
                raise StaleIndex(f"short read at offset {low}: the file shrank")
            self._start, self._end, self._data = low, end, window
            self._view = memoryview(window)
        data = self._data
        at = start - self._start  # the record is data[at:stop]
        stop = end - self._start
        task_id = index.ids[position]
        prefix = _HEADER_TAIL + task_id.encode("utf-8") + b":"
        if (not data.startswith(prefix, at + CRC_HEX_BYTES)
                or b"%08x" % zlib.crc32(self._view[at + HEADER_BYTES:stop])
                != data[at:at + CRC_HEX_BYTES]
                or data.find(10, at, stop) >= 0):  # 10: LF (an int needle is a plain memchr)
            raise StaleIndex(f"no record of {task_id!r} at offset {start}")
        return data[at + CRC_HEX_BYTES + len(prefix):stop]


_HEADER_TAIL = b":" + DEAD_BODY_PREFIX  # what follows the CRC in every dead-task line


class NeedleScan:
    """The lines of ``fd[:size]`` that contain ``needle``, newest first (S-7, S-13).

    Reads the file backwards in ``READ_CHUNK_BYTES`` chunks, each byte once when
    nothing matches; ``bytes_read`` counts what it read. Over-long lines (R-@E)
    are skipped, as the line-by-line scan has no bytes for them; a line over the
    limit whose rest after its last NUL is within it (R-@K before R-@E) is that rest.
    """

    def __init__(self, env: Env, fd: int, size: int, needle: bytes) -> None:
        assert needle and b"\n" not in needle
        self._env = env
        self._fd = fd
        self._size = size
        self._needle = needle
        self.bytes_read = 0

    def _pread(self, size: int, offset: int) -> bytes:
        data = self._env.pread(self._fd, size, offset)
        if len(data) != size:
            raise OSError(f"short read at offset {offset}: file changed while locked")
        self.bytes_read += size
        return data

    def lines(self) -> Iterator[RawLine]:
        """Each line containing the needle, newest first, the torn tail as incomplete."""
        keep = len(self._needle) - 1
        hi = self._size
        over = b""  # the first ``keep`` bytes at ``hi``, for a needle that spans ``hi``
        while hi > 0:
            lo = max(0, hi - READ_CHUNK_BYTES)
            chunk = self._pread(hi - lo, lo)
            buf = chunk + over
            limit = len(buf)
            restart: int | None = None
            while True:
                hit = buf.rfind(self._needle, 0, limit)
                if hit < 0:
                    break
                newline = buf.rfind(b"\n", 0, hit)
                start = lo + newline + 1 if newline >= 0 else self._line_start(lo)
                newline = buf.find(b"\n", hit + len(self._needle))
                end = lo + newline if newline >= 0 else self._line_end(lo + len(buf))
                if end - start <= LINE_BYTES_MAX:
                    if start >= lo and end <= lo + len(buf):
                        data = buf[start - lo:end - lo]
                    else:
                        data = self._pread(end - start, start)
                    yield RawLine(start, data, end < self._size)
                elif end < self._size:
                    rest = capped_line(start, self._pread(LINE_BYTES_MAX + 1,
                                                          end - LINE_BYTES_MAX - 1), LINE_BYTES_MAX)
                    if rest.data is not None and self._needle in rest.data:
                        yield RawLine(start, rest.data)
                if start < lo:
                    restart = start
                    break
                limit = start - lo
            if restart is not None:
                hi, over = restart, b""
            else:
                hi, over = lo, chunk[:keep]

    def _line_start(self, pos: int) -> int:
        """The start of the line holding the byte before ``pos`` (no newline in ``[pos, hit)``)."""
        while pos > 0:
            lo = max(0, pos - READ_CHUNK_BYTES)
            newline = self._pread(pos - lo, lo).rfind(b"\n")
            if newline >= 0:
                return lo + newline + 1
            pos = lo
        return 0

    def _line_end(self, pos: int) -> int:
        """The offset of the first newline at or after ``pos``, or the file's size."""
        while pos < self._size:
            want = min(READ_CHUNK_BYTES, self._size - pos)
            newline = self._pread(want, pos).find(b"\n")
            if newline >= 0:
                return pos + newline
            pos += want
        return self._size
