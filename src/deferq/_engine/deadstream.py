"""Newest-first scans of the dead-task store, and long reads in lock steps (spec/dead-tasks.md
S-6, S-27..S-30, L-6).

Rules: ``newest_first`` is the one scan of the data file's lines from its newest end: it
keeps each id once at its latest record with a valid frame (R-@H, checked before R-@G: a
damaged line never supersedes, an older record is never decoded), skips ``offset`` ids
checking only their frame and id (S-33: no payload is decoded, so an undecodable latest
record counts toward the offset like any other), then takes ``limit`` ids, decoding each:
one that does not decode (R-@G) uses its place in the page and is not returned (S-34), and
counts damage as S-7 says. It is fed blocks of the file, newest first, by whoever holds the right to read
them: the store's ``list`` reads them under one lock hold (S-6), ``SteppedBlocks`` in
steps, each under the locks for at most ``DEAD_READ_STEP_BYTES`` (S-27, L-6).

Theory of operation of a stepped read (the operators' long reads: ``stats``, filtered
lists, bulk selections). The first step takes the locks, opens the data file by path
(S-3), finds the last newline (the snapshot's end: bytes before it are never changed by
deferq's algorithms on this inode, which only append after it, cut after it, or rename a
new file over it), notes the file's identity and the lock file's ctime, reads the newest
block and closes the file. Every later step reopens the file by path under the locks and
checks, as S-45 checks the index, that it is the same file: same device and inode, not
shorter than the snapshot, the lock file's ctime unchanged (a compaction truncates the lock
file twice, S-9), the snapshot's last bytes unchanged. The locks are never held while the
caller works on what a step returned, so an add waits for a reader at most one step. A
failed check means a compaction replaced the file: the read starts again from the new
file's end, skipping every id it has already met (S-29), at most
``DEAD_READ_RESTARTS_MAX`` times.

Memory (S-30): one block (at most ``DEAD_READ_STEP_BYTES``), the line that spans blocks,
and the set of ids met; never the records already returned.
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from deferq._core.deadbatch import check_run
from deferq._core.deadcodec import decode_dead_payload, decode_dead_record
from deferq._core.errors import DeadTasksLockTimeout
from deferq._core.frame import CRC_HEX_BYTES, HEADER_BYTES, BadLine
from deferq._core.limits import (
    DEAD_READ_RESTARTS_MAX,
    DEAD_READ_STEP_BYTES,
    LINE_BYTES_MAX,
    READ_CHUNK_BYTES,
    TASK_ID_BYTES_MAX,
)
from deferq._core.recovery import RawLine
from deferq._core.types import DeadTask
from deferq._engine.deadindex import DEAD_BODY_PREFIX, ID_START, clean_id, dead_line
from deferq._engine.env import Env, OpenFlag
from deferq._engine.lazylog import Log

log = Log("deferq")  # logging itself on the first message (lazylog.py)

Block = tuple[int, bytes]  # (offset, bytes): a piece of the data file, fed newest first


@dataclass(slots=True)
class Tally:
    """What one read met: damage (S-7), undecodable ids (R-@G) and the ids seen (R-@H)."""

    skip: int = 0  # ids still to skip for the offset (S-33)
    take: int = -1  # ids still to take after the offset, decodable or not (S-34); -1: all
    corrupt: int = 0
    undecodable: list[str] = field(default_factory=list)
    seen: set[bytes] = field(default_factory=set)  # ids met, as UTF-8
    low: int = -1  # the lowest offset read, for S-11's byte count (-1: nothing read)


def newest_first(blocks: Iterator[Block], end: int, tally: Tally) -> Iterator[DeadTask]:
    """Implements S-6, S-7, R-@H, S-40: the latest records of ``[0, end)`` newest first.

    ``blocks`` must cover ``[0, end)`` backwards without gaps, and ``end`` must be just
    after a newline (the caller counts a torn tail after it, R-@F). Seen ids are held
    as their UTF-8 bytes. The complete lines inside each block are first checked as one
    run (``check_run``, S-40); a run it does not vouch for is checked line by line.
    """
    if not tally.take:  # limit=0: nothing to read
        return
    for newer, lo, block, head, last, clean in _pieces_newest_first(blocks, tally):
        if newer is not None:
            yield from _lines([newer], clean, tally)
        if head < last and tally.take:
            checked = check_run(block) if clean else None
            if checked is not None:
                yield from _checked_run(checked[0], checked[1], tally)
            else:
                inner: list[bytes | RawLine] = list(block[head + 1:last].split(b"\n"))
                inner.reverse()
                yield from _lines(inner, clean, tally)
        if lo == 0 and head >= 0 and tally.take:  # the file's first line
            yield from _lines([block[:head]], clean, tally)
        if not tally.take:  # the page is full: read no further (S-36)
            return


def _checked_run(ids: list[bytes], payloads: list[bytes], tally: Tally) -> Iterator[DeadTask]:
    """The tasks of a run ``check_run`` vouched for (oldest first), newest first (S-40).

    While the offset still skips at least as many ids as the run has lines, the run is
    skipped with one set update (the ids it adds are those the offset skips): which of
    its records is an id's latest does not matter when none of them is returned.
    Otherwise each line as the exact path does it.
    """
    seen = tally.seen
    if len(ids) <= tally.skip:  # it holds at most len(ids) new ids: none can be returned
        before = len(seen)
        seen.update(ids)
        tally.skip -= len(seen) - before
        return
    for position in range(len(ids) - 1, -1, -1):
        raw_id = ids[position]
        if raw_id in seen:
            continue
        seen.add(raw_id)
        if tally.skip:
            tally.skip -= 1
            continue
        task_id = raw_id.decode("ascii")
        task = decode_dead_record(task_id, payloads[position])
        tally.take -= 1
        if isinstance(task, BadLine):
            tally.undecodable.append(task_id)  # its place in the page stays empty (S-34)
        else:
            yield task
        if not tally.take:
            return


def _lines(lines: list[bytes | RawLine], clean: bool, tally: Tally) -> Iterator[DeadTask]:
    """The tasks of ``lines`` (newest first), each line checked on its own (S-6, S-7, S-31).

    A line whose frame or id fails its check is damage and supersedes nothing (R-@H before
    R-@G): only a line with a valid frame marks its id as met, counts toward ``skip`` and
    uses a place of ``take``.

    ``clean`` says whether the plain ``bytes`` lines come from a block without a NUL byte.
    """
    seen = tally.seen
    crc32 = zlib.crc32
    for line in lines:
        if isinstance(line, RawLine):
            raw_id = _clean_id(line.data) if line.data is not None else None
            data = line.data
        else:
            data = line
            # The fast path of ``clean_id`` inlined (a NUL-free block, no newline after
            # split): same header, CRC, tag and id checks as ``decode_dead_line`` (F-3,
            # F-5, F-10); anything it is not sure of takes the exact path below.
            raw_id = None
            if clean and line.startswith(_HEAD, CRC_HEX_BYTES):
                colon = line.find(b":", ID_START)
                if (ID_START < colon <= ID_START + TASK_ID_BYTES_MAX
                        and b"%08x" % crc32(memoryview(line)[HEADER_BYTES:])
                        == line[:CRC_HEX_BYTES]):
                    raw_id = line[ID_START:colon]
                    if not raw_id.isascii():
                        raw_id = None
        if raw_id is not None and data is not None:
            if raw_id in seen:
                continue
            seen.add(raw_id)
            if tally.skip:
                tally.skip -= 1
                continue
            task_id = raw_id.decode("ascii")
            task = decode_dead_record(task_id, data[ID_START + len(raw_id) + 1:])
        else:
            framed, _, faults = dead_line(line if isinstance(line, RawLine)
                                          else RawLine(-1, line))
            tally.corrupt += faults
            if framed is None:
                continue
            task_id = framed.task_id
            key = task_id.encode("utf-8")
            if key in seen:
                continue
            seen.add(key)
            if tally.skip:
                tally.skip -= 1
                continue
            task = decode_dead_payload(framed)
        tally.take -= 1
        if isinstance(task, BadLine):
            tally.undecodable.append(task_id)  # its place in the page stays empty (S-34)
        else:
            yield task
        if not tally.take:
            return


_HEAD = b":" + DEAD_BODY_PREFIX  # what follows the CRC in a dead-task line


def _clean_id(line: bytes) -> bytes | None:
    """``clean_id`` of a whole line that may hold a NUL (then None: the exact path decides)."""
    return None if b"\0" in line else clean_id(line, 0, len(line))


Piece = tuple[RawLine | None, int, bytes, int, int, bool]


def _pieces_newest_first(blocks: Iterator[Block], tally: Tally) -> Iterator[Piece]:
    """Each block's lines, newest first, as ``(newer, lo, block, head, last, clean)``.

    ``newer`` is the line that starts after the block's last newline and ends in a later
    block (a ``RawLine``; one longer than ``LINE_BYTES_MAX`` has no bytes, R-@E, and is
    never held whole), or None; ``block[head:last]`` is the run of complete lines inside
    the block, starting at its first newline (empty when ``head >= last``); when the block
    starts the file (``lo == 0``), ``block[:head]`` is the file's first line.
    ``clean``: the block holds no NUL byte. A block without a newline yields only the line
    it ends, once that line starts the file (``head`` = -1).
    """
    partial: list[bytes] = []  # the head of a later block: the end of a line begun earlier
    partial_bytes = 0
    first = True
    for lo, block in blocks:
        tally.low = lo
        clean = b"\0" not in block
        last = block.rfind(b"\n")
        if last < 0:  # the whole block lies inside one line
            partial_bytes += len(block)
            if partial_bytes > LINE_BYTES_MAX:
                partial = []
            else:
                partial.append(block)
            if lo == 0:
                yield _joined(0, partial, partial_bytes), lo, b"", -1, -1, clean
            continue
        newer = None
        if not first:  # the line that starts after this block's last newline
            length = partial_bytes + len(block) - last - 1
            partial.append(block[last + 1:])
            newer = _joined(lo + last + 1, partial, length)
        first = False
        head = block.find(b"\n")
        yield newer, lo, block, head, last, clean
        partial = [block[:head]]
        partial_bytes = head


def _joined(start: int, pieces: list[bytes], length: int) -> RawLine:
    """A line made of ``pieces`` (newest piece first); over-long lines have no bytes (R-@E)."""
    if length > LINE_BYTES_MAX:
        return RawLine(start, None)
    return RawLine(start, pieces[0] if len(pieces) == 1 else b"".join(reversed(pieces)))


def records_end(env: Env, fd: int, size: int) -> int:
    """Just after the last newline of ``fd[:size]`` (0 if none): what follows is R-@F."""
    end = size
    while end > 0:
        start = max(0, end - READ_CHUNK_BYTES)
        newline = env.pread(fd, end - start, start).rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        end = start
    return 0


def pread_blocks(env: Env, fd: int, end: int) -> Iterator[Block]:
    """``fd[:end]`` backwards in ``READ_CHUNK_BYTES`` blocks (the caller holds the locks)."""
    while end > 0:
        start = max(0, end - READ_CHUNK_BYTES)
        chunk = env.pread(fd, end - start, start)
        if len(chunk) != end - start:
            raise OSError(f"short read at offset {start}: file changed while locked")
        yield start, chunk
        end = start


class Compacted(Exception):
    """A step found another data file than the snapshot's (S-29): the read restarts."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Snapshot:
    """What a stepped read checks before each step (S-28): the file and its last bytes."""

    device: int
    inode: int
    lock_ctime_ns: int
    end: int  # just after the last newline at the first step
    check_start: int
    check_crc: int
    torn: bool  # bytes after ``end`` at the first step (R-@F), counted once


class SteppedBlocks:
    """Blocks of the data file newest first, each read in its own lock step (S-27, L-6)."""

    def __init__(self, env: Env, data_path: str, lock_fd: int,
                 locked: Callable[[str], contextlib.AbstractContextManager[None]]) -> None:
        self._env = env
        self._data = data_path
        self._lock_fd = lock_fd
        self._locked = locked
        self.snapshot: Snapshot | None = None
        self._first: Block | None = None  # the newest block, read by the first step
        self.steps = 0

    def _open(self) -> int | None:
        try:
            return self._env.open(self._data, OpenFlag.READ)
        except FileNotFoundError:
            return None

    def _take_snapshot(self, fd: int) -> Snapshot:
        env = self._env
        stat = env.fstat(fd)
        end = records_end(env, fd, stat.size)
        # The checked bytes: the snapshot's last line, or its last READ_CHUNK_BYTES (S-28).
        low = max(0, end - READ_CHUNK_BYTES)
        tail = env.pread(fd, end - low, low)
        if len(tail) != end - low:
            raise OSError(f"short read at offset {low}: file changed while locked")
        before = tail.rfind(b"\n", 0, len(tail) - 1)
        check_start = low + before + 1 if before >= 0 else low
        # The first block of records is read in this same step: a page of the newest
        # records costs one hold of the locks.
        self._first = (low, tail) if tail else None
        return Snapshot(device=stat.device, inode=stat.inode,
                        lock_ctime_ns=env.fstat(self._lock_fd).ctime_ns, end=end,
                        check_start=check_start,
                        check_crc=zlib.crc32(memoryview(tail)[check_start - low:]),
                        torn=stat.size > end)

    def _same_file(self, fd: int, snap: Snapshot) -> bool:
        """Implements S-28: the file open as ``fd`` is the snapshot's, its bytes unchanged."""
        env = self._env
        stat = env.fstat(fd)
        if (stat.device, stat.inode) != (snap.device, snap.inode) or stat.size < snap.end:
            return False
        if env.fstat(self._lock_fd).ctime_ns != snap.lock_ctime_ns:
            return False
        window = env.pread(fd, snap.end - snap.check_start, snap.check_start)
        return zlib.crc32(window) == snap.check_crc

    def start(self) -> Snapshot:
        """The first step: open by path under the locks and note the snapshot (S-28)."""
        with self._locked("read tasks from"):
            self.steps += 1
            fd = self._open()
            if fd is None:  # a missing data file reads as empty
                snap = Snapshot(device=-1, inode=-1, lock_ctime_ns=0, end=0, check_start=0,
                                check_crc=0, torn=False)
            else:
                try:
                    snap = self._take_snapshot(fd)
                finally:
                    self._env.close(fd)
        self.snapshot = snap
        return snap

    def blocks(self) -> Iterator[Block]:
        """``[0, end)`` of the snapshot backwards, one lock step per block; ``Compacted``
        when a step finds another file (S-29). Blocks grow from one chunk to one step."""
        snap = self.snapshot
        assert snap is not None, "start() first"
        env = self._env
        hi = snap.end
        if self._first is not None:
            hi = self._first[0]
            yield self._first
            self._first = None
        want = 2 * READ_CHUNK_BYTES
        while hi > 0:
            lo = max(0, hi - want)
            with self._locked("read tasks from"):
                self.steps += 1
                fd = self._open()
                if fd is None:
                    raise Compacted("the data file is gone")
                try:
                    if not self._same_file(fd, snap):
                        raise Compacted("the data file was replaced")
                    block = env.pread(fd, hi - lo, lo)
                finally:
                    env.close(fd)
            if len(block) != hi - lo:
                raise Compacted(f"short read at offset {lo}")
            yield lo, block
            hi = lo
            want = min(2 * want, DEAD_READ_STEP_BYTES)


def stepped_tasks(make_blocks: Callable[[], SteppedBlocks], tally: Tally,
                  report: Callable[[Tally], None]) -> Iterator[DeadTask]:
    """Implements S-27..S-30: every dead task newest first, each id at most once, read in
    lock steps; after a compaction, again from the new file's end without the ids met."""
    try:
        for restart in range(DEAD_READ_RESTARTS_MAX + 1):
            stepper = make_blocks()
            snap = stepper.start()
            tally.corrupt += snap.torn
            try:
                yield from newest_first(stepper.blocks(), snap.end, tally)
                return
            except Compacted:
                log.info("the dead-task store was compacted during a read; reading on from"
                         " its new end (restart %d)", restart + 1)
        raise DeadTasksLockTimeout(
            f"Could not read the dead tasks store: it was compacted {DEAD_READ_RESTARTS_MAX + 1}"
            " times during one read")
    finally:
        report(tally)
