"""SimProcess: what every simulated process has, whatever call it is making.

Rules. A process has a pid, its own seeded ``random.Random``, a descriptor table (an
``fd -> Description`` map; every descriptor is its own open file description, as the
seam has no ``dup``), the windows it has mapped, and a liveness flag. Every call
starts with ``_enter``, which checks liveness and the machine's fault rules, and ends
with ``_leave``, which carries out a fault that crashes after the call; a dead process
raises ``SimulatedCrash`` from every call and changes nothing. The process facts of the
``Env`` seam (clock, sleep, pid, randomness, date, timers) are answered here from the
machine's ``SimClock`` and ``Timers``.

Theory of operation: ``SimEnv`` is this class plus the file calls (``_simfiles``) and
the name calls (``_simnames``), mixed in. They share this state and these helpers and
must be one object (the ``Env`` protocol is one object), and a mixin costs no extra
call per syscall where a delegating wrapper would, on the hot path of every simulated
run. Every method that touches shared state holds the machine's lock.
"""

from __future__ import annotations

import errno
import random
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from deferq._engine.env import Cancel, Condition, Mutex, OpenFlag
from deferq.crashtest._faults import Crash, Eio, Enospc, Fault, SimulatedCrash
from deferq.crashtest._inode import Inode, os_error
from deferq.crashtest._window import SimWindow

if TYPE_CHECKING:
    # Type-only: SimDisk creates every SimEnv, so _simdisk imports SimEnv and, through it,
    # this module; a runtime import back would be a cycle.
    from deferq.crashtest._simdisk import SimDisk


class Description:
    """An open file description: inode, path it was opened by, access mode, offset."""

    __slots__ = ("append", "err_mark", "node", "offset", "path", "readable", "writable")

    def __init__(self, node: Inode, path: str, flags: OpenFlag) -> None:
        self.node = node
        self.path = path
        self.writable = OpenFlag.WRITE in flags
        self.readable = OpenFlag.READ in flags or not self.writable
        self.append = OpenFlag.APPEND in flags
        self.offset = 0
        # Linux errseq_sample: an unseen error will be reported to this description too.
        self.err_mark = node.wb_err if node.wb_err_seen else 0


class SimProcess:
    """The state and helpers every simulated process's calls share (see the module doc)."""

    def __init__(self, disk: SimDisk, pid: int, rng: random.Random) -> None:
        self._disk = disk
        self._fs = disk.fs  # the storage, called directly under ``disk.lock``
        self._pid = pid
        self._rng = rng
        self._fds: dict[int, Description] = {}
        # Open windows (W-26): a window's inode and its span, to catch a cut under one.
        self._windows: dict[SimWindow, Inode] = {}
        self._alive = True

    @property
    def disk(self) -> SimDisk:
        return self._disk

    @property
    def alive(self) -> bool:
        return self._alive

    def open_fds(self) -> list[int]:
        """The descriptors this process has open."""
        with self._disk.lock:
            return sorted(self._fds)

    def path_of(self, fd: int) -> str:
        """The path a descriptor was opened with."""
        with self._disk.lock:
            return self._desc(fd).path

    def run_timers(self) -> list[Exception]:
        """Call this process's due timers; return the exceptions they raised."""
        self._check_alive()
        return self._disk.timers.fire_due(self._disk.clock, self._pid)

    def die(self) -> None:
        """Called by ``SimDisk.kill``: close every descriptor, releasing its flocks."""
        for fd in list(self._fds):
            self._release(self._fds.pop(fd))
        self._windows.clear()  # a dead process's mappings are gone
        self._alive = False

    # ------------------------------------------------------------------ process facts

    def time(self) -> float:
        self._check_alive()
        return self._disk.clock.time_s

    def monotonic(self) -> float:
        self._check_alive()
        return self._disk.clock.monotonic_s

    def sleep(self, seconds: float) -> None:
        self._check_alive()
        if seconds < 0:
            raise ValueError("sleep length must be non-negative")
        with self._disk.lock:
            self._disk.clock.advance(seconds)

    def getpid(self) -> int:
        self._check_alive()
        return self._pid

    def random_u32(self) -> int:
        self._check_alive()
        return self._rng.getrandbits(32)

    def local_date(self) -> str:
        self._check_alive()
        return self._disk.clock.local_date()

    def call_every(self, interval_s: float, callback: Callable[[], None]) -> Cancel:
        self._check_alive()
        with self._disk.lock:
            return self._disk.timers.add(self._disk.clock, interval_s, callback, self._pid)

    def mutex(self) -> Mutex:
        """Implements M-15 without a scheduler: a real lock, as the OS's Env gives.

        A ``Scheduler`` that runs several threads of this process wraps it in a
        ``ScheduledEnv``, which makes its own (``_schedsync``) instead.
        """
        return threading.Lock()

    def condition(self, mutex: Mutex) -> Condition:
        # Only this Env's own mutexes come back here: threading.Lock objects.
        assert isinstance(mutex, type(threading.Lock())), mutex
        return threading.Condition(mutex)

    def __repr__(self) -> str:
        state = "alive" if self._alive else "dead"
        return f"<SimEnv pid={self._pid} {state} fds={sorted(self._fds)}>"

    # ------------------------------------------------------------------ internals

    def _check_alive(self) -> None:
        if not self._alive:
            raise SimulatedCrash(f"process {self._pid} is dead")

    def _enter(self, op: str, paths: tuple[str, ...]) -> Fault | None:
        """Check liveness and the fault rules; raise for faults that stop the call."""
        self._check_alive()
        fault = self._disk.faults.check(op, paths, self._pid)
        if isinstance(fault, Crash) and not fault.after:
            self._crash(op, paths)
        if isinstance(fault, Eio):
            raise os_error(errno.EIO, paths[0])
        if isinstance(fault, Enospc):
            raise os_error(errno.ENOSPC, paths[0])
        return fault

    def _leave(self, fault: Fault | None, op: str, paths: tuple[str, ...]) -> None:
        if isinstance(fault, Crash):
            self._crash(op, paths)

    def _crash(self, op: str, paths: tuple[str, ...]) -> None:
        self._disk.kill(self._pid)
        raise SimulatedCrash(f"process {self._pid} crashed at {op}{paths}")

    def _desc(self, fd: int) -> Description:
        self._check_alive()
        desc = self._fds.get(fd)
        if desc is None:
            raise os_error(errno.EBADF)
        return desc

    def _release(self, desc: Description) -> None:
        if self._disk.flocks.get(desc.node.ino) is desc:
            del self._disk.flocks[desc.node.ino]

    def _dir_at(self, path: str) -> Inode:
        node = self._fs.resolve(path).node
        if node is None:
            raise os_error(errno.ENOENT, path)
        if not node.is_dir:
            raise os_error(errno.ENOTDIR, path)
        return node
