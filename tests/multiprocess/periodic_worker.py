"""A service with a 1-second schedule, run as a real process by test_periodic_processes.py.

``python -m tests.multiprocess.periodic_worker PATH SECONDS [MODE]``: a ``Queue`` on a real
``Disk`` in PATH with the schedule ``beat`` (every second) and a 0.1 s leader poll; it prints
``ready PID`` once started and ``fired DUE PID`` for every firing (from the enqueue hook,
before the firing's record is written), runs for SECONDS (or until killed), then stops.
MODE ``hold``: the schedule's task is ``Hold``, which prints ``started ID PID`` and never
ends; ``hold-die``: the same, and the process SIGKILLs itself when it is about to write the
record of its first firing (the window of D-28).
"""

from __future__ import annotations

import asyncio
import datetime
import os
import signal
import sys
from collections.abc import Mapping

import deferq
from deferq._engine.schedstore import ScheduleStore
from deferq.backends import Disk

REG = deferq.TaskRegistry()


class Beat(deferq.Task, name="pw.Beat", registry=REG, inline=True):
    def perform(self) -> None:
        pass


class Hold(deferq.Task, name="pw.Hold", registry=REG):
    async def perform(self) -> None:
        print(f"started {self.task_id} {os.getpid()}", flush=True)
        await asyncio.Event().wait()


class DiesBeforeRecord(ScheduleStore):
    writes = 0

    def write(self, fired: Mapping[str, int]) -> None:
        DiesBeforeRecord.writes += 1
        if DiesBeforeRecord.writes > 1:  # the first write is the start of Q-125
            os.kill(os.getpid(), signal.SIGKILL)
        super().write(fired)


class DyingDisk(Disk):
    def open_schedules(self) -> ScheduleStore:
        store = super().open_schedules()
        store.__class__ = DiesBeforeRecord
        return store


class Printer(deferq.Hooks):
    def on_enqueued(self, event: deferq.TaskEnqueued) -> None:
        due = datetime.datetime.fromisoformat(event.meta["deferq.due"]).timestamp()
        print(f"fired {int(due)} {os.getpid()}", flush=True)


async def main(path: str, seconds: float, mode: str) -> None:
    disk_class = DyingDisk if mode == "hold-die" else Disk
    with disk_class(path=path, fsync_frequency=0) as disk:
        task = Hold if mode.startswith("hold") else Beat
        schedules = deferq.Schedules((deferq.Schedule(task, every=1, name="beat"),), poll_s=0.1)
        async with deferq.Queue(disk, registry=REG, hooks=[Printer()], sweep_interval=0.2,
                                schedules=schedules):
            print(f"ready {os.getpid()}", flush=True)
            await asyncio.sleep(seconds)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], float(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else ""))
