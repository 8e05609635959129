"""The tracing ``Env``: a ``SimEnv`` wrapper that records every seam-level call, in order.

The crash explorer runs each workload once through a ``TracingEnv`` and derives the
workload's crash points from the recorded ``Call`` list (``_crashrun.crash_points``);
tests subclass it to hook individual calls.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from deferq._engine.env import Cancel as _Cancel
from deferq._engine.env import Condition as _Condition
from deferq._engine.env import Mutex as _Mutex
from deferq._engine.env import FileStat as _FileStat
from deferq._engine.env import MappedWindow as _MappedWindow
from deferq._engine.env import OpenFlag as _OpenFlag
from deferq.crashtest._simenv import SimEnv
from deferq.crashtest._window import ForwardingWindow

__all__ = [
    "Call",
    "TracingEnv",
]


@dataclass(frozen=True, slots=True)
class Call:
    """One seam-level file or namespace call of the traced run."""

    op: str
    path: str
    nbytes: int
    pid: int


class TracingEnv:
    """An ``Env`` that records every file and namespace call of a ``SimEnv``, in order."""

    def __init__(self, inner: SimEnv, trace: list[Call]) -> None:
        self.inner = inner
        self.reserve_bytes = inner.reserve_bytes
        self.map_granularity = inner.map_granularity
        self._trace = trace
        self._pid = inner.getpid()

    def _rec(self, op: str, path: str, nbytes: int = 0) -> None:
        self._trace.append(Call(op, path, nbytes, self._pid))

    def _fd_path(self, fd: int) -> str:
        try:
            return self.inner.path_of(fd)
        except OSError:
            return "?"

    def open(self, path: str, flags: _OpenFlag, mode: int = 0o600) -> int:
        self._rec("open", path)
        return self.inner.open(path, flags, mode)

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        self._rec("pread", self._fd_path(fd))
        return self.inner.pread(fd, size, offset)

    def write(self, fd: int, data: bytes) -> int:
        self._rec("write", self._fd_path(fd), len(data))
        return self.inner.write(fd, data)

    def fsync(self, fd: int) -> None:
        self._rec("fsync", self._fd_path(fd))
        self.inner.fsync(fd)

    def ftruncate(self, fd: int, size: int) -> None:
        self._rec("ftruncate", self._fd_path(fd))
        self.inner.ftruncate(fd, size)

    def allocate(self, fd: int, offset: int, length: int) -> None:
        self._rec("allocate", self._fd_path(fd), length)
        self.inner.allocate(fd, offset, length)

    def seek(self, fd: int, offset: int) -> None:
        self._rec("seek", self._fd_path(fd))
        self.inner.seek(fd, offset)

    def map_shared(self, fd: int, offset: int, length: int) -> _MappedWindow:
        self._rec("map", self._fd_path(fd), length)
        path = self._fd_path(fd)
        # A store is traced as the write of the file's data it is (W-26).
        return ForwardingWindow(self.inner.map_shared(fd, offset, length),
                                lambda size: self._rec("write", path, size))

    def fstat(self, fd: int) -> _FileStat:
        self._rec("fstat", self._fd_path(fd))
        return self.inner.fstat(fd)

    def close(self, fd: int) -> None:
        self._rec("close", self._fd_path(fd))
        self.inner.close(fd)

    def flock_exclusive_nb(self, fd: int) -> bool:
        self._rec("flock_exclusive_nb", self._fd_path(fd))
        return self.inner.flock_exclusive_nb(fd)

    def flock_unlock(self, fd: int) -> None:
        self._rec("flock_unlock", self._fd_path(fd))
        self.inner.flock_unlock(fd)

    def rename(self, src: str, dst: str) -> None:
        self._rec("rename", src)
        self.inner.rename(src, dst)

    def unlink(self, path: str) -> None:
        self._rec("unlink", path)
        self.inner.unlink(path)

    def makedirs(self, path: str, mode: int = 0o700) -> None:
        self._rec("makedirs", path)
        self.inner.makedirs(path, mode)

    def listdir(self, path: str) -> list[str]:
        self._rec("listdir", path)
        return self.inner.listdir(path)

    def fsync_dir(self, path: str) -> None:
        self._rec("fsync_dir", path)
        self.inner.fsync_dir(path)

    def time(self) -> float:
        return self.inner.time()

    def monotonic(self) -> float:
        return self.inner.monotonic()

    def sleep(self, seconds: float) -> None:
        self.inner.sleep(seconds)

    def getpid(self) -> int:
        return self.inner.getpid()

    def random_u32(self) -> int:
        return self.inner.random_u32()

    def local_date(self) -> str:
        return self.inner.local_date()

    def call_every(self, interval_s: float, callback: Callable[[], None]) -> _Cancel:
        return self.inner.call_every(interval_s, callback)

    def mutex(self) -> _Mutex:
        return self.inner.mutex()

    def condition(self, mutex: _Mutex) -> _Condition:
        return self.inner.condition(mutex)
