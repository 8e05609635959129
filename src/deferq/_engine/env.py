"""The one seam between the engine and the world (cf. LevelDB ``Env``).

Rules: the engine (``_wal``, ``_deadstore`` and its parts, ``_io``, ``backends``) performs every
file operation and reads every process fact (clock, sleep, pid, randomness,
local date, timers) through an ``Env``. ``deferq._engine.osenv.OsEnv`` is the real
one; ``deferq.crashtest`` provides a simulated one with crash injection. A test
(tests/unit/test_layering.py) fails if an engine module imports ``os``, ``io``,
``fcntl``, ``time``, ``random``, ``threading`` timers or ``pathlib``.

Process-local synchronisation goes through the seam too (``Env.mutex``,
``Env.condition``, M-15): a lock the engine takes beside a flock, or holds across a
seam call, is where races between the threads of one process live, so the simulator
must see every acquire, release, wait and notify to interleave threads there. The
real Env returns plain ``threading.Lock`` and ``threading.Condition`` objects, so the
engine's hot paths pay nothing for it.

Semantics are POSIX/Linux: ``write`` may write fewer bytes than asked (callers
loop), ``flock_exclusive_nb`` is ``flock(LOCK_EX | LOCK_NB)`` on one open file
description, errors are ``OSError`` with an ``errno``. Paths are ``str``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from types import TracebackType
from typing import NamedTuple, Protocol


class OpenFlag(enum.Flag):
    """How a file is opened; mapped one to one onto ``os.O_*`` by the real Env."""

    READ = enum.auto()  # O_RDONLY unless WRITE is set too (then O_RDWR)
    WRITE = enum.auto()  # O_WRONLY, or O_RDWR with READ
    APPEND = enum.auto()  # O_APPEND: every write goes to the end
    CREATE = enum.auto()  # O_CREAT
    EXCLUSIVE = enum.auto()  # O_EXCL
    TRUNCATE = enum.auto()  # O_TRUNC


class FileStat(NamedTuple):
    """What the engine needs of ``fstat``: identity, size and link count.

    A named tuple (immutable, compared by value) rather than a frozen dataclass: it is
    built on every fstat, twice per dead-task add, at a third of the cost.
    """

    device: int
    inode: int
    size: int
    links: int
    ctime_ns: int


class Cancel(Protocol):
    """A handle that stops a periodic callback."""

    def cancel(self) -> None:
        """Stop; the callback is not called again after this returns."""


class MappedWindow(Protocol):
    """A shared, writable memory mapping of part of a file (``Env.map_shared``, W-26).

    ``window[a:b] = data`` (with ``len(data) == b - a``) stores ``data`` at the file's
    offset ``base + a``; the bytes are in the file's page cache when it returns, like the
    bytes of a ``write``, and an fsync of the file makes them durable.
    """

    def __setitem__(self, index: slice[int, int, None], value: bytes, /) -> None:
        """Store ``value`` at ``index`` of the window."""

    def close(self) -> None:
        """Unmap; stored bytes stay in the file."""


class Mutex(Protocol):
    """A non-reentrant mutual-exclusion lock (``threading.Lock``'s interface, M-15)."""

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Take the lock; with ``blocking=False`` return False at once when it is held."""

    def release(self) -> None:
        """Release the lock, which the calling thread holds."""

    def __enter__(self) -> bool:
        """``acquire()``."""

    def __exit__(self, exc_type: type[BaseException] | None, exc_value: BaseException | None,
                 traceback: TracebackType | None, /) -> None:
        """``release()``."""


class Condition(Protocol):
    """A condition variable over a ``Mutex`` (``threading.Condition``'s interface, M-15)."""

    def wait(self, timeout: float | None = None) -> bool:
        """Release the mutex, wait for a notify (or a spurious wake-up), take it again."""

    def notify_all(self) -> None:
        """Wake every thread waiting; the mutex is held."""

    def __enter__(self) -> bool:
        """Take the mutex."""

    def __exit__(self, exc_type: type[BaseException] | None, exc_value: BaseException | None,
                 traceback: TracebackType | None, /) -> None:
        """Release the mutex."""


class Env(Protocol):
    """Every operation the engine performs on the outside world."""

    #: Bytes a WAL reserves past its records at a time (W-25). The operating system's is
    #: ``WAL_RESERVE_BYTES``; the simulated machine's is small (``SIM_RESERVE_BYTES``), so
    #: that its files stay small and the crash tests cross reservation boundaries often.
    reserve_bytes: int
    #: The offset of a ``map_shared`` window must be a multiple of this (the page size on
    #: the operating system, ``mmap.ALLOCATIONGRANULARITY``).
    map_granularity: int

    # --- files (file descriptors are ints, local to this Env)
    def open(self, path: str, flags: OpenFlag, mode: int = 0o600) -> int:
        """Open (or create) a regular file and return a new descriptor.

        Never follows a symbolic link and never waits on a FIFO: an entry that is not a
        regular file raises ``UnsafeEntryError`` (F-16).
        """

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        """Read up to ``size`` bytes at ``offset``; fewer only at end of file."""

    def write(self, fd: int, data: bytes) -> int:
        """Write at the descriptor's offset (the end, with APPEND); return the count written."""

    def fsync(self, fd: int) -> None:
        """Make the file's data and size durable (not its name, A-4)."""

    def ftruncate(self, fd: int, size: int) -> None:
        """Set the file's size."""

    def allocate(self, fd: int, offset: int, length: int) -> None:
        """``posix_fallocate``: reserve blocks for ``[offset, offset + length)``, growing the
        file's size with zeros to cover it; never changes existing bytes or the offset."""

    def seek(self, fd: int, offset: int) -> None:
        """Set the descriptor's offset (``lseek(SEEK_SET)``), where the next ``write`` goes."""

    def map_shared(self, fd: int, offset: int, length: int) -> MappedWindow:
        """``mmap(MAP_SHARED, PROT_READ | PROT_WRITE)`` of ``[offset, offset + length)``.

        ``fd`` is open for reading and writing, ``offset`` a multiple of
        ``map_granularity``, and the file at least ``offset + length`` bytes long (a
        store past the file's end would kill the process with SIGBUS). Stores never
        move the descriptor's offset. Raises ``OSError`` when the file cannot be mapped.
        """

    def fstat(self, fd: int) -> FileStat:
        """Identity and size of an open file."""

    def close(self, fd: int) -> None:
        """Close a descriptor; releases its flock when it is the last one of its description."""

    def flock_exclusive_nb(self, fd: int) -> bool:
        """``flock(LOCK_EX | LOCK_NB)``: True when taken, False when another description holds it."""

    def flock_unlock(self, fd: int) -> None:
        """``flock(LOCK_UN)``."""

    # --- names
    def rename(self, src: str, dst: str) -> None:
        """Atomically replace ``dst`` with ``src`` (same directory)."""

    def unlink(self, path: str) -> None:
        """Remove a name; open descriptors keep the inode readable."""

    def makedirs(self, path: str, mode: int = 0o700) -> None:
        """Create a directory and its parents; an existing directory is not an error."""

    def listdir(self, path: str) -> list[str]:
        """Names in a directory, in no particular order."""

    def fsync_dir(self, path: str) -> None:
        """Make the directory's entries (creates, renames, unlinks) durable (A-4)."""

    # --- process facts
    def time(self) -> float:
        """Wall-clock seconds since the epoch."""

    def monotonic(self) -> float:
        """Seconds of a clock that never goes back."""

    def sleep(self, seconds: float) -> None:
        """Block this thread for ``seconds``."""

    def getpid(self) -> int:
        """This process's id."""

    def random_u32(self) -> int:
        """A random integer in [0, 2**32)."""

    def local_date(self) -> str:
        """Today's local date as ``YYYYMMDD``."""

    def call_every(self, interval_s: float, callback: Callable[[], None]) -> Cancel:
        """Call ``callback`` every ``interval_s`` seconds in the background until cancelled.

        The simulated Env never calls it by itself: tests drive time explicitly.
        """

    # --- process-local synchronisation (M-15)
    def mutex(self) -> Mutex:
        """A new lock shared by the threads of this process (``threading.Lock()``)."""

    def condition(self, mutex: Mutex) -> Condition:
        """A new condition variable over ``mutex`` (``threading.Condition(mutex)``)."""
