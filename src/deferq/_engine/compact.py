"""Dead-task compaction: ``remove`` and its streaming copy (spec/dead-tasks.md S-5, S-9, S-15,
S-16).

Rules: the live data file is never rewritten in place. Survivors go to the
staging file ``.tmp``, which is fsynced, renamed over the data file, and the
directory fsynced before ``remove`` returns (S-5, D-9); with no match the live
file stays byte-identical and nothing is fsynced. A copy or fsync of the staging
file that fails (ENOSPC, EIO) unlinks it before the error propagates (S-16).
While a rename may not be durable yet the lock file's size is
``COMPACTION_MARK_BYTES`` (S-9), so that the next writer under the lock fsyncs
the directory before it acknowledges anything written to the new inode
(``_settle_compaction``, called by every add and remove).

Theory of operation: ``DeadCompaction.remove`` runs under the store's locks
(L-1..L-3) and drops the per-process index before the rename (S-10).
``copy_survivors`` copies every record it keeps to the staging file in one
forward pass over the data file, in bounded chunks: runs of surviving lines are
copied as slices of the chunk, each line's frame is checked (CRC and id) without
decoding its payload, and a damaged line is dropped and counted exactly as
``_recovery``'s line splitter would count it. ``tests/property/test_dead_index.py``
checks it against a line-by-line reference under any chunking and any damage.

``DeadCompaction`` is a mixin of ``deadstore.DeadTaskStore``, not a separate
object: it shares the store's locks, lock file and index, and the crash
catalogue's mutants override ``remove`` on the store and call its
``_copy_survivors``. The attributes and methods declared in it without a body
are the store's (``deadstore.py``) or its reads' (``deadreads.py``).
"""

from __future__ import annotations

import contextlib
import errno
from typing import TYPE_CHECKING, Final
from zlib import crc32

from deferq._core.errors import StorageBrokenError, UnsafeEntryError
from deferq._core.frame import CRC_HEX_BYTES, HEADER_BYTES
from deferq._core.limits import (
    FILE_MODE,
    LINE_BYTES_MAX,
    TASK_ID_BYTES_MAX,
    WRITE_BATCH_BYTES,
)
from deferq._core.recovery import ChunkLines, RawLine, capped_line
from deferq._engine.deadindex import DEAD_BODY_PREFIX, ID_START, dead_line
from deferq._engine.env import Env, OpenFlag
from deferq._engine.io import chunks_forward, name_file, write_all
from deferq._engine.lazylog import Log

log = Log("deferq")  # logging itself on the first message (lazylog.py)

# The lock file holds no data; its size says whether a compaction's rename may not be
# durable yet (S-9): 0 = settled, COMPACTION_MARK_BYTES = a rename is in flight.
COMPACTION_MARK_BYTES = 1
_STAGING: Final = OpenFlag.WRITE | OpenFlag.CREATE | OpenFlag.TRUNCATE
# The errors only a write raises (a full disk, a quota, a file-size limit): during a
# compaction they are the staging file's, which the message then names.
_FULL_ERRNOS: Final = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


class DeadCompaction:
    """The removal of ``DeadTaskStore``: compaction through a staging file (S-5, S-9, S-15)."""

    # The store's state (deadstore.DeadTaskStore.__init__).
    _env: Env
    _path: str
    _data: str
    _tmp: str
    _lock_fd: int

    if TYPE_CHECKING:  # defined by DeadTaskStore and DeadReads
        def _locked(self, operation: str) -> contextlib.AbstractContextManager[None]: ...
        def _check_usable(self) -> None: ...
        def _open_data(self, flags: OpenFlag) -> int | None: ...
        def _fail_stop(self, message: str, exc: OSError) -> StorageBrokenError: ...
        def _drop_index(self) -> None: ...

    def _open_staging(self) -> int:
        """The staging file, created empty (S-5); whatever else holds its name is removed first.

        Implements F-16: the name is deferq's, so a planted link or FIFO there is unlinked
        (``unlink`` never follows a link) and a fresh file created exclusively, never
        followed or waited on. The usual case, a regular file or none, is one ``open``.
        """
        env = self._env
        try:
            return env.open(self._tmp, _STAGING, FILE_MODE)
        except UnsafeEntryError:
            log.warning("%s is not a regular file; removing it before compacting", self._tmp)
            env.unlink(self._tmp)
            return env.open(self._tmp, _STAGING | OpenFlag.EXCLUSIVE, FILE_MODE)

    def remove(self, task_ids: set[str]) -> int:
        """Compact away every record of the given ids (S-5); return how many ids were found."""
        if not task_ids:
            self._check_usable()  # C-9, W-14: refused even as a no-op.
            return 0  # Implements S-5: no lock, no file touched.
        env = self._env
        with self._locked("delete tasks from"):
            self._settle_compaction()
            tmp_fd = self._open_staging()
            try:
                try:
                    found = self._copy_survivors(tmp_fd, task_ids)
                    if found:
                        # A failure leaves the live file untouched: no fail-stop.
                        try:
                            env.fsync(tmp_fd)
                        except OSError as exc:
                            name_file(exc, self._tmp)
                            raise
                finally:
                    env.close(tmp_fd)
            except Exception as exc:
                # Implements S-16: a partial staging file left behind on a full disk would keep
                # the space it took, and every later add would fail with ENOSPC too. Not on a
                # BaseException: a dead (or simulated-dead) process runs no more disk code.
                if isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS:
                    name_file(exc, self._tmp)  # only a write fails so: the staging file's
                self._discard_staging()
                raise
            if not found:
                env.unlink(self._tmp)  # Implements S-41: the live file stays byte-identical.
                return 0
            # Implements S-9: mark the rename in flight, so that if this process dies before
            # the directory fsync, the next writer under the lock makes the rename durable
            # before it acknowledges anything written to the new inode.
            self._drop_index()  # S-10: the data file is about to be another inode
            env.ftruncate(self._lock_fd, COMPACTION_MARK_BYTES)
            env.rename(self._tmp, self._data)
            self._fsync_dir_after_rename()
            return len(found)

    def _discard_staging(self) -> None:
        """Implements S-16: unlink the staging file of a failed compaction, best effort.

        Called while the compaction's own error propagates: a failure here is only logged,
        so that the caller sees the error that made the compaction fail, not this one.
        """
        try:
            self._env.unlink(self._tmp)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("could not remove the staging file %s of a failed compaction: %s",
                        self._tmp, exc)

    def _fsync_dir_after_rename(self) -> None:
        try:
            self._env.fsync_dir(self._path)
        except OSError as exc:
            # The rename may be undone by a power loss, and with it any add that a later
            # operation makes to the new inode: stop (D-10, A-7). The mark stays set.
            raise self._fail_stop("fsync of the storage directory after compaction failed",
                                  name_file(exc, self._path)) from exc
        self._env.ftruncate(self._lock_fd, 0)

    def _settle_compaction(self) -> None:
        """Implements S-9: finish the directory fsync of a compaction whose process died.

        The mark is the lock file's size, 0 or ``COMPACTION_MARK_BYTES``: a read of its
        first byte tells the two apart in one system call, like an fstat, without
        building a stat result (about 9k instructions, 5 % of a dead-task add).
        """
        if self._env.pread(self._lock_fd, COMPACTION_MARK_BYTES, 0):
            log.warning("a compaction of %s ended before its rename was made durable; "
                        "fsyncing the directory now", self._data)
            self._fsync_dir_after_rename()

    def _copy_survivors(self, tmp_fd: int, task_ids: set[str]) -> set[str]:
        """Implements S-5, S-15: copy every valid record not requested to ``tmp_fd``.

        Returns the requested ids found; logs the damaged lines dropped (S-44).
        """
        env = self._env
        fd = self._open_data(OpenFlag.READ)
        if fd is None:
            return set()
        try:
            found, dropped = copy_survivors(env, fd, tmp_fd, task_ids)
        finally:
            env.close(fd)
        if dropped and found:
            log.warning("Compaction of %s dropped %d corrupted dead-lettered task record(s)",
                        self._data, dropped)
        return found


# ---------------------------------------------------------------------- the streaming copy


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
            dropped += _copy_line(out, spanning, task_ids, found)
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
                else:  # R-@K is cut before R-@E is checked
                    dropped += _copy_line(out, capped_line(0, chunk[pos:newline], LINE_BYTES_MAX),
                                          task_ids, found)
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


def _copy_line(out: _Batches, line: RawLine, task_ids: set[str], found: set[str]) -> int:
    """The slow path of one complete line: keep it, drop it, or keep its R-@K rest."""
    framed, data, faults = dead_line(line)
    if framed is not None and data is not None:
        if framed.task_id in task_ids:
            found.add(framed.task_id)
        else:
            out.add(data + b"\n")
    return faults
