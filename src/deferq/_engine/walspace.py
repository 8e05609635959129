"""Where the tasks WAL's records go: space reserved past them, a shared mapping of it, and
``write`` otherwise (spec/wal.md W-13, W-25, W-26).

Rules: space is reserved past the records before a write would pass its end (W-25); where
the filesystem allows, the reserved space is mapped and records are stored into the mapping
(W-26), else written with ``write`` at the end of the records; a failed write is cut back off
the file, or the WAL fail-stops (W-13). Reserving and mapping only save work: when either
fails, writes go ahead as appends. Part of ``TasksWal`` (see ``walbase``).
"""

from __future__ import annotations

import errno
import logging
from typing import Final

from deferq._core.errors import StorageBrokenError
from deferq._engine.io import join, name_file, write_all
from deferq._engine.walbase import WalBase

log = logging.getLogger("deferq")

# allocate() errors meaning "this filesystem cannot reserve": stop trying (W-25).
_NO_RESERVE_ERRNOS: Final = frozenset({errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS,
                                       errno.EINVAL})
NEVER: Final = 1 << 62  # a reserved end no record reaches: reserving is off


class WalSpace(WalBase):
    """The reserved space, its mapping, and writing and cutting back records."""

    def _write_line(self, line: bytes) -> None:
        """Write ``line`` at the end of the records with ``write`` (no mapped window, W-26)."""
        if self._offset_stale:  # records were stored through a window since the last write
            self._env.seek(self._fd, self._size)
            self._offset_stale = False
        done = self._write(self._fd, line)
        if done != len(line):
            self._write_rest(line, done)

    def _write_rest(self, line: bytes, done: int) -> None:
        """A short write of ``line`` (``done`` bytes went out): write the rest (A-6)."""
        if done <= 0:
            raise OSError(f"write returned {done} with {len(line)} bytes left")
        write_all(self._env, self._fd, line[done:])

    def _unmap(self) -> None:
        """Release the mapped window, if any (W-26); its stores stay in the file."""
        window = self._window
        if window is not None:
            self._window = None
            window.close()

    def _reserve(self, size: int) -> None:
        """Implements W-25: reserve space past the records before a write would pass its end.

        ``Env.reserve_bytes`` (``WAL_RESERVE_BYTES`` on the real OS), and at least the
        ``size`` of the record about to be written, from the end of the records.
        Reserving only saves fsync work: when it fails the write goes ahead and grows
        the file as an append would (a full disk then fails the write itself, W-13);
        a filesystem that cannot reserve is not asked again.
        """
        length = max(self._reserve_step, size)
        self._unmap()
        try:
            self._env.allocate(self._fd, self._size, length)
        except OSError as exc:
            if exc.errno in _NO_RESERVE_ERRNOS:
                self._reserved = NEVER
            return
        self._reserved = self._size + length
        if self._mapping:
            self._map_reserved()

    def _map_reserved(self) -> None:
        """Implements W-26: map the reserved space, from the page the records end in.

        A filesystem or a process that cannot map (``OSError``) makes this WAL write
        its records with ``write`` from then on: mapping only saves system calls.
        """
        base = self._size - self._size % self._env.map_granularity
        try:
            self._window = self._env.map_shared(self._fd, base, self._reserved - base)
        except OSError:
            log.info("mapping the tasks WAL failed; writing its records instead", exc_info=True)
            self._mapping = False
            return
        self._base = base
        self._offset_stale = True

    def _append(self, data: bytes) -> None:
        """Store ``data`` (whole records) at the end of the records, through the mapped window
        when there is one (W-26), in one write otherwise; on a failure cut it all back (W-13)
        and raise. The mutex is held. (``add`` and ``remove`` inline this: the hot path.)"""
        start = self._size
        end = start + len(data)
        if end > self._reserved:
            self._reserve(end - start)
        window = self._window
        try:
            if window is not None:
                window[start - self._base:end - self._base] = data
            else:
                self._write_line(data)
        except OSError as exc:
            self._cut_back(exc)
            raise
        self._size = end

    def _cut_back(self, failure: OSError) -> None:
        """Implements W-13: a write failed; cut its partial line back off, or fail-stop.

        Called from the ``except OSError`` of an append, which re-raises ``failure``, now
        naming the file. The cut drops the reserved space too (W-25), and the descriptor's
        offset is moved back to the end of the records, where the next write must go.
        """
        name_file(failure, join(self._path, self._name))
        try:
            self._unmap()  # a store past the cut would be past the file's end (SIGBUS)
            self._env.ftruncate(self._fd, self._size)
            if self._reserved != NEVER:
                self._reserved = self._size
            self._env.seek(self._fd, self._size)
            self._offset_stale = False
        except OSError as exc:
            raise self._break(StorageBrokenError(
                f"a write to the tasks WAL failed ({failure}) and its partial line could not be"
                f" cut off ({name_file(exc, join(self._path, self._name))})")) from exc
