"""The dead-task store's index cache: the index of S-10 kept beside the store (S-65..S-74).

Theory of operation: a deep page (``offset`` of ``DEAD_CACHE_OFFSET_MIN`` places or
more) read without an index costs a scan of everything before it, and every operator
command is a fresh process with no index. So a process that has built the index writes
its listing places to ``{data}.index`` (F-60), and a later process reads a page from it
in memory bounded by the page: it never holds the ids met (D-14), because the cache
lists only each id's latest record.

The cache is never a source of truth. It is used only when its own CRC-32 holds and
its header names the data file open under the locks exactly as the per-process index
is checked (S-45: device, inode, size at least the indexed end, the lock file's
ctime, the CRC-32 of the last indexed bytes); every record read through it is checked
again (its frame valid, its id the one whose hash the cache holds) before it is
decoded; anything else makes the reader ignore it (and rebuild it when it builds).
Lines appended since it was written (the *tail*, at most ``DEAD_CACHE_TAIL_BYTES_MAX``)
are indexed in memory for the one operation; an id of the tail supersedes its cached
place, found by testing the cache's hash column, chunk by chunk, against the tail's
hashes and confirmed by reading the record's id.

Layout (native byte order, announced by ``BYTE_ORDER_MARK``): the header, then for the
``n`` places in file order their offsets (``q``), lengths (``q``) and id hashes
(``I``, CRC-32 of the id's UTF-8 bytes), then the damaged lines, then the CRC-32 of
everything before it. Writing it is best effort: it goes to ``{data}.index.tmp`` and is
renamed over the cache without any fsync (a torn or lost cache fails its CRC and is
rebuilt).
"""

from __future__ import annotations

import struct
import zlib
from array import array
from bisect import bisect_left
from collections.abc import Iterator

from deferq._core.deadcodec import decode_dead_line
from deferq._core.frame import BadLine
from deferq._core.limits import FILE_MODE, READ_CHUNK_BYTES, WRITE_BATCH_BYTES
from deferq._engine.deadindex import (
    DEAD_BODY_PREFIX,
    ID_START,
    Damage,
    DeadIndex,
    clean_id,
    index_matches,
)
from deferq._engine.env import Env, FileStat, OpenFlag
from deferq._engine.io import write_all

MAGIC = b"DQDIDX01"
BYTE_ORDER_MARK = 0x01020304
_HEADER = struct.Struct("=8sIQQqQQIQQ")
_DAMAGE = struct.Struct("=QQQIB")
_CRC = struct.Struct("=I")
_PLACE_BYTES = 8 + 8 + 4  # offset, length, id hash
# The shortest record a place can name (``xxxxxxxx:dead_task:a:`` and its newline: 22 bytes);
# a damaged line may be a lone newline.
_RECORD_BYTES_MIN = 20
_HASHES_PER_READ = READ_CHUNK_BYTES // 4


def id_hash(task_id: str) -> int:
    """The 32-bit hash of an id the cache stores (a match is a candidate, checked by a read)."""
    return zlib.crc32(task_id.encode("utf-8"))


class StaleCache(Exception):
    """A record read through the cache is not the one it names (S-70)."""


# ---------------------------------------------------------------------- writing


def cache_chunks(index: DeadIndex) -> Iterator[bytes]:
    """The cache of ``index`` in pieces of about ``WRITE_BATCH_BYTES``, its CRC-32 last."""
    ids = index.ids
    if index.stale:
        latest = index.latest
        places = [p for p in range(len(ids)) if latest[ids[p]] == p]
        offs = array("q", (index.offs[p] for p in places))
        lens = array("q", (index.lens[p] for p in places))
        place_ids = [ids[p] for p in places]
    else:
        offs, lens, place_ids = index.offs, index.lens, ids
    hashes = array("I", map(zlib.crc32, map(str.encode, place_ids)))
    crc = 0
    header = _HEADER.pack(MAGIC, BYTE_ORDER_MARK, index.device, index.inode,
                          index.lock_ctime_ns, index.end, index.check_start, index.check_crc,
                          len(offs), len(index.damage))
    parts: list[bytes] = [header]
    for column in (offs, lens, hashes):
        data = column.tobytes()
        parts.extend(data[i:i + WRITE_BATCH_BYTES] for i in range(0, len(data), WRITE_BATCH_BYTES))
    parts.append(b"".join(_DAMAGE.pack(d.key, d.start, d.length, d.faults, d.readable)
                          for d in index.damage))
    for part in parts:
        crc = zlib.crc32(part, crc)
        yield part
    yield _CRC.pack(crc)


def write_cache(env: Env, path: str, parts: Iterator[bytes]) -> None:
    """Implements S-71: write ``parts`` to ``path`` by way of ``path.tmp`` and a rename.

    No fsync: the cache is checked before every use. Raises ``OSError``; the caller
    (holding the store's locks) logs it and goes on.
    """
    tmp = path + ".tmp"
    fd = env.open(tmp, OpenFlag.WRITE | OpenFlag.CREATE | OpenFlag.TRUNCATE, FILE_MODE)
    try:
        for part in parts:
            write_all(env, fd, part)
    finally:
        env.close(fd)
    env.rename(tmp, path)


def merged_chunks(cache: CachedIndex, tail: DeadIndex, superseded: set[int]) -> Iterator[bytes]:
    """Implements S-85: the cache of the file up to the tail's end, from ``cache`` and ``tail``.

    The cached columns are streamed chunk by chunk without the ``superseded`` places, and
    the tail's latest records appended, so memory is one chunk plus the tail's index.
    """
    latest, ids = tail.latest, tail.ids
    mine = [p for p in range(len(ids)) if latest[ids[p]] == p]
    tail_columns = (array("q", (tail.offs[p] for p in mine)),
                    array("q", (tail.lens[p] for p in mine)),
                    array("I", (id_hash(ids[p]) for p in mine)))
    fresh = tail.end > cache.end  # the tail indexed a line: its window is the one to check
    header = _HEADER.pack(
        MAGIC, BYTE_ORDER_MARK, cache.device, cache.inode, cache.lock_ctime_ns, tail.end,
        tail.check_start if fresh else cache.check_start,
        tail.check_crc if fresh else cache.check_crc,
        cache.places - len(superseded) + len(mine), cache.damage_count + len(tail.damage))
    dropped = sorted(superseded)
    crc = zlib.crc32(header)
    yield header
    for column, (typecode, at) in enumerate(cache.columns()):
        for first in range(0, cache.places, _HASHES_PER_READ):
            count = min(_HASHES_PER_READ, cache.places - first)
            values = cache.column(typecode, at, first, count)
            for place in reversed(dropped[bisect_left(dropped, first):
                                          bisect_left(dropped, first + count)]):
                del values[place - first]
            data = values.tobytes()
            crc = zlib.crc32(data, crc)
            yield data
        data = tail_columns[column].tobytes()
        crc = zlib.crc32(data, crc)
        yield data
    damage = b"".join(_DAMAGE.pack(d.key, d.start, d.length, d.faults, d.readable)
                      for d in (*cache.damage(), *tail.damage))
    yield damage
    yield _CRC.pack(zlib.crc32(damage, crc))


# ---------------------------------------------------------------------- reading


class CachedIndex:
    """An index cache read from disk and checked (S-66, S-67); open only under the locks."""

    def __init__(self, env: Env, fd: int, fields: tuple[int, ...]) -> None:
        """``fields``: the header's, after the magic and the byte-order mark."""
        self._env = env
        self._fd = fd
        (self.device, self.inode, self.lock_ctime_ns, self.end, self.check_start,
         self.check_crc, self.places, damage_count) = fields
        n = self.places
        self._lens_at = _HEADER.size + 8 * n
        self._hashes_at = self._lens_at + 8 * n
        self._damage_at = self._hashes_at + 4 * n
        self.damage_count = damage_count

    @classmethod
    def open(cls, env: Env, path: str, data_size: int) -> CachedIndex | None:
        """The cache at ``path`` when it exists and its layout and CRC-32 hold, else None.

        A cache of a data file of ``data_size`` bytes can index no more than that and name
        no more places or damaged lines than such a file holds lines, so a larger one is
        refused before its CRC is read (its size bounds that read by the data file's).
        """
        try:
            fd = env.open(path, OpenFlag.READ)
        except FileNotFoundError:
            return None
        try:
            size = env.fstat(fd).size
            head = env.pread(fd, _HEADER.size, 0)
            if len(head) != _HEADER.size:
                raise _Unusable
            header = _HEADER.unpack(head)
            if header[0] != MAGIC or header[1] != BYTE_ORDER_MARK:
                raise _Unusable
            end, places, damage = header[5], header[8], header[9]
            if end > data_size or places * _RECORD_BYTES_MIN + damage > end:
                raise _Unusable
            if size != _HEADER.size + _PLACE_BYTES * places + _DAMAGE.size * damage + _CRC.size:
                raise _Unusable
            crc = 0
            at = 0
            while at < size - _CRC.size:
                chunk = env.pread(fd, min(READ_CHUNK_BYTES, size - _CRC.size - at), at)
                if not chunk:
                    raise _Unusable
                crc = zlib.crc32(chunk, crc)
                at += len(chunk)
            if _CRC.pack(crc) != env.pread(fd, _CRC.size, size - _CRC.size):
                raise _Unusable
            return cls(env, fd, tuple(int(v) for v in header[2:]))
        except _Unusable:
            env.close(fd)
            return None
        except BaseException:
            env.close(fd)
            raise

    def close(self) -> None:
        self._env.close(self._fd)

    def usable(self, env: Env, fd: int, stat: FileStat, lock_ctime_ns: int) -> bool:
        """Implements S-67: the checks of S-45 against the data file open as ``fd``."""
        return index_matches(env, fd, stat, lock_ctime_ns, (
            self.device, self.inode, self.lock_ctime_ns, self.end, self.check_start,
            self.check_crc))

    def columns(self) -> tuple[tuple[str, int], ...]:
        """The (typecode, file offset) of the offsets, lengths and id hashes columns."""
        return (("q", _HEADER.size), ("q", self._lens_at), ("I", self._hashes_at))

    def column(self, typecode: str, at: int, first: int, count: int) -> array[int]:
        out = array(typecode)
        width = out.itemsize
        data = self._env.pread(self._fd, width * count, at + width * first)
        if len(data) != width * count:
            raise StaleCache("short read of the index cache")
        out.frombytes(data)
        return out

    def spans(self, first: int, count: int) -> tuple[array[int], array[int], array[int]]:
        """Offsets, lengths and id hashes of the places ``first .. first + count - 1``."""
        return (self.column("q", _HEADER.size, first, count),
                self.column("q", self._lens_at, first, count),
                self.column("I", self._hashes_at, first, count))

    def places_of(self, hashes: set[int]) -> Iterator[tuple[int, int]]:
        """Each (place, hash) whose id hash is in ``hashes``: the hash column read in chunks,
        each tested against the set in C (``set.isdisjoint``) before it is walked."""
        for first in range(0, self.places, _HASHES_PER_READ):
            column = self.column("I", self._hashes_at, first,
                                 min(_HASHES_PER_READ, self.places - first))
            if hashes.isdisjoint(column):
                continue
            for at, hash_ in enumerate(column):
                if hash_ in hashes:
                    yield first + at, hash_

    def damage(self) -> Iterator[Damage]:
        """The damaged lines of the cached bytes, in file order (read in chunks)."""
        per_chunk = max(1, READ_CHUNK_BYTES // _DAMAGE.size)
        for first in range(0, self.damage_count, per_chunk):
            count = min(per_chunk, self.damage_count - first)
            data = self._env.pread(self._fd, _DAMAGE.size * count,
                                   self._damage_at + _DAMAGE.size * first)
            for fields in _DAMAGE.iter_unpack(data):
                key, start, length, faults, readable = fields
                yield Damage(key, start, length, faults, bool(readable))


class _Unusable(Exception):
    """The cache file's layout or CRC does not hold: it is ignored (S-66)."""


def record_id_at(env: Env, fd: int, start: int, task_id: str) -> bool:
    """Whether the record at ``start`` (indexed with a valid frame) carries ``task_id``."""
    want = b":" + DEAD_BODY_PREFIX + task_id.encode("utf-8") + b":"
    return env.pread(fd, 8 + len(want), start)[8:] == want


# ---------------------------------------------------------------------- a page


class PageRecord:
    """One record of a page read through the cache: where it is and what it must carry."""

    __slots__ = ("hash", "length", "start", "task_id")

    def __init__(self, start: int, length: int, task_id: str | None, hash_: int) -> None:
        self.start = start
        self.length = length
        self.task_id = task_id  # a tail record's indexed id; None for a cached place
        self.hash = hash_  # a cached place's id hash


def superseded_places(env: Env, fd: int, cache: CachedIndex, tail: DeadIndex) -> set[int]:
    """Implements S-69: the cached places whose id has a record in the tail."""
    superseded: set[int] = set()
    if tail.latest:
        by_hash: dict[int, list[str]] = {}
        for task_id in tail.latest:
            by_hash.setdefault(id_hash(task_id), []).append(task_id)
        for place, hash_ in cache.places_of(set(by_hash)):
            start = cache.spans(place, 1)[0][0]
            if any(record_id_at(env, fd, start, task_id) for task_id in by_hash[hash_]):
                superseded.add(place)
    return superseded


def page_records(cache: CachedIndex, tail: DeadIndex, superseded: set[int], offset: int,
                 limit: int) -> tuple[list[PageRecord], int | None]:
    """Implements S-68, S-69: the page's records newest first, and where its scan would stop.

    The listing is the tail's places newest first, then the cached places newest first
    but the ``superseded`` ones. The stop is the start of the page's last record when the
    page is full, None when the listing ends first.
    """
    out: list[PageRecord] = []
    tail_places = len(tail.latest)
    if offset < tail_places:
        for position in tail.newest(offset):
            out.append(PageRecord(tail.offs[position], tail.lens[position],
                                  tail.ids[position], 0))
            if len(out) == limit:
                return out, out[-1].start
    skip = max(0, offset - tail_places)
    top = cache.places - 1 - skip
    for place in sorted(superseded, reverse=True):  # skip over the superseded places
        if place < top:
            break
        top -= 1
    need = limit - len(out)
    if top >= 0:
        count = min(top + 1, need + len(superseded))
        first = top - count + 1
        offs, lens, hashes = cache.spans(first, count)
        for i in range(count - 1, -1, -1):
            if first + i in superseded:
                continue
            out.append(PageRecord(offs[i], lens[i], None, hashes[i]))
            need -= 1
            if not need:
                return out, out[-1].start
    return out, None


def read_page(env: Env, fd: int, records: list[PageRecord],
              tail_ids: dict[str, int]) -> Iterator[tuple[str, bytes]]:
    """Implements S-70: each record's id and payload, checked, read in runs.

    A run is one read of at most ``READ_CHUNK_BYTES`` (or of one longer record) that
    holds the next record and as many of the following (older) ones as fit.
    """
    low = high = 0
    data = b""
    for k, record in enumerate(records):
        start, end = record.start, record.start + record.length
        if start < low or end > high:
            low, high = start, end
            for later in records[k + 1:]:
                if later.start < end - READ_CHUNK_BYTES or later.start + later.length > high:
                    break
                low = min(low, later.start)
            data = env.pread(fd, high - low, low)
            if len(data) != high - low:
                raise StaleCache(f"short read at offset {low}: the data file shrank")
        at, stop = start - low, end - low
        if data.find(10, at, stop) >= 0 or data.find(0, at, stop) >= 0:
            raise StaleCache(f"no single record at offset {start}")
        raw_id = clean_id(data, at, stop)
        if raw_id is not None:
            task_id = raw_id.decode("ascii")
            payload = data[at + ID_START + len(raw_id) + 1:stop]
        else:  # not sure (a non-ASCII id, or no valid frame): the full check decides
            framed = decode_dead_line(data[at:stop])
            if isinstance(framed, BadLine):
                raise StaleCache(f"no valid record at offset {start}")
            task_id, payload = framed.task_id, framed.payload
        if record.task_id is None:
            if id_hash(task_id) != record.hash or task_id in tail_ids:
                raise StaleCache(f"the record at offset {start} is not the cached one")
        elif task_id != record.task_id:
            raise StaleCache(f"the record at offset {start} is not the indexed one")
        yield task_id, payload
