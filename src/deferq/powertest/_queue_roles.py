"""Queue-level roles: real ``deferq.Queue`` processes over a reporting ``Disk`` on the image.

Theory of operation. Each role runs an asyncio loop with a real ``Queue`` whose
backend is a ``ReportingQueueDisk`` (a real ``Disk`` that reports, from
``_workers.open_queue_disk``; the queue uses its group commit, Q-20..Q-23), so every backend
call the queue makes (enqueue, retry re-add, success removal, dead-task write,
give-up removal, operator retry and removal, sync) reaches the harness as an
issue / acknowledgement / failure event, exactly like the storage-level roles,
and feeds the same ``StorageModel``. On top of that:

- ``queue_worker`` registers tasks that succeed (async, inline on the loop, whose
  successes are removed a batch at a time, and a sync ``@task`` function), fail a few times then succeed (``Flaky``), always fail and give up
  after their retries (``AlwaysFail``, and a ``@task`` with ``max_retries=0``);
  retries come back after 0 or 1 s so they happen within a cycle or two; some
  tasks are delayed (``delay=1``). It enqueues continuously with ``enqueue``
  and ``aenqueue``. Each enqueue carries a unique token as its first argument,
  and ``TAG`` names it in the add event, so the harness can follow a task from
  enqueue to its end. A worker with a timer fsync calls ``sync()`` and, at
  times, stops its queue and starts a new one on the same ``Disk`` (Q-15,
  Q-9: the new queue replays the WAL).
- Task bodies report each execution (``Q``/``run``: token, id, attempt, result)
  just before they return or raise.
- ``queue_operator`` is a queue too (it replays what it adopts and runs what
  it retries); it lists dead tasks with the queue's operator API, retries some
  (Q-33: new ids, durable before the dead records go) and removes others.
- ``queue_drain`` starts a queue, enqueues nothing, and reports ``drained``
  once the WAL is empty and nothing is left to run: the end-of-run check that
  work continues and every task ends (Q-9).
- The queue's storage-error log lines (an execution that hit a storage error,
  a dead-letter write that failed, a background group commit that failed) are
  reported as ``L`` events: outside a power cut they must not happen.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import Final

from deferq.powertest._workers import BODIES, TAG, Emit, ReportingQueueDisk, Role, open_queue_disk
from deferq._runtime.queue import Queue
from deferq._runtime.backpressure import Backpressure
from deferq._runtime.errors import PushTimeout
from deferq._runtime.task import Task, TaskRegistry, task

POWER_TASKS: Final = TaskRegistry()
FLAKY_MAX_RETRIES: Final = 4
ALWAYS_FAIL_MAX_RETRIES: Final = 2
RETRY_LATER_RATE: Final = 0.2  # retries that wait 1 s instead of 0
DELAYED_RATE: Final = 0.1  # enqueues with delay=1
DRAIN_POLL_S: Final = 0.05

_emit: Emit | None = None  # this process's pipe to the harness (set by each role)


class PowerTaskFailed(Exception):
    """What the failing power-test tasks raise."""


def _report(token: str, task_id: str | None, attempt: int | None, task_class: str,
            result: str) -> None:
    if _emit is not None:
        _emit.send({"e": "Q", "k": "run", "tok": token, "id": task_id, "n": attempt,
                    "c": task_class, "r": result})


def _retry_in(rng: random.Random) -> int:
    return 1 if rng.random() < RETRY_LATER_RATE else 0


class Succeed(Task, name="power.Succeed", registry=POWER_TASKS):
    """An async task that succeeds at once."""

    max_retries = 3

    async def perform(self, token: str, pad: str) -> None:
        await asyncio.sleep(0)
        _report(token, self.task_id, self.attempt, self.task_name, "ok")


class Flaky(Task, name="power.Flaky", registry=POWER_TASKS):
    """A sync task that fails ``fails`` times (fewer than its retries), then succeeds."""

    max_retries = FLAKY_MAX_RETRIES

    def perform(self, token: str, pad: str, fails: int) -> None:
        if self.attempt <= fails:
            _report(token, self.task_id, self.attempt, self.task_name, "fail")
            raise PowerTaskFailed(f"flaky {token} attempt {self.attempt}")
        _report(token, self.task_id, self.attempt, self.task_name, "ok")

    def retry_interval(self, exception: BaseException, attempt: int) -> object:
        return _retry_in(self.rng)


class AlwaysFail(Task, name="power.AlwaysFail", registry=POWER_TASKS):
    """An async task that always fails: dead after ``max_retries`` + 1 attempts."""

    max_retries = ALWAYS_FAIL_MAX_RETRIES

    async def perform(self, token: str, pad: str) -> None:
        await asyncio.sleep(0)
        _report(token, self.task_id, self.attempt, self.task_name, "fail")
        raise PowerTaskFailed(f"always fails {token} attempt {self.attempt}")

    def retry_interval(self, exception: BaseException, attempt: int) -> object:
        return _retry_in(self.rng)


class InlineOk(Task, name="power.InlineOk", registry=POWER_TASKS, inline=True):
    """A sync task run on the loop that succeeds: the successes of one run-soon batch are
    removed together (Q-170, W-79), so a cut or a kill can land inside that one append."""

    max_retries = 2

    def perform(self, token: str, pad: str) -> None:
        _report(token, self.task_id, self.attempt, self.task_name, "ok")


@task(name="power.fn_ok", registry=POWER_TASKS, max_retries=2)
def fn_ok(token: str, pad: str) -> None:
    """A sync ``@task`` function that succeeds."""
    _report(token, None, None, "power.fn_ok", "ok")


@task(name="power.fn_fail", registry=POWER_TASKS, max_retries=0)
async def fn_fail(token: str, pad: str) -> None:
    """An async ``@task`` function with no retries: dead after its first attempt."""
    _report(token, None, None, "power.fn_fail", "fail")
    raise PowerTaskFailed(f"fn_fail {token}")


# (task, weight, extra args): what a worker enqueues.
KINDS: Final[tuple[tuple[object, int], ...]] = (
    (Succeed, 25), (InlineOk, 15), (Flaky, 25), (AlwaysFail, 15), (fn_ok, 10), (fn_fail, 10))

# The number of attempts a task of each class that gives up must record:
# None for classes that must never give up.
GIVE_UP_ATTEMPTS: Final[dict[str, int | None]] = {
    Succeed.task_name: None, InlineOk.task_name: None, Flaky.task_name: None,
    fn_ok.task_class.task_name: None,
    AlwaysFail.task_name: ALWAYS_FAIL_MAX_RETRIES + 1, fn_fail.task_class.task_name: 1}


class _StorageLog(logging.Handler):
    """Reports the queue's storage-error log lines (they carry the exception) as events."""

    def __init__(self, emit: Emit) -> None:
        super().__init__(logging.ERROR)
        self._emit = emit

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "storage error" in message or "group commit" in message:
            exc = record.exc_info[1] if record.exc_info else None
            name = type(exc).__name__ if exc is not None else "unknown"
        elif "could not be dead-lettered" in message:
            name = str(record.args[1]) if isinstance(record.args, tuple) else "unknown"
        else:
            return  # a task failed (expected), a retry waited on backpressure, ...
        try:
            self._emit.send({"e": "L", "x": name, "m": message[:300]})
        except OSError:
            pass


def _quiet_queue_log(emit: Emit) -> None:
    queue_log = logging.getLogger("deferq.queue")
    queue_log.handlers[:] = [_StorageLog(emit)]
    queue_log.propagate = False
    queue_log.setLevel(logging.ERROR)


async def _start_queue(disk: ReportingQueueDisk, emit: Emit, rng: random.Random,
                       backpressure: Backpressure | None) -> Queue:
    queue = Queue(disk, registry=POWER_TASKS, rng=rng, backpressure=backpressure)
    await queue.start()  # replays every pending task it adopted
    emit.send({"e": "Q", "k": "start", "n": queue.backlog_size + queue.delayed})
    return queue


def _setup(emit: Emit) -> None:
    global _emit
    _emit = emit
    _quiet_queue_log(emit)


def _pad(rng: random.Random) -> str:
    size = rng.choice((0, 16, 64, 200, 900)) if rng.random() < 0.95 else rng.randint(4096, 40000)
    return rng.randbytes(size // 2).hex()


async def _worker(role: Role, path: str, emit: Emit, rng: random.Random) -> None:
    disk = open_queue_disk(role, path, emit)
    backpressure = Backpressure(high_water_mark=25, timeout=0.2) if rng.random() < 0.5 else None
    queue = await _start_queue(disk, emit, rng, backpressure)
    refs = [k for k, _ in KINDS]
    weights = [w for _, w in KINDS]
    counter = 0
    while True:
        counter += 1
        token = f"{emit.incarnation}/{counter}"
        ref = rng.choices(refs, weights)[0]
        args: list[object] = [token, _pad(rng)]
        if ref is Flaky:
            args.append(rng.randint(1, FLAKY_MAX_RETRIES - 1))
        delay = 1 if rng.random() < DELAYED_RATE else None
        name = ref.task_name if isinstance(ref, type) and issubclass(ref, Task) else (
            getattr(ref, "task_class").task_name)
        reset = TAG.set({"tok": token, "c": name})
        try:
            if rng.random() < 0.5:
                queue.enqueue(ref, *args, delay=delay)
            else:
                await queue.aenqueue(ref, *args, delay=delay)
        except PushTimeout:
            pass  # backpressure: nothing was stored
        finally:
            TAG.reset(reset)
        if not disk.durable:
            roll = rng.random()
            if roll < 0.08:
                disk.sync()
            elif roll < 0.1:
                await queue.stop(timeout=rng.choice((0.0, 0.05)))  # syncs
                queue = await _start_queue(disk, emit, rng, backpressure)
        await asyncio.sleep(0 if rng.random() < 0.7 else 0.002)


async def _operator(role: Role, path: str, emit: Emit, rng: random.Random) -> None:
    disk = open_queue_disk(role, path, emit)
    queue = await _start_queue(disk, emit, rng, None)
    while True:
        dead = await queue.dead_tasks(limit=rng.choice((5, 20, None)),
                                      offset=rng.choice((0, 0, 3)))
        if not dead:
            await asyncio.sleep(0.002)
            continue
        picks = rng.sample(dead, k=min(len(dead), rng.randint(1, 3)))
        ids = [t.id for t in picks] + (["no-such-task"] if rng.random() < 0.2 else [])
        if rng.random() < 0.5:
            # a new id in this WAL, synced, then the record removed. One task per call,
            # so the harness knows which dead task each new id continues.
            ids = ids[:1] + ids[len(picks):]
            reset = TAG.set({"retry": ids})
            try:
                await queue.retry_dead_tasks(ids)
            finally:
                TAG.reset(reset)
        else:
            reset = TAG.set({"remove": ids})
            try:
                await queue.remove_dead_tasks(ids)
            finally:
                TAG.reset(reset)
        await asyncio.sleep(0)


async def _drain(role: Role, path: str, emit: Emit, rng: random.Random) -> None:
    disk = open_queue_disk(role, path, emit)
    queue = await _start_queue(disk, emit, rng, None)
    while disk.pending_tasks() or queue.running or queue.backlog_size or queue.delayed:
        await asyncio.sleep(DRAIN_POLL_S)
    disk.sync()
    emit.send({"e": "Q", "k": "drained", "t": time.monotonic()})
    while True:
        await asyncio.sleep(3600)


def queue_worker(role: Role, path: str, emit: Emit, rng: random.Random) -> None:
    """Enqueue continuously into a real Queue over a reporting Disk, and run what it holds."""
    _setup(emit)
    asyncio.run(_worker(role, path, emit, rng))


def queue_operator(role: Role, path: str, emit: Emit, rng: random.Random) -> None:
    """List, retry and remove dead tasks with the queue's operator API (Q-33, Q-13)."""
    _setup(emit)
    asyncio.run(_operator(role, path, emit, rng))


def queue_drain(role: Role, path: str, emit: Emit, rng: random.Random) -> None:
    """Run every task the WAL holds to its end, then report ``drained`` and wait."""
    _setup(emit)
    asyncio.run(_drain(role, path, emit, rng))


QUEUE_BODIES: Final = ("queue", "qop", "drain")
BODIES.update({"queue": queue_worker, "qop": queue_operator, "drain": queue_drain})
