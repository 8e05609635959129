"""A service with a 1-second schedule, run as a real process by test_periodic_processes.py.

``python -m tests.multiprocess.periodic_worker PATH SECONDS``: a ``Queue`` on a real
``Disk`` in PATH with ``Schedule(Beat, every=1)`` and a 0.1 s leader poll; it prints
``ready PID`` once started and ``fired DUE PID`` for every firing (from the enqueue hook,
before the firing's record is written), runs for SECONDS (or until killed), then stops.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import sys

import deferq
from deferq.backends import Disk

REG = deferq.TaskRegistry()


class Beat(deferq.Task, name="pw.Beat", registry=REG, inline=True):
    def perform(self) -> None:
        pass


class Printer(deferq.Hooks):
    def on_enqueued(self, event: deferq.TaskEnqueued) -> None:
        due = datetime.datetime.fromisoformat(event.meta["deferq.due"]).timestamp()
        print(f"fired {int(due)} {os.getpid()}", flush=True)


async def main(path: str, seconds: float) -> None:
    with Disk(path=path, fsync_frequency=0) as disk:
        schedules = deferq.Schedules((deferq.Schedule(Beat, every=1),), poll_s=0.1)
        async with deferq.Queue(disk, registry=REG, hooks=[Printer()], sweep_interval=0.2,
                                schedules=schedules):
            print(f"ready {os.getpid()}", flush=True)
            await asyncio.sleep(seconds)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], float(sys.argv[2])))
