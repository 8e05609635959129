"""Smoke test of benchmarks/bench_runtime.py (the execution-control rows of issue #18).

Goal: the runtime benchmark cannot rot: with ``--smoke`` (tiny sizes) it runs every row
against the current API and appends one JSON line whose rows carry positive numbers.
Method: run it as a command into a temporary JSON file; the numbers are not judged.
Two tests load it as a module: its interval for a median is the textbook one, and the hooks
row's floor in a task delivers exactly what a hooked queue delivers.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import json
import math
import random
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "bench_runtime.py"


def positive(value: object) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.spec("Q-36", "Q-37", "Q-38", "Q-106")
def test_smoke_run_reports_every_row_with_positive_numbers(tmp_path: Path) -> None:
    out = tmp_path / "runtime.jsonl"
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--dir", str(tmp_path),
                           "--json-out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = out.read_text(encoding="utf-8").splitlines()
    record = json.loads(line)
    rows = {row["key"]: row for row in record["rows"]}
    assert set(rows) == {"delayed", "concurrency", "sync_pool", "hooks"}
    delayed = rows["delayed"]
    for side in ("queue", "task_per_timer"):
        assert positive(delayed[side]["extra_bytes"]) and positive(delayed[side]["stop_s"])
    assert positive(delayed["queue"]["wal_bytes"])
    for key in ("concurrency", "sync_pool"):
        assert positive(rows[key]["ratio"]), key
        assert all(positive(t) for side in rows[key]["times"].values() for t in side), key
    hooks = rows["hooks"]
    assert set(hooks["ratios"]) == {"idle hook", "outcome hook", "1 hook", "4 hooks"}
    assert all(positive(r) for r in hooks["ratios"].values())
    assert set(hooks["floor_intervals"]) == set(hooks["ratios"])
    for name, (low, high) in hooks["floor_intervals"].items():
        assert low <= hooks["floor_ratios"][name] <= high, name
    assert set(hooks["loop_floor_ratios"]) == {"outcome hook", "1 hook", "4 hooks"}
    assert all(positive(r) for r in hooks["loop_floor_ratios"].values())
    assert {f"task floor {name}" for name in hooks["loop_floor_ratios"]} <= set(hooks["times"])
    assert positive(hooks["harness_ratio"])
    assert all(positive(t) for side in hooks["times"].values() for t in side)
    assert "delayed tasks" in done.stdout and "thread pool" in done.stdout
    assert "hooks vs none" in done.stdout
    assert not list(tmp_path.glob("deferq-bench-*")), "the scratch directory was left behind"


@functools.cache
def bench_runtime() -> ModuleType:
    """The benchmark as a module, loaded once."""
    spec = importlib.util.spec_from_file_location("bench_runtime", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


def test_median_interval_is_the_order_statistics_of_the_binomial_tail() -> None:
    """The hooks row's 95 % interval for a median: ranks 10 and 22 of 31 values (the
    textbook pair: P(Binomial(31, 1/2) <= 9) = 0.0147), the whole range below 6 values,
    and about 95 % coverage of a known median."""
    interval = bench_runtime().median_interval
    assert interval([float(v) for v in range(31, 0, -1)]) == (10.0, 22.0)
    assert interval([3.0, 1.0, 2.0, 5.0, 4.0]) == (1.0, 5.0)
    assert interval([1.0]) == (1.0, 1.0)
    rng = random.Random(18)
    trials = 2000
    covered = sum(low <= 0.0 <= high for low, high in (
        interval([rng.gauss(0, 1) for _ in range(31)]) for _ in range(trials)))
    assert 0.93 <= covered / trials <= 0.99, covered / trials


def test_the_floor_in_a_task_delivers_what_a_hooked_queue_delivers(tmp_path: Path) -> None:
    """The hooks row's floor (``AsyncDeliver``) is a floor only if it does the queue's work:
    given the listeners of a hook that records, its ``perform`` hands that hook the same
    events, in the same order, with the same fields (its own id and name; the duration
    apart), as a queue with the hook hands it for one of the row's tasks."""
    from deferq import Hooks, Queue, Task, TaskEnqueued, TaskStarted, TaskSucceeded
    from deferq.backends import Disk

    bench = bench_runtime()

    class Recording(Hooks):
        def __init__(self) -> None:
            self.events: list[tuple[str, dict[str, object]]] = []

        def _keep(self, event: TaskEnqueued | TaskStarted | TaskSucceeded) -> None:
            fields: dict[str, object] = dict(event._asdict())
            fields.pop("duration_s", None)  # (a clock reading)
            self.events.append((type(event).__name__, fields))

        def on_enqueued(self, event: TaskEnqueued) -> None:
            self._keep(event)

        def on_started(self, event: TaskStarted) -> None:
            self._keep(event)

        def on_succeeded(self, event: TaskSucceeded) -> None:
            self._keep(event)

    async def one(cls: type[Task], hooks: list[Hooks], where: str) -> str:
        disk = Disk(path=str(tmp_path / where))
        try:
            queue = Queue(disk, registry=bench.REGISTRY, hooks=hooks)
            await queue.start()
            task_id: str = await queue.aenqueue(cls, 0)
            await queue.wait_idle()
            await queue.stop()
        finally:
            disk.close()
        return task_id

    def normal(events: list[tuple[str, dict[str, object]]], task_id: str,
               name: str) -> list[tuple[str, dict[str, object]]]:
        for _, fields in events:
            assert (fields.pop("task_id"), fields.pop("task_name")) == (task_id, name)
        return events

    queued = Recording()
    queue_id = asyncio.run(one(bench.AsyncNoop, [queued], "hooked"))
    delivered = Recording()
    bench.deliver_to([delivered])
    floor_id = asyncio.run(one(bench.AsyncDeliver, [], "floor"))
    assert [e[0] for e in queued.events] == ["TaskEnqueued", "TaskStarted", "TaskSucceeded"]
    assert bench.AsyncDeliver.done == 1
    assert (normal(delivered.events, floor_id, bench.AsyncDeliver.task_name)
            == normal(queued.events, queue_id, bench.AsyncNoop.task_name))
