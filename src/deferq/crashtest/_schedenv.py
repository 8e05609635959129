"""ScheduledEnv: an ``Env`` proxy whose every call is a checkpoint of a ``Scheduler``.

Rules: before each seam call the proxy parks the calling thread at a checkpoint named
after the call (``Scheduler.checkpoint``), then makes the call on the wrapped Env; a
store into a mapped window is a ``write`` checkpoint (W-26). The process-local
synchronisation of the seam is never the wrapped Env's: ``mutex`` and ``condition``
make the scheduler's own ``SchedMutex`` and ``SchedCondition`` (M-15), labelled with
where the engine made them, so that a deadlock names them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from deferq._engine.env import Cancel, Condition, Env, FileStat, MappedWindow, Mutex, OpenFlag
from deferq.crashtest._schedsync import SchedCondition, SchedMutex
from deferq.crashtest._window import ForwardingWindow

if TYPE_CHECKING:
    from deferq.crashtest._scheduler import Scheduler


class ScheduledEnv:
    """An ``Env`` proxy: a scheduler checkpoint, then the wrapped call."""

    def __init__(self, scheduler: Scheduler, env: Env) -> None:
        self._scheduler = scheduler
        self.inner = env
        self.reserve_bytes = env.reserve_bytes
        self.map_granularity = env.map_granularity

    def _point(self, op: str) -> None:
        self._scheduler.checkpoint(op)

    # --- files
    def open(self, path: str, flags: OpenFlag, mode: int = 0o600) -> int:
        self._point("open")
        return self.inner.open(path, flags, mode)

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        self._point("pread")
        return self.inner.pread(fd, size, offset)

    def write(self, fd: int, data: bytes) -> int:
        self._point("write")
        return self.inner.write(fd, data)

    def fsync(self, fd: int) -> None:
        self._point("fsync")
        self.inner.fsync(fd)

    def ftruncate(self, fd: int, size: int) -> None:
        self._point("ftruncate")
        self.inner.ftruncate(fd, size)

    def allocate(self, fd: int, offset: int, length: int) -> None:
        self._point("allocate")
        self.inner.allocate(fd, offset, length)

    def seek(self, fd: int, offset: int) -> None:
        self._point("seek")
        self.inner.seek(fd, offset)

    def map_shared(self, fd: int, offset: int, length: int) -> MappedWindow:
        self._point("map")
        # Each store is a scheduling point, as a write is (W-26).
        return ForwardingWindow(self.inner.map_shared(fd, offset, length),
                                lambda size: self._point("write"))

    def fstat(self, fd: int) -> FileStat:
        self._point("fstat")
        return self.inner.fstat(fd)

    def close(self, fd: int) -> None:
        self._point("close")
        self.inner.close(fd)

    def flock_exclusive_nb(self, fd: int) -> bool:
        self._point("flock_exclusive_nb")
        return self.inner.flock_exclusive_nb(fd)

    def flock_unlock(self, fd: int) -> None:
        self._point("flock_unlock")
        self.inner.flock_unlock(fd)

    # --- names
    def rename(self, src: str, dst: str) -> None:
        self._point("rename")
        self.inner.rename(src, dst)

    def unlink(self, path: str) -> None:
        self._point("unlink")
        self.inner.unlink(path)

    def makedirs(self, path: str, mode: int = 0o700) -> None:
        self._point("makedirs")
        self.inner.makedirs(path, mode)

    def listdir(self, path: str) -> list[str]:
        self._point("listdir")
        return self.inner.listdir(path)

    def fsync_dir(self, path: str) -> None:
        self._point("fsync_dir")
        self.inner.fsync_dir(path)

    # --- process facts
    def time(self) -> float:
        self._point("time")
        return self.inner.time()

    def monotonic(self) -> float:
        self._point("monotonic")
        return self.inner.monotonic()

    def sleep(self, seconds: float) -> None:
        self._point("sleep")
        self.inner.sleep(seconds)

    def getpid(self) -> int:
        self._point("getpid")
        return self.inner.getpid()

    def random_u32(self) -> int:
        self._point("random_u32")
        return self.inner.random_u32()

    def local_date(self) -> str:
        self._point("local_date")
        return self.inner.local_date()

    def call_every(self, interval_s: float, callback: Callable[[], None]) -> Cancel:
        self._point("call_every")
        return self.inner.call_every(interval_s, callback)

    # --- process-local synchronisation (M-15): made here, never by the inner Env
    def mutex(self) -> Mutex:
        return SchedMutex(self._scheduler, _made_at())

    def condition(self, mutex: Mutex) -> Condition:
        if not isinstance(mutex, SchedMutex):
            raise TypeError(f"a ScheduledEnv's condition needs one of its mutexes, not {mutex!r}")
        return SchedCondition(self._scheduler, mutex, _made_at())

    def __repr__(self) -> str:
        return f"ScheduledEnv({self.inner!r})"


def _made_at() -> str:
    """Where the engine made a mutex or condition: ``file:line qualified.name``."""
    frame = sys._getframe(2)  # noqa: SLF001 - the caller of ScheduledEnv.mutex/condition
    file = frame.f_code.co_filename.rsplit("/", 1)[-1]
    return f"{file}:{frame.f_lineno} {frame.f_code.co_qualname}"




if TYPE_CHECKING:
    def _implements_env(env: ScheduledEnv) -> Env:
        return env
