"""The periodic schedules' files: the leader's lock and the last fired due times (spec/format.md F-42, spec/dead-tasks.md L-9..L-12).

Rules: one worker of a storage directory at a time is the schedules' *leader*: the one
whose open description of the lock file holds its ``flock`` (L-9). Taking it never waits
(``LOCK_NB``): a follower tries again at its poll interval (L-11); the leader keeps it
until it closes the store or its process ends, when the kernel releases it (L-10). The
lock file is created once and never renamed or unlinked, so every worker locks one inode.
Threads of one process share one store, and only the runtime's one poller uses it, so no
process-local mutex is needed (unlike the dead-task store's L-1).

The record file (F-42) is written only by the leader, whole: the new bytes go to a staging
file, which is fsynced, renamed over the record file, and the directory fsynced, before
``write`` returns (L-12); a crash leaves the old file or the new one, never a mix (A-3).
Reading needs no lock; the leader reads once after it takes the lock, since nobody else
writes while it holds it. Every call blocks on I/O: the runtime calls it in a thread.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from deferq._core.limits import FILE_MODE
from deferq._core.names import schedules_data_name, schedules_lock_name, schedules_tmp_name
from deferq._core.schedcodec import decode_schedules, encode_schedules
from deferq._engine.env import Env, OpenFlag
from deferq._engine.io import chunks_forward, join, name_file, write_all

log = logging.getLogger("deferq.schedules")

_ENOENT = 2


class ScheduleStore:
    """The leader lock and the record file of one storage directory's schedules."""

    def __init__(self, env: Env, path: str, prefix: str) -> None:
        self._env = env
        self._path = path
        self._data = join(path, schedules_data_name(prefix))
        self._tmp = join(path, schedules_tmp_name(prefix))
        # Implements L-9: opened once and kept; the flock is on this description.
        self._lock_fd: int | None = env.open(join(path, schedules_lock_name(prefix)),
                                             OpenFlag.READ | OpenFlag.WRITE | OpenFlag.CREATE,
                                             FILE_MODE)
        self.leading = False

    def try_lead(self) -> bool:
        """Implements L-9, L-11: take the leader lock without waiting; True while held."""
        if not self.leading:
            assert self._lock_fd is not None, "the schedule store is closed"
            self.leading = self._env.flock_exclusive_nb(self._lock_fd)
        return self.leading

    def read(self) -> dict[str, int]:
        """Implements F-45: each schedule's last fired due time; {} when there is no file."""
        env = self._env
        try:
            fd = env.open(self._data, OpenFlag.READ)
        except OSError as exc:
            if exc.errno == _ENOENT:
                return {}
            raise
        try:
            data = b"".join(chunks_forward(env, fd, env.fstat(fd).size))
        finally:
            env.close(fd)
        fired, dropped = decode_schedules(data)
        if dropped:
            log.warning("%d damaged line(s) of %s dropped; their schedules start afresh",
                        dropped, self._data)
        return fired

    def write(self, fired: Mapping[str, int]) -> None:
        """Implements L-12: replace the record file, durably, before returning."""
        assert self.leading, "only the leader writes the schedules' records (L-9)"
        env = self._env
        fd = env.open(self._tmp, OpenFlag.WRITE | OpenFlag.CREATE | OpenFlag.TRUNCATE, FILE_MODE)
        try:
            write_all(env, fd, encode_schedules(fired))
            env.fsync(fd)
        except OSError as exc:
            name_file(exc, self._tmp)  # S-91: the leader's log line says which file failed
            raise
        finally:
            env.close(fd)
        env.rename(self._tmp, self._data)
        env.fsync_dir(self._path)

    def close(self) -> None:
        """Implements L-10: close the lock file, which releases the lock."""
        if self._lock_fd is not None:
            fd, self._lock_fd = self._lock_fd, None
            self.leading = False
            self._env.close(fd)
