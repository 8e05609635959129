"""What the parts of the tasks WAL share: its states and its attributes (spec/wal.md).

Theory of operation: ``TasksWal`` (``wal``) is one object assembled from one class per job:
the file lifecycle (``walfiles.WalFiles``: claim, create, copy, retire), the space records go
into (``walspace.WalSpace``: reserve, map, write, cut back) and durability
(``walsync.WalSync``: group commit and fsync). They are mixins, not separate objects,
because the append path (``TasksWal.add``/``remove``, the hottest code in deferq, tuned
instruction by instruction) reads and writes these attributes directly: one object keeps
each access one attribute lookup, where a helper object would add a hop per record. Each
part reads only the attributes declared here, which ``TasksWal.__init__`` sets.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Final

from deferq._core.errors import StorageBrokenError, StorageClosedError
from deferq._engine.env import Condition, Env, MappedWindow, Mutex
from deferq._engine.ids import IdSource


class WalState(enum.Enum):
    OPEN = "open"
    BROKEN = "broken"
    CLOSED = "closed"


OPEN: Final = WalState.OPEN  # one global lookup on the hot path instead of two


class WalBase:
    """The attributes every part of ``TasksWal`` uses (set by ``TasksWal.__init__``)."""

    # Where and who: the seam, the directory, the prefix, the opening process.
    _env: Env
    _path: str
    _prefix: str
    _pid: int
    _state: WalState
    _broken_reason: str  # why the WAL broke, repeated by every call it refuses (W-12)
    # Group commit (W-20, W-21): the mutex, the condition fsync waiters sleep on, the
    # tickets written and covered by a completed fsync, and the fsync in flight.
    _mutex: Mutex
    _synced: Condition
    _written: int
    _durable: int
    _syncing: bool
    _sync_failed: bool
    _fsync_frequency_s: float
    _sync_due_s: float
    # The live tasks (id -> add line) and the id source (W-28, W-7).
    _live: dict[str, bytes]
    _ids: IdSource
    corrupt_records: int  # damaged records met while adopting (W-3)
    # The main file, the end of its records, the reserved space and its mapping (W-25, W-26).
    _name: str
    _fd: int
    _size: int
    _reserved: int
    _reserve_step: int
    _window: MappedWindow | None
    _base: int
    _offset_stale: bool
    _mapping: bool
    _limit: int
    _held_fds: list[int]  # files kept locked until close (see WalFiles._discard_copy)
    # Env methods of the hot path, bound once (W-14 compares the pid on every call).
    _write: Callable[[int, bytes], int]
    _getpid: Callable[[], int]
    _monotonic: Callable[[], float]

    def _break(self, error: StorageBrokenError) -> StorageBrokenError:
        """Implements W-12: the WAL is broken for good; ``error`` says why, and so will every
        call it refuses from now on. Returns ``error`` for the caller to raise."""
        self._state = WalState.BROKEN
        self._broken_reason = str(error)
        return error

    def _check_usable(self) -> None:
        if self._state is WalState.CLOSED:
            raise StorageClosedError("the Disk backend is closed")
        if self._state is WalState.BROKEN:
            raise StorageBrokenError(
                f"the tasks WAL refuses work since an earlier failure ({self._broken_reason});"
                " restart the worker")
        if self._env.getpid() != self._pid:
            raise RuntimeError(
                f"this Disk was opened by process {self._pid}; a forked child must open its own")
