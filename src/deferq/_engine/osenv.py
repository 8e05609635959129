"""The real ``Env``: the operating system, through ``os`` and ``fcntl``.

Rules: a thin adapter with no policy. Every method is one system call (or the
smallest fixed sequence, as for a directory fsync: open, fsync, close), so the
simulated Env in ``deferq.crashtest`` can mirror it call for call and the
conformance tests can compare the two.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import stat
import sys
import threading
import time
from collections.abc import Callable
from typing import Final, cast

from deferq._core.errors import UnsafeEntryError
from deferq._core.limits import PARENT_DIR_MODE, WAL_RESERVE_BYTES
from deferq._engine.env import Cancel, Condition, FileStat, MappedWindow, Mutex, OpenFlag

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_OS_BITS: dict[int, int] = {}  # OpenFlag value -> os.O_* bits
# The path each descriptor the engine opened was opened as (a descriptor is the process's,
# so one map serves every env): a read error names its file (W-82, S-91).
_PATHS: dict[int, str] = {}
_monotonic: Callable[[], float] = time.monotonic
_posix_fallocate: Callable[[int, int, int], None] | None = getattr(os, "posix_fallocate", None)
# W-26 relies on fsync(2) writing back the pages a store into a MAP_SHARED mapping dirtied, as
# Linux's does (one page cache); elsewhere (macOS wants msync) the WAL writes its records.
_MAP_FSYNC_COVERED: Final = sys.platform.startswith("linux")
# ... and on a store into posix_fallocate'd space needing no new space: true where the blocks are
# allocated in place (a copy-on-write filesystem such as btrfs may need space at the first write of
# a page, and a page fault that cannot get it is SIGBUS, where write would return ENOSPC).
MAP_SAFE_FILESYSTEMS: Final = frozenset({"ext2", "ext3", "ext4", "xfs", "tmpfs"})


def fs_type(fd: int) -> str | None:
    """The type of the filesystem ``fd`` is on, from Linux's /proc; None when unknown."""
    try:
        with open(f"/proc/self/fdinfo/{fd}", "rb") as info:
            mount_id = next(line.split()[1] for line in info if line.startswith(b"mnt_id:"))
        with open("/proc/self/mountinfo", "rb") as mounts:
            for line in mounts:
                fields = line.split()
                if fields[0] == mount_id:  # "ID PARENT MAJ:MIN ROOT POINT OPTS [TAGS] - TYPE ..."
                    return fields[fields.index(b"-") + 1].decode()
    except (OSError, StopIteration, ValueError, IndexError, UnicodeDecodeError):
        return None
    return None

# The process id, refreshed in every child of os.fork() (including multiprocessing's fork start
# method): the storage engine compares it on every operation to refuse use from a forked child
# (W-14), and os.getpid() is a system call (~0.3 us), twice per task on the WAL's hot path.
_pid = os.getpid()


def _refresh_pid() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_refresh_pid)


def os_flags(flags: OpenFlag) -> int:
    """Map ``OpenFlag`` to ``os.O_*`` bits (``OsEnv.open`` caches it: flag tests cost ~10 us)."""
    if OpenFlag.WRITE in flags:
        bits = os.O_RDWR if OpenFlag.READ in flags else os.O_WRONLY
    else:
        bits = os.O_RDONLY
    for flag, bit in (
        (OpenFlag.APPEND, os.O_APPEND),
        (OpenFlag.CREATE, os.O_CREAT),
        (OpenFlag.EXCLUSIVE, os.O_EXCL),
        (OpenFlag.TRUNCATE, os.O_TRUNC),
    ):
        if flag in flags:
            bits |= bit
    # F-16: never follow a symbolic link, never block opening a FIFO.
    return bits | _O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK


class _Ticker:
    """A daemon thread that calls a function every interval until cancelled."""

    def __init__(self, interval_s: float, callback: Callable[[], None]) -> None:
        self._stop = threading.Event()
        self._interval_s = interval_s
        self._callback = callback
        self._thread = threading.Thread(target=self._run, name="deferq-ticker", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self._callback()
            except Exception:  # noqa: BLE001 - the callback records its own failure state.
                # The callback (Disk.tick) turns failures into the backend's BROKEN state,
                # which the next foreground call reports; a background thread has no caller.
                continue

    def cancel(self) -> None:
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join()


class OsEnv:
    """The operating system as an ``Env``."""

    reserve_bytes: int = WAL_RESERVE_BYTES
    map_granularity: int = mmap.ALLOCATIONGRANULARITY

    def open(self, path: str, flags: OpenFlag, mode: int = 0o600) -> int:
        """Implements F-16: open a regular file, never following a symbolic link and never
        waiting on a FIFO (``O_NOFOLLOW | O_NONBLOCK``; the non-blocking flag changes
        nothing for a regular file's reads and writes on Linux), then check what was opened.
        """
        return self._open_at(path, path, flags, mode, None)

    def _open_at(self, path: str, name: str, flags: OpenFlag, mode: int, dir_fd: int | None) -> int:
        """``open`` of ``name`` (relative to ``dir_fd`` when given); errors name ``path``."""
        bits = _OS_BITS.get(flags._value_)  # an int key: hashing the Flag is a Python call
        if bits is None:
            bits = _OS_BITS[flags._value_] = os_flags(flags)
        try:
            fd = os.open(name, bits, mode, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UnsafeEntryError(exc.errno, f"{path} is a symbolic link; deferq never "
                                       "follows one in its storage directory") from None
            if exc.errno == errno.ENXIO:  # a FIFO opened for writing with no reader
                raise UnsafeEntryError(exc.errno, f"{path} is a FIFO or socket, not a regular "
                                       "file; deferq never waits on one") from None
            if exc.errno == errno.EISDIR:  # a directory opened for writing
                raise UnsafeEntryError(exc.errno, f"{path} is a directory, not a regular "
                                       "file") from None
            exc.filename = path  # the storage directory's file, not a bare name (DirEnv)
            raise
        mode_bits = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode_bits):
            os.close(fd)
            kind = ("a directory" if stat.S_ISDIR(mode_bits) else
                    "a FIFO" if stat.S_ISFIFO(mode_bits) else
                    "a socket" if stat.S_ISSOCK(mode_bits) else "a device or special file")
            raise UnsafeEntryError(errno.EINVAL, f"{path} is {kind}, not a regular file")
        _PATHS[fd] = path
        return fd

    def makedirs(self, path: str, mode: int = 0o700) -> None:
        """Implements F-26: create ``path`` with ``mode`` and each missing parent with 0755.

        Unlike ``os.makedirs`` (whose parents get 0777 before the umask), no directory made
        here is writable by group or others under any umask, umask 0 included.
        """
        head, tail = os.path.split(path)
        if not tail:
            head, tail = os.path.split(head)
        if head and tail and not os.path.lexists(head):
            self.makedirs(head, PARENT_DIR_MODE)
        if tail in ("", ".", ".."):
            return
        try:
            os.mkdir(path, mode)
        except FileExistsError:
            if not os.path.isdir(path):
                raise

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        try:
            return os.pread(fd, size, offset)
        except OSError as exc:
            if exc.filename is None:  # pread takes a descriptor: say which file failed
                exc.filename = _PATHS.get(fd)
            raise

    # The two calls of the WAL's hot path are the builtins themselves (no Python frame).
    write: Callable[[int, bytes], int] = staticmethod(os.write)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def ftruncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def allocate(self, fd: int, offset: int, length: int) -> None:
        if _posix_fallocate is None:  # macOS has no posix_fallocate: the WAL stops asking (W-25)
            raise OSError(errno.EOPNOTSUPP, "posix_fallocate is not available on this system")
        _posix_fallocate(fd, offset, length)

    def seek(self, fd: int, offset: int) -> None:
        os.lseek(fd, offset, os.SEEK_SET)

    def map_shared(self, fd: int, offset: int, length: int) -> MappedWindow:
        if not _MAP_FSYNC_COVERED:
            raise OSError(errno.ENOTSUP, "W-26 maps WAL space only where fsync covers stores (Linux)")
        kind = fs_type(fd)
        if kind not in MAP_SAFE_FILESYSTEMS:
            raise OSError(errno.ENOTSUP, f"W-26 does not map files on {kind or 'an unknown'} "
                          "filesystem: a store there could need space and fail with SIGBUS")
        try:
            return mmap.mmap(fd, length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE,
                             offset=offset)
        except ValueError as exc:  # Python's own checks (a file shorter than the window)
            raise OSError(errno.EINVAL, str(exc)) from exc

    def fstat(self, fd: int) -> FileStat:
        st = os.fstat(fd)
        return FileStat(st.st_dev, st.st_ino, st.st_size, st.st_nlink, st.st_ctime_ns)

    def close(self, fd: int) -> None:
        _PATHS.pop(fd, None)
        os.close(fd)

    def flock_exclusive_nb(self, fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return False
            raise
        return True

    def flock_unlock(self, fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)

    def rename(self, src: str, dst: str) -> None:
        os.rename(src, dst)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    def fsync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _O_CLOEXEC)
        try:
            os.fsync(fd)
        except OSError as exc:
            exc.filename = path  # fsync takes a descriptor: say which directory failed
            raise
        finally:
            os.close(fd)

    def time(self) -> float:
        return time.time()

    monotonic = staticmethod(_monotonic)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def getpid(self) -> int:
        return _pid

    def random_u32(self) -> int:
        return int.from_bytes(os.urandom(4), "big")  # what SystemRandom().getrandbits(32) reads

    def local_date(self) -> str:
        return time.strftime("%Y%m%d", time.localtime())

    def call_every(self, interval_s: float, callback: Callable[[], None]) -> Cancel:
        return _Ticker(interval_s, callback)

    def mutex(self) -> Mutex:
        """M-15: a plain ``threading.Lock``, so the engine's hot paths cost what they did."""
        return threading.Lock()

    def condition(self, mutex: Mutex) -> Condition:
        # The cast is the OS adapter's: every Mutex this Env hands out is a threading.Lock
        # (``mutex`` above), which is what threading.Condition is typed to take.
        return threading.Condition(cast("threading.Lock", mutex))


OS_ENV = OsEnv()
"""The one real Env of this process: every Disk opened without ``env=`` shares its id source."""

_O_DIRECTORY: Final = getattr(os, "O_DIRECTORY", 0)


class DirEnv(OsEnv):
    """The operating system as an ``Env`` for one storage directory, held open (F-25).

    The directory is opened once, with ``O_DIRECTORY | O_NOFOLLOW``, and every name the
    engine uses in it (``join(directory, name)``) is opened, renamed, unlinked, listed and
    fsynced relative to that descriptor (``dir_fd=``). So nothing the process later does
    with its working directory, nor a rename or replacement of the directory's path, can
    redirect a write: the engine keeps working in the directory ``Disk()`` opened. A path
    outside the directory is a programming error (``ValueError``). Process facts (the
    clock, the pid, the id source, W-28) are the process's: see ``process_env``.
    """

    def __init__(self, directory: str) -> None:
        self.directory = directory
        #: The Env whose id source this one shares (W-28: one source per process).
        self.process_env: OsEnv = OS_ENV
        self._prefix = directory.rstrip("/") + "/" if directory not in ("", ".") else ""
        try:
            self._dir_fd: int | None = os.open(directory, os.O_RDONLY | _O_DIRECTORY
                                               | os.O_NOFOLLOW | _O_CLOEXEC)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(directory):
                raise UnsafeEntryError(exc.errno, f"storage directory {directory} is a symbolic "
                                       "link; deferq never follows one: pass the directory it "
                                       "points to") from None
            raise
        try:
            st = os.fstat(self._dir_fd)
            self._check_directory(st)
        except BaseException:
            self.close_directory()
            raise
        self._owner = (st.st_uid, st.st_gid)
        # F-28: as root in another user's directory, every file created goes to that user.
        self._give_away = os.geteuid() == 0 and st.st_uid != 0

    def _check_directory(self, st: os.stat_result) -> None:
        """Implements F-27 for the directory: not writable by others, and the caller's own."""
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o022:
            raise UnsafeEntryError(errno.EPERM, f"storage directory {self.directory} has mode "
                                   f"{mode:04o}: anyone in its group or every user could plant or "
                                   f"replace its files; run chmod go-w {self.directory}")
        euid = os.geteuid()
        if euid != 0 and st.st_uid != euid:
            raise UnsafeEntryError(errno.EPERM, f"storage directory {self.directory} belongs to "
                                   f"uid {st.st_uid}, not to this process's user (uid {euid}): "
                                   "run as its owner")

    def _check_file(self, path: str, fd: int, flags: OpenFlag) -> None:
        """Implements F-27 and F-28 for a file just opened in the directory."""
        st = os.fstat(fd)
        uid, gid = self._owner
        if self._give_away and st.st_uid == 0 and OpenFlag.CREATE in flags:
            os.fchown(fd, uid, gid)  # F-28: before anything is written to it
        elif st.st_uid not in (uid, 0):
            raise UnsafeEntryError(errno.EPERM, f"{path} belongs to uid {st.st_uid}, not to the "
                                   f"storage directory's owner (uid {uid}); deferq never uses it")
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o022:
            raise UnsafeEntryError(errno.EPERM, f"{path} has mode {mode:04o}: writable by group or "
                                   f"others, so deferq never uses it; run chmod go-w {path}")

    def dir_fd(self) -> int:
        """The storage directory's descriptor; ``ValueError`` once closed."""
        if self._dir_fd is None:
            raise ValueError(f"the storage directory {self.directory} was closed")
        return self._dir_fd

    def close_directory(self) -> None:
        """Close the directory's descriptor (``Disk.close``); idempotent."""
        fd, self._dir_fd = self._dir_fd, None
        if fd is not None:
            os.close(fd)

    def _name(self, path: str) -> str:
        """The name ``path`` has in the directory; ``ValueError`` for any other path."""
        name = path[len(self._prefix):] if path.startswith(self._prefix) else ""
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"{path!r} is not a file of the storage directory {self.directory!r}")
        return name

    def _is_directory(self, path: str) -> bool:
        if path != self.directory and path.rstrip("/") != self.directory.rstrip("/"):
            raise ValueError(f"{path!r} is not the storage directory {self.directory!r}")
        return True

    def open(self, path: str, flags: OpenFlag, mode: int = 0o600) -> int:
        fd = self._open_at(path, self._name(path), flags, mode, self.dir_fd())
        try:
            self._check_file(path, fd, flags)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def rename(self, src: str, dst: str) -> None:
        fd = self.dir_fd()
        try:
            os.rename(self._name(src), self._name(dst), src_dir_fd=fd, dst_dir_fd=fd)
        except OSError as exc:
            exc.filename, exc.filename2 = src, dst  # the paths, not bare names
            raise

    def unlink(self, path: str) -> None:
        try:
            os.unlink(self._name(path), dir_fd=self.dir_fd())
        except OSError as exc:
            exc.filename = path  # the path, not a bare name
            raise

    def makedirs(self, path: str, mode: int = 0o700) -> None:
        self._is_directory(path)  # it exists: it is open

    def listdir(self, path: str) -> list[str]:
        self._is_directory(path)
        return os.listdir(self.dir_fd())

    def fsync_dir(self, path: str) -> None:
        self._is_directory(path)
        try:
            os.fsync(self.dir_fd())
        except OSError as exc:
            exc.filename = self.directory  # say which directory failed
            raise
