"""Real short writes: a full ext4 filesystem, where ``write`` returns fewer bytes than asked.

Theory of operation. strace's ``retval=`` injection skips the syscall, so it
cannot make an honest short write; a full filesystem can. ``run_enospc``
mounts a small fresh ext4 image (call it inside a private mount namespace),
opens a ``Disk`` whose ``Env`` records what every real ``write`` returned,
fills the filesystem, then adds a large task and dead-letters a large task.
It returns the problems found (D-10, W-13, S-4, G8 of the crash-testing
reference): a call that hit ENOSPC must raise, must leave its file exactly as
long as before (no partial line), the store must keep working once space is
freed, and a fresh ``Disk`` must read back exactly what was acknowledged.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable

from deferq._core.errors import DeferqError
from deferq._engine.osenv import OsEnv
from deferq.powertest._fs import Image
from deferq.backends import Disk

BIG = 3 * 1024 * 1024
LEAVE = 512 * 1024  # free space left: a big write gets part of it, a short write


def _records_end(wal: str) -> int:
    """Where a WAL file's records end: its size less the space reserved after them (R-@L)."""
    with open(wal, "rb") as f:
        return len(f.read().rstrip(b"\0"))


class RecordingEnv(OsEnv):
    """The real OS, remembering every write's asked and returned sizes."""

    def __init__(self) -> None:
        self.writes: list[tuple[int, int | str]] = []

    def write(self, fd: int, data: bytes) -> int:
        try:
            written = super().write(fd, data)
        except OSError as exc:
            self.writes.append((len(data), errno.errorcode.get(exc.errno or 0, "?")))
            raise
        self.writes.append((len(data), written))
        return written


def _fill(directory: str, leave: int) -> str:
    """Fill the filesystem, then free ``leave`` bytes; return the filler file's path."""
    filler = os.path.join(directory, "filler")
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    chunk = b"\0" * (1 << 20)
    try:
        while True:
            try:
                if os.write(fd, chunk) < len(chunk):
                    chunk = chunk[: max(1, len(chunk) // 2)]
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                if len(chunk) == 1:
                    break
                chunk = chunk[: len(chunk) // 2]
        os.ftruncate(fd, max(0, os.fstat(fd).st_size - leave))
        os.fsync(fd)
    finally:
        os.close(fd)
    return filler


def run_enospc() -> tuple[list[str], list[tuple[int, int | str]]]:
    """Returns (problems, the (asked, returned) of every engine write that hit the full disk)."""
    problems: list[str] = []
    env = RecordingEnv()
    with Image(size_mib=16) as image:
        storage = os.path.join(image.mountpoint, "storage")
        with Disk(path=storage, fsync_frequency=0, env=env) as disk:
            kept = disk.add_task(b"before the disk filled up")
            disk.add_dead_task("dead-before", b"x", RuntimeError("x"), task_class="T", attempts=1)
            wal = os.path.join(storage, disk._wal.file_name)  # noqa: SLF001
            dead = os.path.join(storage, "deferred-dead_tasks-0")
            sizes = (_records_end(wal), os.path.getsize(dead))
            filler = _fill(image.mountpoint, LEAVE)
            start = len(env.writes)
            big = os.urandom(BIG // 2).hex().encode()
            calls: list[tuple[str, Callable[[], str]]] = [
                ("add_task", lambda: disk.add_task(big)),
                ("add_dead_task", lambda: disk.add_dead_task(
                    "dead-big", big, RuntimeError("big"), task_class="T", attempts=1)),
            ]
            for name, call in calls:
                try:
                    call()
                    problems.append(f"{name} of {BIG} bytes returned on a full filesystem")
                except (DeferqError, OSError):
                    pass
            full_writes = env.writes[start:]
            if not any(isinstance(r, int) and 0 < r < asked for asked, r in full_writes):
                problems.append(f"no short write happened (the test did not test): {full_writes}")
            if (_records_end(wal), os.path.getsize(dead)) != sizes:
                problems.append(f"a failed write left a partial line: sizes {sizes} -> "
                                f"{(_records_end(wal), os.path.getsize(dead))}")
            os.unlink(filler)
            try:
                after = disk.add_task(b"after space was freed")
                disk.add_dead_task("dead-after", b"y", RuntimeError("y"), task_class="T",
                                   attempts=1)
            except (DeferqError, OSError) as exc:
                problems.append(f"the store did not resume once space was freed: {exc!r}")
                after = ""
        with Disk(path=storage, fsync_frequency=0) as disk:
            pending = {t.task_id: t.context for t in disk.pending_tasks()}
            dead_ids = {t.id for t in disk.list_dead_tasks()}
        expected = {kept: b"before the disk filled up"}
        if after:
            expected[after] = b"after space was freed"
        if pending != expected:
            problems.append(f"after a restart the pending tasks are {sorted(pending)}, "
                            f"expected {sorted(expected)}")
        if dead_ids != ({"dead-before", "dead-after"} if after else {"dead-before"}):
            problems.append(f"after a restart the dead tasks are {sorted(dead_ids)}")
    return problems, full_writes


def main() -> int:
    problems, writes = run_enospc()
    print("writes on the full filesystem (asked, returned):", writes)
    for problem in problems:
        print("PROBLEM", problem)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
