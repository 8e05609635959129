#!/usr/bin/env python3
"""The queue runtime's execution control (issue #18), each row against a baseline of the same run.

Usage::

    .venv/bin/python benchmarks/bench_runtime.py [--smoke] [--only ROW[,ROW]] [--reps N]
        [--json-out FILE]

Rows:

- ``delayed``: a ``Disk`` holding N delayed tasks (N = 100,000; its WAL's own memory is the
  baseline), then a ``Queue`` started on it, which replays every one into its timers. Printed:
  the memory the queue adds above the WAL (tracemalloc, Python allocations), per task, and the
  time ``stop()`` takes (in a second run without tracemalloc, which slows every free); next
  to them, the design the timer heap replaced, measured in the same run: one asyncio task
  per delayed task sleeping on the clock (its memory, and the time to cancel and reap them).
  Targets: <= 50 MB above the WAL and ``stop()`` <= 0.5 s (Q-36).
- ``concurrency``: N immediate async no-op tasks through ``aenqueue`` and ``wait_idle`` on a
  crash-safe ``Disk``, with the default ``max_concurrency`` against the same run with a limit
  above N (nothing ever waits for a slot): the overhead of the limit; target <= 5 %.
- ``sync_pool``: N plain (sync) no-op tasks run in the thread pool (the default) against the
  same tasks run inline on the loop (``inline=True``): what the pool costs per task.
- ``hooks``: the ``concurrency`` row's tasks with one idle hook (a ``Hooks`` that overrides
  nothing: no event is built, Q-106), one outcome hook (``on_succeeded`` only: one event per
  task), and 1 and 4 no-op hooks that override every event method (so every event is built and
  delivered: enqueued, started, succeeded). Each side is compared with its floor: the same
  tasks on a queue without hooks, whose ``perform`` itself delivers the events the side's hooks
  get (``AsyncDeliver``: the least plain code that builds the same events and calls the same
  hook methods, where a user without deferq's hooks would write it), timed in the same
  repetition; the idle hook, which gets no event, against the run without hooks. Target:
  <= 1.05x the floor (the queue's hook machinery costs at most 5 %), judged on the median of
  the repetitions' ratios; next to each median, a distribution-free 95 % interval for it
  (order statistics), so that a verdict within the noise of its target shows as one.
  Printed too: the ratio to the run without hooks, and the ratio to that run plus
  ``delivery_floor``, the same code timed in a loop of its own (the floor before session
  12: on hot caches it costs up to 2.8x less than in a task, docs/benchmarks.md).

The repetitions of each row alternate its sides (5 by default, 31 for the hooks row;
``--reps N`` sets every row's, and more move the median less from run to run); ratios are
medians of per-repetition ratios. Only ratios of one run mean anything. One JSON line per run
goes to ``--json-out`` (default ``benchmarks/runtime.jsonl``; do not commit it). See
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import gc
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc
import types
from collections.abc import Callable
from typing import ClassVar, Final

from deferq import Hooks, Queue, Task, TaskRegistry
from deferq import (TaskCancelled, TaskDeadLettered, TaskEnqueued, TaskInterrupted,
                    TaskReplayed, TaskRetryScheduled, TaskStarted, TaskSucceeded)
from deferq.backends import Disk
from deferq._runtime.clock import SystemClock
from deferq._runtime.hooks import NO_META, _calls
from deferq._runtime.serialize import Context

REGISTRY: Final = TaskRegistry()
MB: Final = 1024 * 1024
DELAYED_TARGET_BYTES: Final = 50 * MB
STOP_TARGET_S: Final = 0.5
CONCURRENCY_TARGET: Final = 1.05
HOOKS_TARGET: Final = 1.05
DEFAULT_JSON_OUT: Final = os.path.join(os.path.dirname(__file__), "runtime.jsonl")
_build: Final = tuple.__new__  # the events' C constructor, as the queue builds them
_now: Final = time.perf_counter  # the clock of an event's duration, as the queue reads it


class Later(Task, name="bench.later", registry=REGISTRY):
    """A delayed task of the ``delayed`` row (it never runs: the delay is a day)."""

    def perform(self, number: int) -> None:
        raise AssertionError("a delayed task of the benchmark ran")


class AsyncNoop(Task, name="bench.async_noop", registry=REGISTRY):
    done: ClassVar[int] = 0

    async def perform(self, number: int) -> None:
        AsyncNoop.done += 1


class AsyncDeliver(Task, name="bench.async_emit", registry=REGISTRY):
    """The hooks row's floor in a task: ``AsyncNoop``'s perform, then the least plain code
    that gives the side's hooks the events the queue would (``delivery_floor``'s loop body,
    on this execution's own fields), as a user without deferq's hooks would write it in
    the task. Its listeners (``DELIVERING``) are set per side, chosen as the queue chooses
    them; read from one module global, so that the harness costs next to nothing (the row
    prints what it costs with no listener)."""

    done: ClassVar[int] = 0

    async def perform(self, number: int) -> None:
        AsyncDeliver.done += 1
        enqueued, started, succeeded = DELIVERING
        if enqueued or started or succeeded:
            # Each field read once (the queue reads some twice), the clock as the queue reads it.
            tid, name, attempt, record = self.task_id, self.task_name, self.attempt, TASK_META
            meta = NO_META if record is None else types.MappingProxyType(record)
            if enqueued:
                queued = _build(TaskEnqueued, (tid, name, attempt, meta, None))
                for call in enqueued:
                    call(queued)
            if started:
                begin = _build(TaskStarted, (tid, name, attempt, meta))
                for listen in started:
                    listen(begin)
            if succeeded:
                begun = _now()
                duration = _now() - begun
                done = _build(TaskSucceeded, (tid, name, attempt, meta, duration))
                for notify in succeeded:
                    notify(done)


Listeners = tuple[tuple[Callable[[TaskEnqueued], None], ...],
                  tuple[Callable[[TaskStarted], None], ...],
                  tuple[Callable[[TaskSucceeded], None], ...]]
DELIVERING: Listeners = ((), (), ())  # AsyncDeliver's listeners: enqueued, started, succeeded
TASK_META: dict[str, str] | None = None  # the row's tasks carry no metadata


def deliver_to(hooks: list[Hooks]) -> None:
    """Give ``AsyncDeliver`` the listeners of ``hooks``, chosen as the queue chooses them."""
    global DELIVERING
    chosen = tuple(hooks)
    DELIVERING = (_calls(chosen, "on_enqueued"), _calls(chosen, "on_started"),
                  _calls(chosen, "on_succeeded"))


class PoolNoop(Task, name="bench.pool_noop", registry=REGISTRY):
    done: ClassVar[int] = 0

    def perform(self, number: int) -> None:
        PoolNoop.done += 1


class InlineNoop(Task, name="bench.inline_noop", registry=REGISTRY, inline=True):
    done: ClassVar[int] = 0

    def perform(self, number: int) -> None:
        InlineNoop.done += 1


class NoopHooks(Hooks):
    """A hook that listens to every event and does nothing with it."""

    def on_enqueued(self, event: TaskEnqueued) -> None:
        pass

    def on_replayed(self, event: TaskReplayed) -> None:
        pass

    def on_started(self, event: TaskStarted) -> None:
        pass

    def on_succeeded(self, event: TaskSucceeded) -> None:
        pass

    def on_retry_scheduled(self, event: TaskRetryScheduled) -> None:
        pass

    def on_dead_lettered(self, event: TaskDeadLettered) -> None:
        pass

    def on_cancelled(self, event: TaskCancelled) -> None:
        pass

    def on_interrupted(self, event: TaskInterrupted) -> None:
        pass


class OutcomeHooks(Hooks):
    """A hook that listens to one event per task here, its ending one (as an outcome counter
    would)."""

    def on_succeeded(self, event: TaskSucceeded) -> None:
        pass


@dataclasses.dataclass(frozen=True)
class Sizes:
    delayed: int
    concurrency: int
    sync_pool: int
    reps: int
    hooks_reps: int  # the hooks row's, whose per-repetition ratios spread by several %


# The hooks row's ratios sit a few % from its target and one repetition's spread by 5 % or
# more: its median needs about 30 repetitions to move by about 1 % between runs
# (docs/benchmarks.md, the hooks row, sessions 11 and 12).
FULL: Final = Sizes(delayed=100_000, concurrency=20_000, sync_pool=5_000, reps=5,
                    hooks_reps=31)
SMOKE: Final = Sizes(delayed=300, concurrency=200, sync_pool=100, reps=2, hooks_reps=2)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- delayed


def _traced() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else 0


async def _delayed_queue(path: str, n: int) -> dict[str, float]:
    """WAL memory, the queue's memory above it, and stop()'s time, for n delayed tasks."""
    before = _traced()
    disk = Disk(path=path)
    try:
        now = int(time.time())
        payload = b'{"v":1,"task":"bench.later","args":[%d],"kwargs":{},"attempts":0}'
        for number in range(n):
            disk.add_task(payload % number, now + 86_400, sync=False)
        disk.sync()
        wal = _traced() - before
        queue = Queue(disk, registry=REGISTRY)
        await queue.start()
        if queue.delayed != n:
            raise AssertionError(f"delayed: {queue.delayed} of {n} tasks hold a timer")
        extra = _traced() - before - wal
        start = time.perf_counter()
        await queue.stop()
        stop_s = time.perf_counter() - start
        if len(disk.pending_tasks()) != n:
            raise AssertionError("delayed: stop() lost tasks")
    finally:
        disk.close()
    return {"wal_bytes": wal, "extra_bytes": extra, "stop_s": stop_s}


async def _task_per_timer(n: int) -> dict[str, float]:
    """The replaced design: one asyncio task sleeping on the clock per delayed task."""
    clock = SystemClock()
    before = _traced()
    contexts: list[tuple[object, ...]] = [("bench.later", (number,), {}, 0)
                                          for number in range(n)]

    async def wait_then_run(context: tuple[object, ...]) -> None:
        await clock.sleep(86_400)
        raise AssertionError(f"a timer fired: {context}")

    loop = asyncio.get_running_loop()
    timers = {loop.create_task(wait_then_run(c)) for c in contexts}
    await asyncio.sleep(0)  # every task reaches its sleep
    extra = _traced() - before
    start = time.perf_counter()
    for timer in timers:
        timer.cancel()
    await asyncio.gather(*timers, return_exceptions=True)
    stop_s = time.perf_counter() - start
    return {"extra_bytes": extra, "stop_s": stop_s}


def row_delayed(sizes: Sizes, scratch: str) -> dict[str, object]:
    """Memory under tracemalloc; the stop times again without it (it slows every free)."""
    n = sizes.delayed
    path = os.path.join(scratch, "delayed")
    tracemalloc.start()
    try:
        queue = asyncio.run(_delayed_queue(path, n))
        old = asyncio.run(_task_per_timer(n))
    finally:
        tracemalloc.stop()
        shutil.rmtree(path, ignore_errors=True)
    try:
        queue["stop_s"] = asyncio.run(_delayed_queue(path, n))["stop_s"]
        old["stop_s"] = asyncio.run(_task_per_timer(n))["stop_s"]
    finally:
        shutil.rmtree(path, ignore_errors=True)
    meets = queue["extra_bytes"] <= DELAYED_TARGET_BYTES * n / FULL.delayed and (
        queue["stop_s"] <= STOP_TARGET_S)
    print(f"delayed tasks ({n:,}): WAL {queue['wal_bytes'] / MB:.1f} MB; queue timers "
          f"+{queue['extra_bytes'] / MB:.1f} MB ({queue['extra_bytes'] / n:.0f} B/task), "
          f"stop {queue['stop_s'] * 1000:.0f} ms | one asyncio task per timer: "
          f"+{old['extra_bytes'] / MB:.1f} MB, cancel {old['stop_s'] * 1000:.0f} ms | "
          f"memory {queue['extra_bytes'] / old['extra_bytes']:.2f}x, stop "
          f"{queue['stop_s'] / old['stop_s']:.2f}x of the old design | target <= 50 MB per "
          f"100k and stop <= 0.5 s: {'meets' if meets else 'misses'}", flush=True)
    return {"key": "delayed", "n": n, "queue": queue, "task_per_timer": old,
            "verdict": "meets" if meets else "misses"}


# ----------------------------------------------------------------------------- executions


async def _run_n(path: str, cls: type[Task], n: int, max_concurrency: int | None = None,
                 hooks: int = 0) -> float:
    disk = Disk(path=path)
    try:
        with_hooks = _hooks_of(hooks)
        queue = (Queue(disk, registry=REGISTRY, hooks=with_hooks) if max_concurrency is None
                 else Queue(disk, registry=REGISTRY, max_concurrency=max_concurrency))
        await queue.start()
        start = time.perf_counter()
        for number in range(n):
            await queue.aenqueue(cls, number)
        await queue.wait_idle()
        elapsed = time.perf_counter() - start
        await queue.stop()
        if disk.pending_tasks():
            raise AssertionError(f"{cls.task_name}: tasks left pending")
    finally:
        disk.close()
        shutil.rmtree(path, ignore_errors=True)
    return elapsed / n


def _alternate(sizes: Sizes, sides: dict[str, Callable[[], float]]) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for rep in range(sizes.reps):
        for name in names[rep % 2:] + names[:rep % 2]:
            times[name].append(sides[name]())
        log(f"  rep {rep + 1}: " + ", ".join(f"{k} {v[-1] * 1e6:.1f} us" for k, v in times.items()))
    return times


def _ratio(times: dict[str, list[float]], top: str, bottom: str) -> float:
    return statistics.median(a / b for a, b in zip(times[top], times[bottom], strict=True))


def median_interval(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """A distribution-free ``level`` confidence interval for the median of ``values``: the
    order statistics r and n + 1 - r, with r the largest rank whose binomial tail
    P(Binomial(n, 1/2) < r) is at most (1 - level) / 2; with too few values for any such
    rank (n < 6 at 95 %), the whole range."""
    ordered, n = sorted(values), len(values)
    tail, rank = (1 - level) / 2, 0
    while rank < n // 2 and sum(math.comb(n, k) for k in range(rank + 1)) / 2 ** n <= tail:
        rank += 1
    if rank == 0:
        return ordered[0], ordered[-1]
    return ordered[rank - 1], ordered[n - rank]


def row_concurrency(sizes: Sizes, scratch: str) -> dict[str, object]:
    n = sizes.concurrency
    path = os.path.join(scratch, "concurrency")

    def bounded() -> float:
        AsyncNoop.done = 0
        per_task = asyncio.run(_run_n(path, AsyncNoop, n))
        if AsyncNoop.done != n:
            raise AssertionError(f"concurrency: {AsyncNoop.done} of {n} ran")
        return per_task

    def unbounded() -> float:
        return asyncio.run(_run_n(path, AsyncNoop, n, max_concurrency=n + 1))

    times = _alternate(sizes, {"bounded": bounded, "unlimited": unbounded})
    ratio = _ratio(times, "bounded", "unlimited")
    verdict = "meets" if ratio <= CONCURRENCY_TARGET else "misses"
    print(f"async tasks ({n:,}), default max_concurrency vs a limit never reached: "
          f"{statistics.median(times['bounded']) * 1e6:.1f} vs "
          f"{statistics.median(times['unlimited']) * 1e6:.1f} us/task, ratio {ratio:.3f} | "
          f"target <= {CONCURRENCY_TARGET:.2f}: {verdict}", flush=True)
    return {"key": "concurrency", "n": n, "times": times, "ratio": ratio, "verdict": verdict}


def row_sync_pool(sizes: Sizes, scratch: str) -> dict[str, object]:
    n = sizes.sync_pool
    path = os.path.join(scratch, "sync_pool")

    def pool() -> float:
        PoolNoop.done = 0
        per_task = asyncio.run(_run_n(path, PoolNoop, n))
        if PoolNoop.done != n:
            raise AssertionError(f"sync_pool: {PoolNoop.done} of {n} ran")
        return per_task

    def inline() -> float:
        return asyncio.run(_run_n(path, InlineNoop, n))

    times = _alternate(sizes, {"pool": pool, "inline": inline})
    ratio = _ratio(times, "pool", "inline")
    print(f"plain tasks ({n:,}) in the thread pool vs inline on the loop: "
          f"{statistics.median(times['pool']) * 1e6:.1f} vs "
          f"{statistics.median(times['inline']) * 1e6:.1f} us/task, ratio {ratio:.2f} "
          f"(no target: the price of not blocking the loop)", flush=True)
    return {"key": "sync_pool", "n": n, "times": times, "ratio": ratio}


def _hooks_of(hooks: int) -> list[Hooks]:
    """The row's hook sides: N no-op hooks on every event; -1 one idle hook; -2 one outcome
    hook."""
    return ([NoopHooks() for _ in range(hooks)] if hooks >= 0
            else [Hooks()] if hooks == -1 else [OutcomeHooks()])


def delivery_floor(hooks: list[Hooks], n: int = 100_000, repeats: int = 5) -> float:
    """Seconds per task of the least plain code that gives ``hooks`` what the queue gives
    them for one immediate task that succeeds: each event some hook listens to built once
    from the task's record (its name, attempt and metadata read from a ``Context``; tuple's
    C constructor, as the queue builds it) and passed to each listener, and the clock read
    twice (the duration) when a hook listens to the ending event. Timed in a loop, minus the
    same loop doing nothing; the median of ``repeats``."""
    # The methods each hook overrides, chosen as the queue chooses them (HookSet).
    enqueued: tuple[Callable[[object], None], ...] = _calls(tuple(hooks), "on_enqueued")
    started: tuple[Callable[[object], None], ...] = _calls(tuple(hooks), "on_started")
    succeeded: tuple[Callable[[object], None], ...] = _calls(tuple(hooks), "on_succeeded")
    build = tuple.__new__
    now = time.perf_counter
    no_meta: types.MappingProxyType[str, str] = types.MappingProxyType({})
    context = Context(AsyncNoop.task_name, (0,), {})
    listened = bool(enqueued or started or succeeded)
    meta = no_meta

    def deliver() -> float:
        t0 = now()
        for number in range(n):
            tid = "1-1"
            if listened:
                meta = no_meta if context.meta is None else types.MappingProxyType(context.meta)
            if enqueued:
                event: object = build(TaskEnqueued, (tid, context.task, context.attempts + 1,
                                                     meta, None))
                for call in enqueued:
                    call(event)
            if started:
                event = build(TaskStarted, (tid, context.task, context.attempts + 1, meta))
                for call in started:
                    call(event)
            if succeeded:
                begun = now()
                duration = now() - begun
                event = build(TaskSucceeded, (tid, context.task, context.attempts + 1, meta,
                                              duration))
                for call in succeeded:
                    call(event)
        return now() - t0

    def nothing() -> float:
        t0 = now()
        for number in range(n):
            tid = "1-1"
        return now() - t0

    return statistics.median((deliver() - nothing()) / n for _ in range(repeats))


def row_hooks(sizes: Sizes, scratch: str) -> dict[str, object]:
    """Each hooks side against its floor in a task (``AsyncDeliver`` with the side's
    listeners, on a queue without hooks), measured in the same repetition; the idle hook,
    which gets no event, against the run without hooks. The run without hooks plus
    ``delivery_floor``'s loop is printed too (docs/benchmarks.md, the hooks row)."""
    n = sizes.concurrency
    path = os.path.join(scratch, "hooks")
    kinds = {"none": 0, "idle hook": -1, "outcome hook": -2, "1 hook": 1, "4 hooks": 4}
    hooked = list(kinds)[1:]
    delivering = hooked[1:]  # the sides some hook listens to

    def side(cls: type[AsyncNoop] | type[AsyncDeliver], hooks: int) -> Callable[[], float]:
        def once() -> float:
            cls.done = 0
            per_task = asyncio.run(_run_n(path, cls, n, hooks=hooks))
            if cls.done != n:
                raise AssertionError(f"hooks: {cls.done} of {n} ran")
            return per_task
        return once

    def in_task(hooks: int) -> Callable[[], float]:
        once = side(AsyncDeliver, 0)

        def listening() -> float:
            deliver_to(_hooks_of(hooks))
            return once()
        return listening

    def loop(hooks: int) -> Callable[[], float]:  # printed only: one timing a repetition
        return lambda: delivery_floor(_hooks_of(hooks), n=min(n * 5, 100_000), repeats=1)

    sides = {name: side(AsyncNoop, k) for name, k in kinds.items()}
    sides["task floor, no listener"] = in_task(-1)  # what the floor's harness costs
    sides.update({f"task floor {name}": in_task(kinds[name]) for name in delivering})
    sides.update({f"loop floor {name}": loop(kinds[name]) for name in delivering})
    times = _alternate(dataclasses.replace(sizes, reps=sizes.hooks_reps), sides)
    ratios = {name: _ratio(times, name, "none") for name in hooked}
    per_rep = {"idle hook": [i / none for i, none in zip(times["idle hook"], times["none"],
                                                           strict=True)]}
    per_rep.update({name: [h / f for h, f in zip(times[name], times[f"task floor {name}"],
                                                  strict=True)] for name in delivering})
    floor_ratios = {name: statistics.median(per_rep[name]) for name in hooked}
    intervals = {name: median_interval(per_rep[name]) for name in hooked}
    loop_ratios = {name: statistics.median(
        h / (none + f) for h, none, f in zip(times[name], times["none"],
                                             times[f"loop floor {name}"], strict=True))
        for name in delivering}
    harness = [e / none for e, none in zip(times["task floor, no listener"], times["none"],
                                           strict=True)]
    verdicts = {name: "meets" if r <= HOOKS_TARGET else "misses"
                for name, r in floor_ratios.items()}

    median = {side: statistics.median(values) for side, values in times.items()}

    def shown(name: str) -> str:
        floor = ("none" if name == "idle hook" else
                 f"+{(median['task floor ' + name] - median['none']) * 1e6:.2f} us in a task, "
                 f"+{median['loop floor ' + name] * 1e6:.2f} us in a loop "
                 f"({loop_ratios[name]:.3f}x none + loop)")
        return (f"{name} {statistics.median(times[name]) * 1e6:.1f} us/task, "
                f"{ratios[name]:.3f}x none, floor {floor}: {floor_ratios[name]:.3f}x its floor "
                f"(95 % interval {intervals[name][0]:.3f}-{intervals[name][1]:.3f}; "
                f"{verdicts[name]})")

    print(f"async tasks ({n:,}, {sizes.hooks_reps} repetitions), hooks vs none "
          f"({statistics.median(times['none']) * 1e6:.1f} us/task) and vs their floor (the "
          "same events delivered by the least plain code, in the task): "
          + "; ".join(shown(name) for name in hooked)
          + f"; the floor's task with no listener {statistics.median(harness):.3f}x none "
          f"(95 % interval {median_interval(harness)[0]:.3f}-{median_interval(harness)[1]:.3f})"
          + f" | target <= {HOOKS_TARGET:.2f}x the floor, on the median; 'N hook(s)' listen to "
          "every event", flush=True)
    return {"key": "hooks", "n": n, "reps": sizes.hooks_reps, "times": times, "ratios": ratios,
            "floor_ratios": floor_ratios, "floor_intervals": intervals,
            "loop_floor_ratios": loop_ratios, "harness_ratio": statistics.median(harness),
            "verdicts": verdicts}


ROWS: Final[dict[str, Callable[[Sizes, str], dict[str, object]]]] = {
    "delayed": row_delayed, "concurrency": row_concurrency, "sync_pool": row_sync_pool,
    "hooks": row_hooks,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="deferq runtime benchmarks (issue #18)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: only checks it runs")
    parser.add_argument("--only", default=",".join(ROWS), help=f"rows: {', '.join(ROWS)}")
    parser.add_argument("--reps", type=int, default=None,
                        help=f"repetitions of each row (default {FULL.reps}, the hooks row "
                        f"{FULL.hooks_reps}; --smoke {SMOKE.reps})")
    parser.add_argument("--dir", default=None, help="where the scratch directory goes")
    parser.add_argument("--json-out", default=DEFAULT_JSON_OUT)
    args = parser.parse_args(argv)
    names = [name for name in args.only.split(",") if name]
    unknown = [name for name in names if name not in ROWS]
    if unknown or not names:
        parser.error(f"unknown row(s) {unknown}; the rows are {', '.join(ROWS)}")
    sizes = SMOKE if args.smoke else FULL
    if args.reps is not None:
        if args.reps < 1:
            parser.error(f"--reps must be at least 1, got {args.reps}")
        sizes = dataclasses.replace(sizes, reps=args.reps, hooks_reps=args.reps)
    scratch = tempfile.mkdtemp(prefix="deferq-bench-", dir=args.dir)
    rows = []
    try:
        for name in names:
            log(f"== {name}")
            rows.append(ROWS[name](sizes, scratch))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    record = {"timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "kind": "runtime", "mode": "smoke" if args.smoke else "full", "reps": sizes.reps,
              "loadavg": os.getloadavg(), "rows": rows}
    with open(args.json_out, "a", encoding="utf-8") as out:
        out.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
