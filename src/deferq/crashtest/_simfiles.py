"""FileCalls: a simulated process's descriptor calls of the ``Env`` seam, Linux semantics.

Rules. Descriptors are the lowest free number from 3, like POSIX; each is its own open
file description holding the offset, the access mode and the APPEND flag. Semantics and
errnos follow Linux (checked against the real OS by tests/conformance): ``O_TRUNC``
truncates even a read-only open; a directory opens read-only and refuses reads
(EISDIR), writes (EBADF) and truncation (EINVAL); ``ftruncate`` of a read-only
descriptor is EINVAL.

``flock`` belongs to an open file description and an inode (A-8): another description,
even in the same process, conflicts; the same description may lock again; a lock is
released by ``flock_unlock``, by closing the descriptor, or by the process's death.
``fsync`` reports a writeback error once per open file description (Linux errseq): a
description opened after the error was seen does not see it. Shared mappings (W-26)
are ``SimWindow`` values whose stores come back as ``store_at``; mapping or cutting a
file so that a store would be SIGBUS is an ``AssertionError``, a bug to report.

Theory of operation: each call resolves its descriptor, passes the fault rules with
the path the descriptor was opened with, checks its arguments in Linux's order, and
applies the change to the machine's ``SimFs``, which logs it for the crash model.
"""

from __future__ import annotations

import errno
from typing import Final

from deferq._core.errors import UnsafeEntryError
from deferq._engine.env import FileStat, MappedWindow, OpenFlag
from deferq.crashtest._faults import FsyncEio, LyingFsync, ShortWrite
from deferq.crashtest._inode import os_error
from deferq.crashtest._simproc import Description, SimProcess
from deferq.crashtest._window import SimWindow

SIM_DEVICE: Final = 0x5D15
DIR_SIZE_BYTES: Final = 4096  # what ext4 reports for a small directory
# A simulated WAL reserves this much past its records at a time (W-25): a few records, so
# the crash tests cross reservation boundaries often and simulated files stay small.
SIM_RESERVE_BYTES: Final = 256
# Windows of the simulated machine start at multiples of this (W-26): smaller than a page,
# so that windows often start before the records' end, as they do on the OS.
SIM_MAP_GRANULARITY: Final = 64
_FIRST_FD: Final = 3


class FileCalls(SimProcess):
    """The descriptor calls of ``deferq._engine.env.Env`` (mixed into ``SimEnv``)."""

    reserve_bytes: int = SIM_RESERVE_BYTES
    map_granularity: int = SIM_MAP_GRANULARITY

    def open(self, path: str, flags: OpenFlag, mode: int = 0o600) -> int:
        with self._disk.lock:
            fault = self._enter("open", (path,))
            if OpenFlag.CREATE in flags and path.endswith("/") and path.strip("/"):
                # Linux: O_CREAT with a trailing slash is EISDIR once the parent resolves.
                self._fs.resolve(path.rstrip("/"))
                raise os_error(errno.EISDIR, path)
            found = self._fs.resolve(path)
            node = found.node
            if node is None:
                if OpenFlag.CREATE not in flags:
                    raise os_error(errno.ENOENT, path)
                if found.slash:
                    raise os_error(errno.EISDIR, path)
                node = self._fs.create_file(found.parent, found.name, mode)
            elif OpenFlag.CREATE in flags and OpenFlag.EXCLUSIVE in flags:
                raise os_error(errno.EEXIST, path)
            elif node.is_dir:
                # As the OS adapter (F-16): a directory is never opened as a store file.
                code = (errno.EISDIR if flags & (OpenFlag.WRITE | OpenFlag.CREATE
                                                 | OpenFlag.TRUNCATE) else errno.EINVAL)
                raise UnsafeEntryError(code, f"{path} is a directory, not a regular file")
            elif OpenFlag.TRUNCATE in flags and node.data:
                self._fs.truncate(node, 0)  # Linux truncates even when opened read-only.
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
                self._fs.write(desc.node, position, bytes(data[:count]))
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
                self._fs.drop_dirty(node, fault.keep_cache)
            elif isinstance(fault, FsyncEio):
                raise os_error(errno.EIO)
            elif node.is_dir:
                self._fs.persist_dir(node.ino)
            else:
                self._fs.persist_file(node.ino)
            if desc.err_mark != node.wb_err:
                # Implements A-7 (Linux errseq): each description sees each error once.
                desc.err_mark = node.wb_err
                node.wb_err_seen = True
                raise os_error(errno.EIO)
            self._fs.barrier()
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
            self._fs.truncate(desc.node, size)
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
                self._fs.truncate(desc.node, offset + length)
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
            self._fs.write(desc.node, position, bytes(data[:count]))
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
                subdirs = sum(1 for ino in node.entries.values() if self._fs.node(ino).is_dir)
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
