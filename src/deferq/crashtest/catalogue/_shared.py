"""What the catalogue's mutants share: a Disk subclass around a broken engine class, workload
shorthands, and the real compaction with one of its fsyncs left out."""

from __future__ import annotations

from deferq._core.limits import FILE_MODE
from deferq._engine.deadstore import DeadTaskStore
from deferq._engine.env import Env, OpenFlag
from deferq._engine.io import write_all
from deferq._engine.wal import TasksWal
from deferq.backends import Disk
from deferq.crashtest._crashrun import HandoffOps
from deferq.crashtest._workloads import Step, Workload


def dead_id(line: bytes) -> str:
    from deferq._core.deadcodec import decode_dead_line  # noqa: PLC0415
    from deferq._core.frame import BadLine  # noqa: PLC0415

    framed = decode_dead_line(line)
    return "" if isinstance(framed, BadLine) else framed.task_id


def write_at(env: Env, fd: int, data: bytes) -> None:
    """Write ``data`` from offset 0 of a non-append descriptor just truncated to 0."""
    write_all(env, fd, data)


def compact(store: DeadTaskStore, task_ids: set[str], *, fsync_tmp: bool,
             fsync_dir: bool) -> int:
    """The real compaction with one of its two fsyncs left out."""
    if not task_ids:
        return 0
    env = store._env
    with store._locked("delete tasks from"):
        tmp_fd = env.open(store._tmp, OpenFlag.WRITE | OpenFlag.CREATE | OpenFlag.TRUNCATE,
                          FILE_MODE)
        try:
            found = store._copy_survivors(tmp_fd, task_ids)
            if found and fsync_tmp:
                env.fsync(tmp_fd)
        finally:
            env.close(tmp_fd)
        if not found:
            env.unlink(store._tmp)
            return 0
        env.rename(store._tmp, store._data)
        if fsync_dir:
            env.fsync_dir(store._path)
        return len(found)


def disk_with(name: str, *, wal: type[TasksWal] = TasksWal,
          dead: type[DeadTaskStore] = DeadTaskStore) -> type[Disk]:
    return type(name, (Disk,), {"_wal_class": wal, "_dead_class": dead})


def swapped_handoff(ops: HandoffOps, task_id: str) -> None:
    """Removes the task from the WAL before its dead record exists (breaks D-13)."""
    ops.remove_task(task_id)
    ops.add_dead(task_id)


def workload(*steps: Step, f: float = 0.0, start: str = "empty", rotate: bool = False) -> Workload:
    return Workload(tuple(steps), f, start, rotate)


ADD = Step("add", 0)


