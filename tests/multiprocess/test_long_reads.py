"""Operators' long reads beside real workers: no writer starves, memory does not follow the
store (issue #21 items 10 and 11; L-6, S-27, S-30, Q-90).

Goal: while an operator reads a large dead-task store for a long time, a worker in another
process adds dead tasks within its bounded lock retries (L-2), every add succeeding; and
``deferq stats``, a filtered ``deferq dead list --limit 1`` and a deep page, run as the
CLI in a fresh process, peak at about the same memory on a store four times larger.
Method: real processes on real files. The reader is a fresh interpreter that walks the
store through the CLI's view at a deliberately slow pace (it sleeps per task, so the read
lasts seconds whatever the machine's speed); the writer is another interpreter that times
each ``add_dead_task``. Memory is ``tracemalloc``'s peak inside a fresh interpreter that
runs the CLI's ``main``; the test compares the peaks of two store sizes (a ratio, not an
absolute figure).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from deferq._core.deadcodec import encode_dead
from deferq._core.types import DeadTask

PREFIX = "deferred-"
DATA = "deferred-dead_tasks-0"


def write_store(storage: Path, count: int, message_chars: int) -> int:
    storage.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(count):
        lines.append(encode_dead(DeadTask(
            id=f"t{i}", task_class="job.Rare" if i == 0 else "job.T", attempts=3,
            enqueued_at=1, failed_at=2, exception_class="ValueError",
            exception_message="x" * message_chars, backtrace=("f",), context=b"ctx")))
    data = b"".join(lines)
    (storage / DATA).write_bytes(data)
    (storage / f"{PREFIX}dead_tasks.lock").touch(mode=0o600)
    return len(data)


def run_python(code: str, timeout_s: float = 120.0) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout_s, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


READER = """
import sys, time
from deferq._cli.dead import DeadStoreView
view = DeadStoreView(sys.argv[1], "deferred-")
print("start", flush=True)
n = 0
for task in view.iter_dead_tasks():
    n += 1
    time.sleep(0.0004)  # an operator's slow consumer: the read lasts seconds
view.close()
print("done", n, flush=True)
"""

WRITER = """
import json, sys, time
from deferq.backends import Disk
from deferq._core.errors import DeadTasksLockTimeout
waits, failures = [], 0
with Disk(path=sys.argv[1], fsync_frequency=0) as disk:
    for i in range(int(sys.argv[2])):
        start = time.monotonic()
        try:
            disk.add_dead_task(f"w{i}", b"ctx", ValueError("boom"), task_class="W", attempts=1)
        except DeadTasksLockTimeout:
            failures += 1
        waits.append(time.monotonic() - start)
        time.sleep(0.05)
print(json.dumps({"waits": waits, "failures": failures}))
"""


@pytest.mark.spec("L-6", "S-27", "Q-90")
@pytest.mark.slow
def test_a_worker_adds_dead_tasks_while_an_operator_reads_a_large_store_slowly(
        tmp_path: Path) -> None:
    write_store(tmp_path, 8000, 3000)  # about 25 MB: 8,000 tasks read over several seconds
    reader = subprocess.Popen([sys.executable, "-c", READER, str(tmp_path)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert reader.stdout is not None
        assert reader.stdout.readline().strip() == "start"
        writer = subprocess.run([sys.executable, "-c", WRITER, str(tmp_path), "30"],
                                capture_output=True, text=True, timeout=120, check=False)
        assert writer.returncode == 0, writer.stderr
        still_reading = reader.poll() is None
        out, _ = reader.communicate(timeout=120)
    finally:
        if reader.poll() is None:
            reader.kill()
    result = json.loads(writer.stdout)
    assert still_reading, "the read ended before the writer did: make it slower"
    assert result["failures"] == 0
    assert max(result["waits"]) < 1.0  # the lock's retries last 1.45 s (L-2)
    # The reader saw its snapshot (S-28): the 8,000 tasks, none of the writer's.
    assert out.split()[-2:] == ["done", "8000"]


PEAK = """
import contextlib, io, sys, tracemalloc
from deferq._cli import main
args = sys.argv[1:]
tracemalloc.start()
with contextlib.redirect_stdout(io.StringIO()) as out:
    status = main(args)
peak = tracemalloc.get_traced_memory()[1]
assert status == 0, (status, out.getvalue()[-500:])
print(peak)
"""


def peak_of(args: list[str]) -> int:
    done = subprocess.run([sys.executable, "-c", PEAK, *args], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


@pytest.mark.spec("Q-90", "S-30", "D-31")
@pytest.mark.slow
def test_operator_reads_peak_at_about_the_same_memory_on_a_store_four_times_larger(
        tmp_path: Path) -> None:
    small, large = tmp_path / "small", tmp_path / "large"
    small_bytes = write_store(small, 2500, 3000)
    large_bytes = write_store(large, 10000, 3000)
    assert large_bytes > 3.9 * small_bytes
    commands = {
        "stats": ["stats"],
        "filtered list": ["dead", "list", "--task-class", "job.Rare", "--limit", "1"],
        "deep page": ["dead", "list", "--offset", "2400", "--limit", "50"],
    }
    report = {}
    for name, args in commands.items():
        if name == "deep page":  # the first one builds the index cache (D-18, S-72), once
            for store in (small, large):
                peak_of([*args, "--path", str(store)])
        peaks = [peak_of([*args, "--path", str(store)]) for store in (small, large)]
        report[name] = peaks
        # Records are 3 KB each; what remains is one step (1 MiB), its lines and the ids met.
        assert peaks[1] < 1.6 * peaks[0], report
        assert peaks[1] < large_bytes / 4, report
