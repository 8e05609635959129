"""A tiny service run as a real process by the queue's process tests.

Goal: drive a real ``Queue`` over a real ``Disk`` in a separate interpreter so
that SIGKILL, flock and cross-process reads behave as in production. Method:
``python -m tests.queue.worker_app PATH MODE`` where MODE is

- ``hang``: enqueue ``Chore``, whose first run prints ``started ID`` and then
  waits forever (the parent SIGKILLs the process there);
- ``replay``: start (replaying the WAL), let every task run, print
  ``ran ID ATTEMPT`` for each, print ``idle`` and stop;
- ``deadletter``: enqueue ``Doomed`` (gives up at once), wait, print
  ``dead ID`` and exit;
- ``serve``: start with a 0.2 s adoption sweep (Q-70), print ``ready``, run every task
  it replays or adopts (printing ``ran ID ATTEMPT LABEL``) until it is killed;
- ``crash-after-dead``: like ``deadletter``, but the process SIGKILLs itself
  inside ``remove_task``, right after the dead-task write returned (the
  window D-13 is about); it prints ``dead-written ID`` first.

The parent side lives in ``spawn``; every line is flushed at once.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import deferq
from deferq.backends import Disk

ROOT = Path(__file__).resolve().parents[2]


class Chore(deferq.Task, name="app.Chore"):
    hang = True

    async def perform(self, label: str) -> None:
        if Chore.hang:
            print(f"started {self.task_id}", flush=True)
            await asyncio.Event().wait()
        print(f"ran {self.task_id} {self.attempt} {label}", flush=True)


class Doomed(deferq.Task, name="app.Doomed"):
    def perform(self, order: int) -> None:
        raise RuntimeError(f"card declined for order {order}")

    def retry_interval(self, exception: BaseException, attempt: int) -> object:
        return None


class DiesBeforeRemoval(Disk):
    """A Disk whose process is killed between a dead-task write and the WAL removal."""

    dead_written: str | None = None

    def add_dead_task(self, task_id: str, context: bytes, exception: BaseException, *,
                      task_class: str, attempts: int) -> str:
        stored = super().add_dead_task(task_id, context, exception, task_class=task_class,
                                       attempts=attempts)
        self.dead_written = task_id
        print(f"dead-written {task_id}", flush=True)
        return stored

    def remove_task(self, task_id: str, *, sync: bool = True) -> None:
        if task_id == self.dead_written:
            os.kill(os.getpid(), signal.SIGKILL)
        super().remove_task(task_id, sync=sync)


async def main(path: str, mode: str) -> int:
    disk_class = DiesBeforeRemoval if mode == "crash-after-dead" else Disk
    with disk_class(path=path, fsync_frequency=0) as disk:
        queue = deferq.Queue(disk, sweep_interval=0.2 if mode == "serve" else 2.0)
        if mode == "serve":
            Chore.hang = False
            await queue.start()
            print("ready", flush=True)
            await asyncio.Event().wait()
        if mode == "hang":
            await queue.start()
            queue.enqueue(Chore, "chore")
            await asyncio.Event().wait()
        elif mode == "replay":
            Chore.hang = False
            await queue.start()
            await queue.wait_idle()
            print("idle", flush=True)
        elif mode in ("deadletter", "crash-after-dead"):
            await queue.start()
            task_id = queue.enqueue(Doomed, 42)
            await queue.wait_idle()
            print(f"dead {task_id}", flush=True)
        else:
            print(f"unknown mode {mode}", file=sys.stderr)
            return 2
        await queue.stop(timeout=1)
    return 0


def spawn(path: Path, mode: str) -> subprocess.Popen[str]:
    """Start the app in a fresh interpreter with deferq and the tests importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH", "")) if p)
    return subprocess.Popen([sys.executable, "-m", "tests.queue.worker_app", str(path), mode],
                            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], sys.argv[2])))
