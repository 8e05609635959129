"""SimEnv: one simulated process's ``deferq._engine.env.Env`` on a ``SimDisk``.

Rules. Each process has its own descriptor table (lowest free number from 3, like
POSIX) and its own seeded ``random.Random``; every descriptor is its own open file
description (the seam has no ``dup``), holding the offset, the access mode and the
APPEND flag. Semantics and errnos follow Linux (checked against the real OS by
tests/conformance): ``O_TRUNC`` truncates even a read-only open; a directory opens
read-only and refuses reads (EISDIR), writes (EBADF) and truncation (EINVAL);
``ftruncate`` of a read-only descriptor is EINVAL; renames follow rename(2) (EISDIR,
ENOTDIR, ENOTEMPTY, EINVAL for a directory into itself, a no-op onto itself).

``flock`` belongs to an open file description and an inode (A-8): another description,
even in the same process, conflicts; the same description may lock again; a lock is
released by ``flock_unlock``, by closing the descriptor, or by the process's death.
``fsync`` reports a writeback error once per open file description (Linux errseq): a
description opened after the error was seen does not see it.

Process facts are simulated: ``time``/``monotonic`` read the machine's ``SimClock``;
``sleep`` advances it at once; ``random_u32`` comes from the seeded generator;
``local_date`` is the simulated time's UTC date; ``call_every`` registers a timer that
fires only when the test calls ``SimDisk.fire_timers`` or ``run_timers``.

Fault rules (``_faults``) are checked at the start of every file and namespace call;
for descriptor calls the path is the one the descriptor was opened with. A dead
process (killed, crashed by a fault, or powered off) raises ``SimulatedCrash`` from
every call and changes nothing.
"""

from __future__ import annotations

import errno
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from deferq._engine.env import Cancel, FileStat, MappedWindow, OpenFlag
from deferq.crashtest._faults import (
    Crash,
    Eio,
    Enospc,
    Fault,
    FsyncEio,
    LyingFsync,
    ShortWrite,
    SimulatedCrash,
)
from deferq.crashtest._inode import Inode, os_error
from deferq.crashtest._window import SimWindow

if TYPE_CHECKING:
    from deferq._engine.env import Env
    # Type-only: SimDisk creates every SimEnv, so _simdisk imports this module.
    from deferq.crashtest._simdisk import SimDisk

SIM_DEVICE: Final = 0x5D15
DIR_SIZE_BYTES: Final = 4096  # what ext4 reports for a small directory
# A simulated WAL reserves this much past its records at a time (W-25): a few records, so
# the crash tests cross reservation boundaries often and simulated files stay small.
SIM_RESERVE_BYTES: Final = 256
# Windows of the simulated machine start at multiples of this (W-26): smaller than a page,
# so that windows often start before the records' end, as they do on the OS.
SIM_MAP_GRANULARITY: Final = 64
_FIRST_FD: Final = 3


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


class SimEnv:
    """One simulated process: implements ``deferq._engine.env.Env`` on a ``SimDisk``."""

    reserve_bytes: int = SIM_RESERVE_BYTES
    map_granularity: int = SIM_MAP_GRANULARITY

    def __init__(self, disk: SimDisk, pid: int, rng: random.Random) -> None:
        self._disk = disk
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

    # ------------------------------------------------------------------ files

    def open(self, path: str, flags: OpenFlag, mode: int = 0o600) -> int:
        with self._disk.lock:
            fault = self._enter("open", (path,))
            if OpenFlag.CREATE in flags and path.endswith("/") and path.strip("/"):
                # Linux: O_CREAT with a trailing slash is EISDIR once the parent resolves.
                self._disk.resolve(path.rstrip("/"))
                raise os_error(errno.EISDIR, path)
            found = self._disk.resolve(path)
            node = found.node
            if node is None:
                if OpenFlag.CREATE not in flags:
                    raise os_error(errno.ENOENT, path)
                if found.slash:
                    raise os_error(errno.EISDIR, path)
                node = self._disk.create_file(found.parent, found.name, mode)
            elif OpenFlag.CREATE in flags and OpenFlag.EXCLUSIVE in flags:
                raise os_error(errno.EEXIST, path)
            elif node.is_dir:
                if flags & (OpenFlag.WRITE | OpenFlag.CREATE | OpenFlag.TRUNCATE):
                    raise os_error(errno.EISDIR, path)
            elif OpenFlag.TRUNCATE in flags and node.data:
                self._disk.truncate(node, 0)  # Linux truncates even when opened read-only.
            fd = _FIRST_FD
            while fd in self._fds:
                fd += 1
            self._fds[fd] = Description(node, path, flags)
            self._leave(fault, "open", (path,))
            return fd

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        with self._disk.lock:
            self._check_alive()
            if size < 0 or offset < 0:
                raise os_error(errno.EINVAL)
            desc = self._desc(fd)
            fault = self._enter("pread", (desc.path,))
            if not desc.readable:
                raise os_error(errno.EBADF)
            if desc.node.is_dir:
                raise os_error(errno.EISDIR)
            data = bytes(desc.node.data[offset:offset + size])
            self._leave(fault, "pread", (desc.path,))
            return data

    def write(self, fd: int, data: bytes) -> int:
        with self._disk.lock:
            desc = self._desc(fd)
            fault = self._enter("write", (desc.path,))
            if not desc.writable:
                raise os_error(errno.EBADF)
            count = len(data)
            if isinstance(fault, ShortWrite):
                count = min(count, fault.bytes_max)
            if count:
                position = len(desc.node.data) if desc.append else desc.offset
                self._disk.write(desc.node, position, bytes(data[:count]))
                desc.offset = position + count
            self._leave(fault, "write", (desc.path,))
            return count

    def fsync(self, fd: int) -> None:
        with self._disk.lock:
            desc = self._desc(fd)
            fault = self._enter("fsync", (desc.path,))
            node = desc.node
            if isinstance(fault, LyingFsync):
                return
            if isinstance(fault, FsyncEio) and not node.is_dir:
                self._disk.drop_dirty(node, fault.keep_cache)
            elif isinstance(fault, FsyncEio):
                raise os_error(errno.EIO)
            elif node.is_dir:
                self._disk.persist_dir(node.ino)
            else:
                self._disk.persist_file(node.ino)
            if desc.err_mark != node.wb_err:
                # Implements A-7 (Linux errseq): each description sees each error once.
                desc.err_mark = node.wb_err
                node.wb_err_seen = True
                raise os_error(errno.EIO)
            self._disk.barrier()
            self._leave(fault, "fsync", (desc.path,))

    def ftruncate(self, fd: int, size: int) -> None:
        with self._disk.lock:
            self._check_alive()
            if size < 0:
                raise os_error(errno.EINVAL)
            desc = self._desc(fd)
            fault = self._enter("ftruncate", (desc.path,))
            if not desc.writable or desc.node.is_dir:
                raise os_error(errno.EINVAL)
            for window, node in self._windows.items():
                if node is desc.node and window.span[1] > size:
                    raise AssertionError(f"cutting {desc.path} to {size} bytes under a window "
                                         f"mapping {window.span}: a store there is SIGBUS")
            self._disk.truncate(desc.node, size)
            self._leave(fault, "ftruncate", (desc.path,))

    def allocate(self, fd: int, offset: int, length: int) -> None:
        with self._disk.lock:
            desc = self._desc(fd)  # Linux: a bad descriptor first, then the arguments
            if offset < 0 or length <= 0:
                raise os_error(errno.EINVAL)
            fault = self._enter("allocate", (desc.path,))
            if not desc.writable:
                raise os_error(errno.EBADF)
            if desc.node.is_dir:
                raise os_error(errno.EISDIR)
            # The size grows (an unsynced size change, like a growing ftruncate); the
            # reserved bytes read as zeros and nothing already in the file changes.
            if offset + length > len(desc.node.data):
                self._disk.truncate(desc.node, offset + length)
            self._leave(fault, "allocate", (desc.path,))

    def map_shared(self, fd: int, offset: int, length: int) -> MappedWindow:
        with self._disk.lock:
            desc = self._desc(fd)
            if offset < 0 or length <= 0 or offset % self.map_granularity:
                raise os_error(errno.EINVAL)
            fault = self._enter("map", (desc.path,))
            if not (desc.readable and desc.writable):
                raise os_error(errno.EACCES)  # MAP_SHARED with PROT_WRITE needs O_RDWR
            if desc.node.is_dir:
                raise os_error(errno.ENODEV)
            if offset + length > len(desc.node.data):
                # Allowed by mmap, but a store there is SIGBUS: the engine maps only what it
                # reserved, so this is a bug to report, not a behaviour to simulate.
                raise AssertionError(f"mapping [{offset}, {offset + length}) of {desc.path}, "
                                     f"which has {len(desc.node.data)} bytes")
            window = SimWindow(self, fd, offset, length)
            self._windows[window] = desc.node
            self._leave(fault, "map", (desc.path,))
            return window

    def forget_window(self, window: SimWindow) -> None:
        """``SimWindow.close``: the window is gone (W-26)."""
        with self._disk.lock:
            self._windows.pop(window, None)

    def store_at(self, fd: int, position: int, data: bytes) -> int:
        """A store into a ``SimWindow`` of ``fd`` (W-26): ``data`` at ``position``, the
        descriptor's offset unmoved, checked and faulted as a ``write``; returns the count."""
        with self._disk.lock:
            desc = self._desc(fd)
            fault = self._enter("write", (desc.path,))
            if position + len(data) > len(desc.node.data):
                raise AssertionError(f"a store at [{position}, {position + len(data)}) of "
                                     f"{desc.path}, which has {len(desc.node.data)} bytes: SIGBUS")
            count = len(data)
            if isinstance(fault, ShortWrite):
                count = min(count, fault.bytes_max)
            self._disk.write(desc.node, position, bytes(data[:count]))
            self._leave(fault, "write", (desc.path,))
            return count

    def seek(self, fd: int, offset: int) -> None:
        with self._disk.lock:
            desc = self._desc(fd)
            if offset < 0:
                raise os_error(errno.EINVAL)
            fault = self._enter("seek", (desc.path,))
            desc.offset = offset
            self._leave(fault, "seek", (desc.path,))

    def fstat(self, fd: int) -> FileStat:
        with self._disk.lock:
            desc = self._desc(fd)
            fault = self._enter("fstat", (desc.path,))
            node = desc.node
            if node.is_dir:
                subdirs = sum(1 for ino in node.entries.values() if self._disk.node(ino).is_dir)
                stat = FileStat(SIM_DEVICE, node.ino, DIR_SIZE_BYTES, 2 + subdirs, node.ctime_ns)
            else:
                stat = FileStat(SIM_DEVICE, node.ino, len(node.data), node.nlink, node.ctime_ns)
            self._leave(fault, "fstat", (desc.path,))
            return stat

    def close(self, fd: int) -> None:
        with self._disk.lock:
            desc = self._desc(fd)
            # Linux frees the descriptor even when close reports an error.
            del self._fds[fd]
            self._release(desc)
            fault = self._enter("close", (desc.path,))
            self._leave(fault, "close", (desc.path,))

    def flock_exclusive_nb(self, fd: int) -> bool:
        with self._disk.lock:
            desc = self._desc(fd)
            fault = self._enter("flock_exclusive_nb", (desc.path,))
            holder = self._disk.flocks.get(desc.node.ino)
            taken = holder is None or holder is desc
            if taken:
                self._disk.flocks[desc.node.ino] = desc
            self._leave(fault, "flock_exclusive_nb", (desc.path,))
            return taken

    def flock_unlock(self, fd: int) -> None:
        with self._disk.lock:
            desc = self._desc(fd)
            fault = self._enter("flock_unlock", (desc.path,))
            self._release(desc)
            self._leave(fault, "flock_unlock", (desc.path,))

    # ------------------------------------------------------------------ names

    def rename(self, src: str, dst: str) -> None:
        with self._disk.lock:
            fault = self._enter("rename", (src, dst))
            old = self._disk.resolve(src)
            new = self._disk.resolve(dst)
            # The checks in the order of Linux's do_renameat2 and vfs_rename.
            if old.node is None:
                raise os_error(errno.ENOENT, src)
            if not old.name or not new.name:
                raise os_error(errno.EBUSY, src)
            if not old.node.is_dir and new.slash:
                raise os_error(errno.ENOTDIR, dst)  # a file cannot be named "dst/"
            if new.node is old.node:
                self._leave(fault, "rename", (src, dst))
                return
            if old.node.is_dir and self._contains(old.node, new.parent):
                raise os_error(errno.EINVAL, src)  # a directory into itself
            if new.node is not None and new.node.is_dir and self._contains(new.node, old.parent):
                raise os_error(errno.ENOTEMPTY, dst)  # over one of the source's ancestors
            if old.node.is_dir and new.node is not None:
                if not new.node.is_dir:
                    raise os_error(errno.ENOTDIR, dst)
                if new.node.entries:
                    raise os_error(errno.ENOTEMPTY, dst)
            elif new.node is not None and new.node.is_dir:
                raise os_error(errno.EISDIR, dst)
            self._disk.rename(old.parent, old.name, new.parent, new.name)
            self._leave(fault, "rename", (src, dst))

    def unlink(self, path: str) -> None:
        with self._disk.lock:
            fault = self._enter("unlink", (path,))
            found = self._disk.resolve(path)
            if found.node is None:
                raise os_error(errno.ENOENT, path)
            if found.node.is_dir:
                raise os_error(errno.EISDIR, path)
            self._disk.unlink(found.parent, found.name)
            self._leave(fault, "unlink", (path,))

    def makedirs(self, path: str, mode: int = 0o700) -> None:
        """Like ``os.makedirs(path, mode, exist_ok=True)``."""
        with self._disk.lock:
            fault = self._enter("makedirs", (path,))
            if not path:
                raise os_error(errno.ENOENT, path)
            comps = [c for c in path.split("/") if c and c != "."]
            for count in range(1, len(comps) + 1):
                prefix = "/" + "/".join(comps[:count])
                found = self._disk.resolve(prefix)
                if found.node is None:
                    self._disk.mkdir(found.parent, found.name, mode)
                elif not found.node.is_dir:
                    raise os_error(errno.EEXIST if count == len(comps) else errno.ENOTDIR, path)
            self._leave(fault, "makedirs", (path,))

    def listdir(self, path: str) -> list[str]:
        with self._disk.lock:
            fault = self._enter("listdir", (path,))
            node = self._dir_at(path)
            names = list(node.entries)  # creation order: deterministic, deliberately unsorted
            self._leave(fault, "listdir", (path,))
            return names

    def fsync_dir(self, path: str) -> None:
        with self._disk.lock:
            fault = self._enter("fsync_dir", (path,))
            node = self._dir_at(path)
            if isinstance(fault, LyingFsync):
                return
            self._disk.persist_dir(node.ino)
            self._disk.barrier()
            self._leave(fault, "fsync_dir", (path,))

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
        node = self._disk.resolve(path).node
        if node is None:
            raise os_error(errno.ENOENT, path)
        if not node.is_dir:
            raise os_error(errno.ENOTDIR, path)
        return node

    def _contains(self, directory: Inode, target: Inode) -> bool:
        """Whether ``target`` is ``directory`` or lies beneath it."""
        stack = [directory]
        seen: set[int] = set()
        while stack:
            node = stack.pop()
            if node is target:
                return True
            seen.add(node.ino)
            stack.extend(self._disk.node(ino) for ino in node.entries.values()
                         if ino not in seen and self._disk.node(ino).is_dir)
        return False


if TYPE_CHECKING:
    def _implements_env(env: SimEnv) -> Env:
        return env
