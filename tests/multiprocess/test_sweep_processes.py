"""The adoption sweep across real processes (spec/queue.md Q-70, spec/wal.md W-30..W-34,
spec/durability.md D-21, D-22).

Goal: a service that is running picks up, within its sweep interval, the tasks of
``deferq dead retry`` run from another process and the WAL of a sibling that was
SIGKILLed; two services sweeping one directory never both run a task. Method: real
services (``tests.queue.worker_app serve``: a ``Queue`` on a real ``Disk`` with a 0.2 s
sweep, printing ``ran ID ATTEMPT LABEL`` for every task it runs), the real CLI in a
subprocess, a real SIGKILL. The parent reads the services' lines on threads and waits
for each with a deadline; elapsed times are measured from the moment the CLI returned
or the sibling died.
"""

from __future__ import annotations

import queue as queues
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from deferq._core.names import is_wal_file_name
from deferq._engine.osenv import OS_ENV
from deferq._engine.walorphan import HandoffWal
from deferq._runtime.serialize import Context, encode_context
from deferq.backends import Disk
from tests.queue.worker_app import ROOT, spawn

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

PREFIX = "deferred-"
SWEEP_S = 0.2  # the services' sweep interval (worker_app serve)
# The bound of Q-70 is one interval plus one sweep; on a loaded 2-core machine a process
# can wait seconds for the CPU, so the test allows this much on top.
SLACK_S = 8.0


class Lines:
    """A child's stdout lines, read on a thread, each awaited with a deadline."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self._lines: queues.Queue[str] = queues.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.strip())

    def next(self, timeout_s: float = 30.0) -> str:
        try:
            return self._lines.get(timeout=timeout_s)
        except queues.Empty:
            self.proc.kill()
            assert self.proc.stderr is not None
            raise AssertionError(f"no line within {timeout_s} s; stderr: "
                                 f"{self.proc.stderr.read()}") from None

    def drain(self) -> list[str]:
        out = []
        while True:
            try:
                out.append(self._lines.get_nowait())
            except queues.Empty:
                return out


def serve(storage: Path) -> Lines:
    lines = Lines(spawn(storage, "serve"))
    assert lines.next() == "ready"
    return lines


def stop(*services: Lines) -> None:
    for service in services:
        service.proc.kill()
        service.proc.wait(10)


def chore(label: str, attempts: int = 0) -> bytes:
    return encode_context(Context("app.Chore", (label,), {}, attempts))


def wal_files(storage: Path) -> list[Path]:
    return sorted(p for p in storage.iterdir() if is_wal_file_name(PREFIX, p.name))


@pytest.mark.spec("Q-70", "W-34", "D-21")
def test_a_cli_retry_runs_in_a_live_service_within_the_sweep_interval(storage: Path) -> None:
    with Disk(path=storage) as disk:  # a dead task, as a service that gave up left it
        dead_id = disk.add_dead_task("1700000000-1-1", chore("retried", 4),
                                     RuntimeError("card declined"), task_class="app.Chore",
                                     attempts=4)
    service = serve(storage)
    try:
        retried = subprocess.run([sys.executable, "-m", "deferq", "dead", "retry", dead_id,
                                  "--path", str(storage)], cwd=ROOT, capture_output=True,
                                 text=True, timeout=60, check=False)
        returned = time.monotonic()
        assert retried.returncode == 0, retried.stderr
        new_id = retried.stdout.split(" as ")[1].split()[0]
        line = service.next()
        elapsed = time.monotonic() - returned
        assert line == f"ran {new_id} 1 retried"  # attempts reset to 0 by the retry
        assert elapsed < SWEEP_S + SLACK_S, elapsed
        print(f"CLI retry ran in the live service {elapsed * 1000:.0f} ms after the CLI returned")
        files = wal_files(storage)
        assert len(files) == 1, files  # the hand-off file was adopted and unlinked (W-32)
    finally:
        stop(service)
    with Disk(path=storage) as disk:  # the retry removed the dead record; the task
        # itself may still be pending: the kill can land before its removal (at-least-once)
        assert disk.list_dead_tasks() == []
        assert [t.task_id for t in disk.pending_tasks()] in ([], [new_id])


@pytest.mark.spec("Q-70", "W-30", "D-21")
def test_a_killed_siblings_wal_is_adopted_and_run_by_a_live_service(storage: Path) -> None:
    service = serve(storage)
    sibling = Lines(spawn(storage, "hang"))
    try:
        started = sibling.next()
        assert started.startswith("started ")
        task_id = started.split()[1]
        sibling.proc.send_signal(signal.SIGKILL)
        assert sibling.proc.wait(10) == -signal.SIGKILL
        died = time.monotonic()
        assert service.next() == f"ran {task_id} 1 chore"
        elapsed = time.monotonic() - died
        assert elapsed < SWEEP_S + SLACK_S, elapsed
        print(f"killed sibling's task ran in the live service {elapsed * 1000:.0f} ms after")
        assert len(wal_files(storage)) == 1
    finally:
        sibling.proc.kill()
        sibling.proc.wait(10)
        stop(service)


@pytest.mark.spec("D-22", "W-31", "Q-70")
def test_two_live_services_sweeping_one_directory_never_both_run_a_task(storage: Path) -> None:
    with Disk(path=storage):
        pass
    first, second = serve(storage), serve(storage)
    expected: set[str] = set()
    ran: dict[str, list[str]] = {"first": [], "second": []}

    def collect() -> None:
        for name, service in (("first", first), ("second", second)):
            ran[name] += [line.split()[1] for line in service.drain() if line.startswith("ran ")]

    try:
        # Hand-off files while both sweep, as repeated CLI retries, until each service has
        # adopted some (else the flock never had to decide between them).
        batch = 0
        while batch < 12 or (not (ran["first"] and ran["second"]) and batch < 80):
            with HandoffWal(OS_ENV, str(storage), PREFIX) as handoff:
                for n in range(5):
                    expected.add(handoff.add_task(chore(f"b{batch}-{n}")))
                handoff.sync()
            batch += 1
            time.sleep(0.03)  # spread the files over several sweeps of both services
            collect()
        deadline = time.monotonic() + 60
        while len(ran["first"]) + len(ran["second"]) < len(expected):
            assert time.monotonic() < deadline, "not every handed-off task ran"
            time.sleep(0.05)
            collect()
        time.sleep(3 * SWEEP_S)  # a task run twice would show up by now
        collect()
    finally:
        stop(first, second)
    print(f"{batch} hand-off files: {len(ran['first'])} tasks ran in one service, "
          f"{len(ran['second'])} in the other")
    assert ran["first"] and ran["second"], "both services must have adopted some files"
    assert sorted(ran["first"] + ran["second"]) == sorted(expected), \
        "each task runs exactly once, in one service"
