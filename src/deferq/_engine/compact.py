"""The streaming copy of a dead-task compaction (S-5, S-15).

Theory of operation: ``remove_dead_tasks`` copies every record it keeps to the
staging file in one forward pass over the data file, in bounded chunks, and
renames the copy over the data file (``_deadstore``). This module is that pass:
runs of surviving lines are copied as slices of the chunk, each line's frame is
checked (CRC and id) without decoding its payload, and a damaged line is dropped
and counted exactly as ``_recovery``'s line splitter would count it.
``tests/property/test_dead_index.py`` checks it against a line-by-line reference
under any chunking and any damage.
"""

from __future__ import annotations

from zlib import crc32

from deferq._engine.deadindex import DEAD_BODY_PREFIX, ID_START, dead_line
from deferq._engine.env import Env
from deferq._core.frame import CRC_HEX_BYTES, HEADER_BYTES
from deferq._engine.io import chunks_forward, write_all
from deferq._core.limits import LINE_BYTES_MAX, TASK_ID_BYTES_MAX, WRITE_BATCH_BYTES
from deferq._core.recovery import ChunkLines, RawLine


def copy_survivors(env: Env, fd: int, tmp_fd: int, task_ids: set[str]) -> tuple[set[str], int]:
    """Implements S-5, S-15: copy every valid record of ``fd`` not requested to ``tmp_fd``.

    Returns the requested ids found and the number of damaged lines dropped.

    One forward pass in ``READ_CHUNK_BYTES`` chunks; each line's frame is
    checked (CRC and id) but no payload is decoded, and runs of surviving
    lines are copied as slices of the chunk (``ChunkLines`` carries the lines
    that span chunks). Damaged lines are dropped and counted exactly as the
    line splitter of ``_recovery`` would (R-@B..R-@F, R-@K): only lines that are
    not a clean valid record, or that span two chunks, take the slow path
    through ``dead_line``.
    """
    wanted = {task_id.encode("utf-8"): task_id for task_id in task_ids}
    found: set[str] = set()
    out = _Batches(env, tmp_fd)
    dropped = 0
    lines = ChunkLines(0, LINE_BYTES_MAX)  # read here: a test patches this module's limit
    for chunk in chunks_forward(env, fd, env.fstat(fd).size):
        pos, end, spanning = lines.feed(chunk)
        if spanning is not None:  # a line that began in an earlier chunk: the slow path
            if spanning.data is None:
                dropped += 1  # R-@E
            else:
                dropped += _copy_line(out, spanning.data, task_ids, found)
        clean = b"\0" not in chunk
        run = pos  # where the current run of surviving lines started
        view = memoryview(chunk)
        while pos < end:
            newline = chunk.find(b"\n", pos)
            short = newline - pos <= LINE_BYTES_MAX
            # clean_id(chunk, pos, newline), inlined: this loop runs once per record.
            raw_id = None
            id_start = pos + ID_START
            if (clean and short and id_start < newline
                    and chunk[pos + CRC_HEX_BYTES] == 0x3A
                    and chunk.startswith(DEAD_BODY_PREFIX, pos + HEADER_BYTES)
                    and b"%08x" % crc32(view[pos + HEADER_BYTES:newline])
                    == chunk[pos:pos + CRC_HEX_BYTES]):
                colon = chunk.find(b":", id_start, newline)
                if colon > id_start:
                    raw_id = chunk[id_start:colon]
                    if not raw_id.isascii() or len(raw_id) > TASK_ID_BYTES_MAX:
                        raw_id = None
            if raw_id is not None and raw_id not in wanted:
                pass  # a survivor: it stays in the run
            else:
                out.add(chunk[run:pos])
                if raw_id is not None:
                    found.add(wanted[raw_id])
                elif not short:
                    dropped += 1  # R-@E
                else:
                    dropped += _copy_line(out, chunk[pos:newline], task_ids, found)
                run = newline + 1
            pos = newline + 1
        out.add(chunk[run:end])
    if lines.torn:
        dropped += 1  # the torn tail (R-@F)
    out.flush()
    return found, dropped


class _Batches:
    """Bytes for the staging file, written in batches of about ``WRITE_BATCH_BYTES`` (S-15)."""

    def __init__(self, env: Env, fd: int) -> None:
        self._env = env
        self._fd = fd
        self._parts: list[bytes] = []
        self._bytes = 0

    def add(self, data: bytes) -> None:
        if data:
            self._parts.append(data)
            self._bytes += len(data)
            if self._bytes >= WRITE_BATCH_BYTES:
                self.flush()

    def flush(self) -> None:
        if self._parts:
            write_all(self._env, self._fd, b"".join(self._parts))
            self._parts, self._bytes = [], 0


def _copy_line(out: _Batches, line: bytes, task_ids: set[str], found: set[str]) -> int:
    """The slow path of one complete line: keep it, drop it, or keep its R-@K rest."""
    framed, data, faults = dead_line(RawLine(0, line))
    if framed is not None and data is not None:
        if framed.task_id in task_ids:
            found.add(framed.task_id)
        else:
            out.add(data + b"\n")
    return faults
