"""A task that cannot be loaded at replay is dead-lettered with its reason whatever its name
(spec/queue.md Q-9, Q-31): over 1,024 UTF-8 bytes, lone surrogates, not UTF-8 at all.

Method: write such contexts into a real WAL with ``Disk`` (the storage is opaque bytes), start
a real queue on the directory, and check every one is in the dead-task store and none is left
pending; a second start finds nothing to do.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

import deferq
from deferq._core.limits import TASK_CLASS_BYTES_MAX
from deferq.backends import Disk

CONTEXTS = {
    "long-name": json.dumps({"v": 1, "task": "é" * 2000, "args": [], "kwargs": {},
                             "attempts": 3}).encode(),
    "surrogate-name": b'{"v":1,"task":"bad\\ud800name","args":[],"kwargs":{},"attempts":1}',
    "not-utf8": b'{"v":1,"task":"\xff\xfe","args":[],"kwargs":{},"attempts":0}',
    "empty-name": b'{"v":1,"task":"","args":[],"kwargs":{},"attempts":0}',
}


async def _start_and_stop(path: Path) -> None:
    queue = deferq.Queue(Disk(path=path, fsync_frequency=0), registry=deferq.TaskRegistry())
    await queue.start()
    await queue.wait_idle()
    await asyncio.sleep(0.05)
    await queue.stop(timeout=1)


@pytest.mark.spec("Q-9", "Q-31")
def test_every_unloadable_task_is_dead_lettered_whatever_its_name(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with Disk(path=path) as disk:
        ids = {name: disk.add_task(context) for name, context in CONTEXTS.items()}
    asyncio.run(_start_and_stop(path))
    with Disk(path=path) as disk:
        assert disk.pending_tasks() == []
        dead = {task.id: task for task in disk.list_dead_tasks()}
    assert set(dead) == set(ids.values())
    for name, task_id in ids.items():
        task = dead[task_id]
        assert task.exception_class == "deferq.UnloadableTaskError", name
        assert len(task.task_class.encode("utf-8")) <= TASK_CLASS_BYTES_MAX
        assert task.context == CONTEXTS[name]  # stored as it was, for a retry
    assert dead[ids["long-name"]].task_class.endswith("...[truncated]")
    assert dead[ids["long-name"]].task_class.startswith("é" * 400)
    assert dead[ids["surrogate-name"]].task_class == "bad\\ud800name"
    assert dead[ids["not-utf8"]].task_class == "<unknown>"
    # The next start has nothing left to replay: the error does not repeat at every start.
    asyncio.run(_start_and_stop(path))
    with Disk(path=path) as disk:
        assert disk.pending_tasks() == [] and len(disk.list_dead_tasks()) == len(CONTEXTS)
