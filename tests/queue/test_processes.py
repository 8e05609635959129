"""The queue over a real Disk with real processes: SIGKILL replay, cross-process dead-task
reads, and an event loop that keeps running while another process holds the dead-task lock.

Goal: Q-9 and Q-10 (and D-13 end to end) where only real processes tell the
truth. Method: ``tests.queue.worker_app`` runs a real service in a child
interpreter; the parent waits for a line the child prints at the exact point
of interest (never a sleep), then kills it or reads what it wrote. For the
heartbeat, a child takes ``flock`` on the dead-task lock file and releases it
when the parent says so, while the parent's loop ticks every 10 ms and a
give-up waits for the lock in a worker thread.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import deferq
from deferq._core.names import dead_lock_name
from deferq.backends import Disk
from tests.queue.worker_app import ROOT, spawn

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

REG = deferq.TaskRegistry()


class GivesUp(deferq.Task, name="p.GivesUp", registry=REG):
    def perform(self) -> None:
        raise RuntimeError("nope")

    def retry_interval(self, exception: BaseException, attempt: int) -> object:
        return None


def _line(proc: subprocess.Popen[str], timeout: float = 20.0) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    line = proc.stdout.readline()
    assert time.monotonic() < deadline, "child too slow"
    if not line:
        proc.wait(5)
        assert proc.stderr is not None
        raise AssertionError(f"child exited {proc.returncode}: {proc.stderr.read()}")
    return line.strip()


@pytest.mark.spec("Q-9", "Q-7")
def test_worker_killed_mid_task_replays_it_on_restart(storage: Path) -> None:
    child = spawn(storage, "hang")
    try:
        started = _line(child)
        assert started.startswith("started ")
        task_id = started.split()[1]
        child.send_signal(signal.SIGKILL)
        assert child.wait(10) == -signal.SIGKILL
    finally:
        child.kill()
        child.wait()
    restart = spawn(storage, "replay")
    try:
        assert _line(restart) == f"ran {task_id} 1 chore"
        assert _line(restart) == "idle"
        assert restart.wait(20) == 0
    finally:
        restart.kill()
        restart.wait()
    with Disk(path=storage) as disk:  # done for good: nothing left to replay
        assert disk.pending_tasks() == []


@pytest.mark.spec("D-13", "Q-8", "Q-9", "Q-141")
def test_crash_between_dead_write_and_wal_removal_keeps_the_task_in_both(storage: Path) -> None:
    child = spawn(storage, "crash-after-dead")
    try:
        line = _line(child)
        assert line.startswith("dead-written ")
        assert child.wait(20) == -signal.SIGKILL
    finally:
        child.kill()
        child.wait()
    task_id = line.split()[1]
    with Disk(path=storage) as disk:
        assert [t.task_id for t in disk.pending_tasks()] == [task_id]  # in the WAL...
        assert [t.id for t in disk.list_dead_tasks()] == [task_id]     # ...and dead-lettered
    replay = spawn(storage, "replay")  # at-least-once: it runs again and gives up again
    try:
        assert _line(replay) == "idle"
        assert replay.wait(20) == 0
    finally:
        replay.kill()
        replay.wait()
    with Disk(path=storage) as disk:
        assert disk.pending_tasks() == []
        [dead] = disk.list_dead_tasks()  # the second record of the same id collapses
        assert dead.id == task_id and dead.task_class == "app.Doomed"


def _deferq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deferq", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)


@pytest.mark.spec("Q-24", "Q-33", "D-13")
def test_cli_in_another_process_finds_and_retries_a_dead_task(storage: Path) -> None:
    child = spawn(storage, "deadletter")
    try:
        line = _line(child)
        assert child.wait(20) == 0
    finally:
        child.kill()
        child.wait()
    task_id = line.split()[1]
    listed = _deferq("dead", "list", "--json", "--path", str(storage))
    assert listed.returncode == 0, listed.stderr
    [record] = json.loads(listed.stdout)
    assert record["id"] == task_id and record["task_class"] == "app.Doomed"
    assert record["exception_class"] == "RuntimeError"
    assert record["exception_message"] == "card declined for order 42"
    assert record["context"]["json"]["args"] == [42] and record["attempts"] == 1
    shown = _deferq("dead", "show", task_id, "--path", str(storage))
    assert shown.returncode == 0 and "card declined" in shown.stdout
    retried = _deferq("dead", "retry", task_id, "--path", str(storage))
    assert retried.returncode == 0, retried.stderr
    assert f"retried {task_id} as " in retried.stdout
    new_id = retried.stdout.split(" as ")[1].split()[0]
    assert new_id != task_id
    pending = _deferq("pending", "list", "--json", "--path", str(storage))
    [row] = json.loads(pending.stdout)
    assert row["id"] == new_id and row["context"]["json"]["attempts"] == 0
    assert json.loads(_deferq("dead", "list", "--json", "--path", str(storage)).stdout) == []


async def _heartbeat_while_locked(storage: Path, hold_s: float) -> tuple[float, int, Disk]:
    disk = Disk(path=storage, fsync_frequency=0)
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, sys\n"
         "f = open(sys.argv[1], 'a')\n"
         "fcntl.flock(f, fcntl.LOCK_EX)\n"
         "print('locked', flush=True)\n"
         "sys.stdin.readline()\n",
         str(storage / dead_lock_name(disk.prefix))],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert await asyncio.to_thread(holder.stdout.readline) == "locked\n"
        queue = deferq.Queue(disk, registry=REG)
        await queue.start()
        gaps: list[float] = []
        stop = asyncio.Event()

        async def heartbeat() -> None:
            last = time.monotonic()
            while not stop.is_set():
                await asyncio.sleep(0.01)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        beat = asyncio.create_task(heartbeat())
        await asyncio.sleep(0.05)
        queue.enqueue(GivesUp)
        await asyncio.sleep(hold_s)
        holder.stdin.write("\n")
        holder.stdin.flush()
        await queue.wait_idle()
        stop.set()
        await beat
        await queue.stop()
        return max(gaps), len(gaps), disk
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.spec("Q-10", "D-13")
def test_loop_keeps_ticking_while_give_up_waits_for_the_dead_task_lock(storage: Path) -> None:
    largest, beats, disk = asyncio.run(_heartbeat_while_locked(storage, 0.4))
    try:
        assert beats >= 20
        assert largest < 0.1, f"the event loop stalled for {largest:.3f} s"
        [dead] = disk.list_dead_tasks()
        assert dead.task_class == "p.GivesUp"
        assert disk.pending_tasks() == []
    finally:
        disk.close()


@pytest.mark.spec("Q-8", "Q-10", "Q-142")
def test_lock_timeout_keeps_task_in_wal_and_loop_running(storage: Path) -> None:
    largest, _, disk = asyncio.run(_heartbeat_while_locked(storage, 2.0))
    try:
        assert largest < 0.1, f"the event loop stalled for {largest:.3f} s"
        assert disk.list_dead_tasks() == []
        [pending] = disk.pending_tasks()
        assert json.loads(pending.context)["task"] == "p.GivesUp"
    finally:
        disk.close()
