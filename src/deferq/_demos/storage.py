"""``deferq demo``: the storage engine on its own, narrated: add, dead-letter, list, find, remove,
restart, with the files on disk shown between the steps.
"""

from __future__ import annotations

import os

from deferq._cli.ops import file_size_text
from deferq.backends import Disk


def _show_files(path: str) -> None:
    print(f"  files in {path}:")
    for name in sorted(os.listdir(path)):
        print(f"    {name:<48} {file_size_text(os.path.join(path, name))}")


class _Failure(Exception):
    """Raised inside the demo to produce a real traceback for a dead task."""


def _charge_card(order: int) -> None:
    raise _Failure(f"card declined for order {order}")


def demo(path: str) -> int:
    """Add tasks, dead-letter some, list/find/remove them, restart, and show the files."""
    print(f"deferq storage demo in {path}\n")
    print("1. A worker opens a Disk backend and enqueues five tasks (contexts are opaque bytes).")
    with Disk(path=path, fsync_frequency=0.5) as disk:
        ids = [disk.add_task(f'{{"task": "ChargeCard", "order": {n}}}'.encode()) for n in range(5)]
        later = disk.add_task(b'{"task": "SendReport"}', publish_at=int(2e9))
        for task_id in ids:
            print(f"   enqueued {task_id}")
        print(f"   enqueued {later} (delayed until 2033-05-18)")
        disk.sync()
        _show_files(path)

        print("\n2. Orders 0 and 1 succeed and leave the WAL; orders 2-4 give up and are dead-lettered")
        print("   (dead-task record first, WAL removal second: a crash in between duplicates, never loses).")
        for task_id in ids[:2]:
            disk.remove_task(task_id)
        for n, task_id in enumerate(ids[2:], start=2):
            try:
                _charge_card(n)
            except _Failure as exc:
                disk.add_dead_task(task_id, f'{{"order": {n}}}'.encode(), exc,
                                   task_class="ChargeCard", attempts=21)
            disk.remove_task(task_id)
            print(f"   dead-lettered {task_id}")

        print("\n3. An operator lists the dead tasks, newest first, and looks one up.")
        for task in disk.list_dead_tasks(limit=10):
            print(f"   {task.id}  {task.task_class}  attempts={task.attempts}  "
                  f"{task.exception_class}: {task.exception_message}")
        found = disk.find_dead_task(ids[3])
        assert found is not None
        print(f"   find {ids[3]}: context={found.context!r}, {len(found.backtrace)} frame(s), "
              f"innermost {found.backtrace[-1]}")

        print("\n4. The operator removes two of them (one id twice, one unknown id: counted once / not at all).")
        removed = disk.remove_dead_tasks([ids[2], ids[2], ids[4], "no-such-task"])
        print(f"   removed {removed}; left: {[t.id for t in disk.list_dead_tasks()]}")
        _show_files(path)

    print("\n5. The worker restarts: it adopts its old WAL file and replays what is still pending.")
    with Disk(path=path) as disk:
        for pending in disk.pending_tasks():
            print(f"   pending {pending.task_id} publish_at={pending.publish_at} "
                  f"context={pending.context!r}")
        print(f"   dead tasks still stored: {[t.id for t in disk.list_dead_tasks()]}")
    print("\ndemo: ok")
    return 0
