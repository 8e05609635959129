"""Test helpers around the real ``OsEnv``: recording, fault injection and a manual clock.

Goal: let tests on the real filesystem assert *which* system calls the engine
made and in what order ("fsync(tmp) before rename before fsync_dir", "no fsync
happened"), make chosen calls fail the way disks fail (EIO, ENOSPC, short
writes), and control time without sleeping.

Method: ``RecordingEnv`` subclasses ``OsEnv`` and appends one ``Call`` per seam
method before delegating to the operating system; it maps descriptors back to
the paths they were opened with, so every fd-based call is recorded with its
path. ``FaultyEnv`` adds ``inject()``: the Nth matching call of an operation
raises an ``OSError`` (or, for ``write``, writes only a prefix). A
``ManualClock`` passed to either env replaces ``time``, ``monotonic``,
``sleep`` and ``call_every``: sleeping advances the clock and is recorded,
timers are recorded and fired only by ``fire_timers()``.

This is a helper module, not a test module (pytest collects only ``test_*.py``).
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from deferq._engine.env import Cancel, FileStat, MappedWindow, OpenFlag
from deferq._engine.osenv import OsEnv
from deferq.crashtest._window import ForwardingWindow

__all__ = ["Call", "Fault", "FaultyEnv", "ManualClock", "RecordingEnv", "Timer", "append_to_wal",
           "snapshot", "wal_bytes", "wal_size"]


def snapshot(directory: str | os.PathLike[str]) -> dict[str, bytes]:
    """Every regular file directly in ``directory``, name to bytes (to prove nothing changed)."""
    out: dict[str, bytes] = {}
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        if entry.is_file(follow_symlinks=False):
            with open(entry.path, "rb") as handle:
                out[entry.name] = handle.read()
    return out


def wal_bytes(path: str | os.PathLike[str]) -> bytes:
    """A WAL file's records: its bytes without the space reserved after them (R-@L, W-25)."""
    with open(path, "rb") as handle:
        return handle.read().rstrip(b"\0")


def wal_size(path: str | os.PathLike[str]) -> int:
    """Where a WAL file's records end (R-@L): its size without its reserved space."""
    return len(wal_bytes(path))


def append_to_wal(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` where a WAL file's records end, over its reserved space, as its writer
    would (W-25); appending after the reserved zeros would make them a hole (R-@K)."""
    end = wal_size(path)
    with open(path, "r+b") as handle:
        handle.seek(end)
        handle.write(data)


# ----------------------------------------------------------------------------- clock


@dataclass(slots=True)
class Timer:
    """A periodic callback registered through ``call_every``; never runs by itself."""

    interval_s: float
    callback: Callable[[], None]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """Explicit wall and monotonic clocks; ``sleep`` advances both and is recorded.

    Args:
        wall: the initial ``time()`` in epoch seconds.
        mono: the initial ``monotonic()``.
    """

    def __init__(self, wall: float = 1_700_000_000.0, mono: float = 1_000.0) -> None:
        self.wall = wall
        self.mono = mono
        self.sleeps: list[float] = []
        self.timers: list[Timer] = []
        self.on_sleep: Callable[[float], None] | None = None
        self._mutex = threading.Lock()

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass on both clocks."""
        assert seconds >= 0, "time does not go back on its own; use set_wall"
        with self._mutex:
            self.wall += seconds
            self.mono += seconds

    def set_wall(self, wall: float) -> None:
        """Step the wall clock (forwards or backwards) without touching the monotonic one."""
        self.wall = wall

    def time(self) -> float:
        return self.wall

    def monotonic(self) -> float:
        return self.mono

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.advance(seconds)
        if self.on_sleep is not None:
            self.on_sleep(seconds)

    def call_every(self, interval_s: float, callback: Callable[[], None]) -> Cancel:
        timer = Timer(interval_s, callback)
        self.timers.append(timer)
        return timer

    def active_timers(self) -> list[Timer]:
        return [t for t in self.timers if not t.cancelled]

    def fire_timers(self) -> None:
        """Call every timer that has not been cancelled once, as its thread would."""
        for timer in self.active_timers():
            timer.callback()


# ----------------------------------------------------------------------------- recording


@dataclass(frozen=True, slots=True)
class Call:
    """One seam call: the operation, the path it concerned and, where useful, an fd and a size.

    ``path`` is the path given (open, rename source, unlink, fsync_dir, ...) or
    the path the descriptor was opened with; ``dst`` is the rename target;
    ``size`` is the byte count asked for (pread), written (write) or set (ftruncate).
    """

    op: str
    path: str | None = None
    fd: int | None = None
    size: int | None = None
    dst: str | None = None
    flags: OpenFlag | None = None


class RecordingEnv(OsEnv):
    """``OsEnv`` that records every call (see ``Call``) before performing it.

    Args:
        clock: when given, time, sleep and timers come from it instead of the OS.
    """

    def __init__(self, clock: ManualClock | None = None) -> None:
        self.clock = clock
        self.calls: list[Call] = []
        self._paths: dict[int, str] = {}
        self._rec_mutex = threading.Lock()

    # --- bookkeeping
    def _record(self, op: str, path: str | None = None, *, fd: int | None = None,
                size: int | None = None, dst: str | None = None,
                flags: OpenFlag | None = None) -> None:
        if path is None and fd is not None:
            path = self._paths.get(fd)
        with self._rec_mutex:
            self.calls.append(Call(op, path, fd, size, dst, flags))

    def clear(self) -> None:
        """Forget the calls recorded so far."""
        with self._rec_mutex:
            self.calls.clear()

    def path_of(self, fd: int) -> str | None:
        return self._paths.get(fd)

    def ops(self, path: str | None = None) -> list[str]:
        """Operation names in order, optionally only those concerning ``path``."""
        return [c.op for c in self.calls if path is None or c.path == path]

    def calls_of(self, op: str, path: str | None = None) -> list[Call]:
        return [c for c in self.calls if c.op == op and (path is None or c.path == path)]

    def index(self, op: str, path: str | None = None, *, start: int = 0) -> int:
        """Position of the first ``op`` call (on ``path``) at or after ``start``; ValueError if none."""
        for i in range(start, len(self.calls)):
            call = self.calls[i]
            if call.op == op and (path is None or call.path == path):
                return i
        raise ValueError(f"no {op}({path}) recorded after position {start}: {self.calls[start:]}")

    def last_index(self, op: str, path: str | None = None) -> int:
        """Position of the last ``op`` call (on ``path``); ValueError if none."""
        for i in range(len(self.calls) - 1, -1, -1):
            call = self.calls[i]
            if call.op == op and (path is None or call.path == path):
                return i
        raise ValueError(f"no {op}({path}) recorded")

    def bytes_read(self, path: str | None = None) -> int:
        """Total bytes asked for by pread (on ``path``)."""
        return sum(c.size or 0 for c in self.calls_of("pread", path))

    # --- files
    def open(self, path: str, flags: OpenFlag, mode: int = 0o600) -> int:
        self._record("open", path, flags=flags)
        fd = super().open(path, flags, mode)
        self._paths[fd] = path
        return fd

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        self._record("pread", fd=fd, size=size)
        return super().pread(fd, size, offset)

    def write(self, fd: int, data: bytes) -> int:
        self._record("write", fd=fd, size=len(data))
        return super().write(fd, data)

    def fsync(self, fd: int) -> None:
        self._record("fsync", fd=fd)
        super().fsync(fd)

    def ftruncate(self, fd: int, size: int) -> None:
        self._record("ftruncate", fd=fd, size=size)
        super().ftruncate(fd, size)

    def allocate(self, fd: int, offset: int, length: int) -> None:
        self._record("allocate", fd=fd, size=length)
        super().allocate(fd, offset, length)

    def seek(self, fd: int, offset: int) -> None:
        self._record("seek", fd=fd, size=offset)
        super().seek(fd, offset)

    def map_shared(self, fd: int, offset: int, length: int) -> MappedWindow:
        self._record("map", fd=fd, size=length)
        # A store is recorded as the write of the file's data it is (W-26).
        return ForwardingWindow(super().map_shared(fd, offset, length),
                                lambda size: self._record("write", fd=fd, size=size),
                                lambda: self._record("unmap", fd=fd))

    def fstat(self, fd: int) -> FileStat:
        self._record("fstat", fd=fd)
        return super().fstat(fd)

    def close(self, fd: int) -> None:
        self._record("close", fd=fd)
        super().close(fd)
        self._paths.pop(fd, None)

    def flock_exclusive_nb(self, fd: int) -> bool:
        self._record("flock", fd=fd)
        return super().flock_exclusive_nb(fd)

    def flock_unlock(self, fd: int) -> None:
        self._record("unlock", fd=fd)
        super().flock_unlock(fd)

    # --- names
    def rename(self, src: str, dst: str) -> None:
        self._record("rename", src, dst=dst)
        super().rename(src, dst)

    def unlink(self, path: str) -> None:
        self._record("unlink", path)
        super().unlink(path)

    def makedirs(self, path: str, mode: int = 0o700) -> None:
        self._record("makedirs", path)
        super().makedirs(path, mode)

    def listdir(self, path: str) -> list[str]:
        self._record("listdir", path)
        return super().listdir(path)

    def fsync_dir(self, path: str) -> None:
        self._record("fsync_dir", path)
        super().fsync_dir(path)

    # --- process facts
    def time(self) -> float:
        return super().time() if self.clock is None else self.clock.time()

    def monotonic(self) -> float:
        return super().monotonic() if self.clock is None else self.clock.monotonic()

    def sleep(self, seconds: float) -> None:
        self._record("sleep", size=None)
        if self.clock is None:
            super().sleep(seconds)
        else:
            self.clock.sleep(seconds)

    def call_every(self, interval_s: float, callback: Callable[[], None]) -> Cancel:
        if self.clock is None:
            return super().call_every(interval_s, callback)
        return self.clock.call_every(interval_s, callback)


# ----------------------------------------------------------------------------- faults


@dataclass(slots=True)
class Fault:
    """Make calls number ``nth`` .. ``nth + times - 1`` of ``op`` (on a matching path) fail.

    ``error`` is the errno raised. For ``write``, ``short_bytes`` instead writes
    only that many bytes of the data for real and returns the count (0 writes
    nothing), as a write interrupted by a full disk does.
    """

    op: str
    nth: int = 1
    times: int = 1
    error: int = errno.EIO
    short_bytes: int | None = None
    match: Callable[[str | None], bool] | None = None
    seen: int = 0
    fired: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def hit(self, op: str, path: str | None) -> bool:
        """Count a call; True when this one must fail."""
        if op != self.op or (self.match is not None and not self.match(path)):
            return False
        with self._lock:
            self.seen += 1
            if self.nth <= self.seen < self.nth + self.times:
                self.fired += 1
                return True
        return False


class FaultyEnv(RecordingEnv):
    """``RecordingEnv`` whose calls fail as ``inject()`` says.

    Injectable operations: open, pread, write (error or short), fsync, ftruncate,
    allocate, seek, map, fsync_dir, rename (matched on its source) and unlink. A failed call is
    recorded with a ``!`` suffix (``fsync!``), so ``calls_of("fsync")`` lists
    only the calls that reached the operating system.

    A store into a mapped window cannot fail on the operating system, so the faults of
    ``write`` are only reachable when the WAL writes: unless ``mapping`` is set, this Env
    refuses every ``map`` (ENODEV, as a filesystem that cannot map does), and the WAL
    writes its records (W-26).
    """

    def __init__(self, clock: ManualClock | None = None, *, mapping: bool = False) -> None:
        super().__init__(clock)
        self.faults: list[Fault] = []
        self.mapping = mapping

    def inject(self, op: str, *, nth: int = 1, times: int = 1, error: int = errno.EIO,
               short_bytes: int | None = None, path: str | None = None,
               paths: Iterable[str] | None = None,
               match: Callable[[str | None], bool] | None = None) -> Fault:
        """Arm a fault. Calls are counted from now on; ``path``/``paths``/``match`` filter them."""
        if path is not None:
            wanted = path
            match = lambda p: p == wanted  # noqa: E731 - a one-line predicate.
        elif paths is not None:
            chosen = frozenset(paths)
            match = lambda p: p in chosen  # noqa: E731
        fault = Fault(op, nth=nth, times=times, error=error, short_bytes=short_bytes, match=match)
        self.faults.append(fault)
        return fault

    def _check(self, op: str, path: str | None) -> Fault | None:
        # Every fault counts every matching call, so "nth" means the same for all of them.
        fired = [fault for fault in self.faults if fault.hit(op, path)]
        return fired[0] if fired else None

    @staticmethod
    def _raise(fault: Fault, path: str | None) -> None:
        raise OSError(fault.error, f"{os.strerror(fault.error)} (injected)", path)

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        fault = self._check("pread", self.path_of(fd))
        if fault is not None:
            self._record("pread!", fd=fd, size=size)
            self._raise(fault, self.path_of(fd))
        return super().pread(fd, size, offset)

    def write(self, fd: int, data: bytes) -> int:
        fault = self._check("write", self.path_of(fd))
        if fault is None:
            return super().write(fd, data)
        if fault.short_bytes is None:
            self._record("write!", fd=fd, size=len(data))
            self._raise(fault, self.path_of(fd))
        part = data[: fault.short_bytes]
        return super().write(fd, part) if part else 0

    def fsync(self, fd: int) -> None:
        fault = self._check("fsync", self.path_of(fd))
        if fault is not None:
            self._record("fsync!", fd=fd)
            self._raise(fault, self.path_of(fd))
        super().fsync(fd)

    def ftruncate(self, fd: int, size: int) -> None:
        fault = self._check("ftruncate", self.path_of(fd))
        if fault is not None:
            self._record("ftruncate!", fd=fd, size=size)
            self._raise(fault, self.path_of(fd))
        super().ftruncate(fd, size)

    def allocate(self, fd: int, offset: int, length: int) -> None:
        fault = self._check("allocate", self.path_of(fd))
        if fault is not None:
            self._record("allocate!", fd=fd, size=length)
            self._raise(fault, self.path_of(fd))
        super().allocate(fd, offset, length)

    def map_shared(self, fd: int, offset: int, length: int) -> MappedWindow:
        fault = self._check("map", self.path_of(fd))
        if fault is not None or not self.mapping:
            self._record("map!", fd=fd, size=length)
            error = errno.ENODEV if fault is None else fault.error
            raise OSError(error, f"{os.strerror(error)} (injected)", self.path_of(fd))
        return super().map_shared(fd, offset, length)

    def seek(self, fd: int, offset: int) -> None:
        fault = self._check("seek", self.path_of(fd))
        if fault is not None:
            self._record("seek!", fd=fd, size=offset)
            self._raise(fault, self.path_of(fd))
        super().seek(fd, offset)

    def fsync_dir(self, path: str) -> None:
        fault = self._check("fsync_dir", path)
        if fault is not None:
            self._record("fsync_dir!", path)
            self._raise(fault, path)
        super().fsync_dir(path)

    def rename(self, src: str, dst: str) -> None:
        fault = self._check("rename", src)
        if fault is not None:
            self._record("rename!", src, dst=dst)
            self._raise(fault, src)
        super().rename(src, dst)

    def unlink(self, path: str) -> None:
        fault = self._check("unlink", path)
        if fault is not None:
            self._record("unlink!", path)
            self._raise(fault, path)
        super().unlink(path)

    def open(self, path: str, flags: OpenFlag, mode: int = 0o600) -> int:
        fault = self._check("open", path)
        if fault is not None:
            self._record("open!", path, flags=flags)
            self._raise(fault, path)
        return super().open(path, flags, mode)
