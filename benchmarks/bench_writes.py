"""Write workloads of the storage benchmark: enqueue+complete and durable dead-task adds.

Each function returns deferq / raw / SQLite samples (seconds per task or per op) and the
rows are assembled by ``bench_storage.py``. Raw baselines build their lines inside the timed
loop: ``add {id} {payload}\\n`` and ``rem {id}\\n`` (no CRC, no base64: the minimum a log needs).
"""

from __future__ import annotations

import asyncio
import fcntl
import multiprocessing
import os
import random
import time
from collections.abc import Awaitable, Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event
from typing import ClassVar, TypeAlias

import bench_sqlite as sq
from bench_common import (
    ATTEMPTS,
    DEAD_CONTEXT_BYTES,
    FAKE_PID,
    SEED0,
    TASK_CLASS,
    Failure,
    Sample,
    Scratch,
    dead_json,
    dead_task,
    fsync_dir,
    make_exception,
)
from deferq import DeadTasksLockTimeout, Queue, Task, TaskRegistry
from deferq._core.deadcodec import encode_dead
from deferq._runtime.serialize import JSON_CODEC, Context
from deferq.backends import Disk

RAW_LOG = "raw.log"
BENCH_REGISTRY = TaskRegistry()


class Noop(Task, name="bench.noop", registry=BENCH_REGISTRY, inline=True):
    """The task of the queue-level rows: counts its executions and does nothing else.

    Inline (Q-38): a no-op has nothing to keep off the loop, and the rows measure the
    queue's own path against floors that run each task on the loop.
    """

    done: ClassVar[int] = 0

    def perform(self, number: int) -> None:
        Noop.done += 1


def task_payload() -> bytes:
    """The context the queue stores for ``Noop(12345)``: the payload of every enqueue row."""
    return JSON_CODEC.encode(Context(Noop.task_name, (12345,), {}, 0))


# ----------------------------------------------------------------------------- enqueue + complete


def disk_enqueue(scratch: Scratch, n: int, fsync_frequency: float) -> Sample:
    """deferq, storage level: ``Disk.remove_task(Disk.add_task(payload))`` per task."""
    payload = task_payload()

    def sample() -> float:
        path = scratch.new("enq-disk")
        disk = Disk(path=path, fsync_frequency=fsync_frequency)
        try:
            start = time.perf_counter()
            for _ in range(n):
                disk.remove_task(disk.add_task(payload))
            elapsed = time.perf_counter() - start
            left = len(disk.pending_tasks())
        finally:
            disk.close()
            scratch.remove(path)
        if left:
            raise RuntimeError(f"disk enqueue: {left} tasks still pending")
        return elapsed / n
    return sample


async def _run_queue(disk: Disk, n: int, producers: int) -> float:
    queue = Queue(disk, registry=BENCH_REGISTRY)
    await queue.start()
    Noop.done = 0

    async def produce(first: int) -> None:
        for number in range(first, n, producers):
            await queue.aenqueue(Noop, number)

    start = time.perf_counter()
    await asyncio.gather(*(produce(k) for k in range(producers)))
    await queue.wait_idle()
    elapsed = time.perf_counter() - start
    await queue.stop()
    if Noop.done != n:
        raise RuntimeError(f"queue enqueue: {Noop.done} of {n} tasks ran")
    return elapsed


def queue_enqueue(scratch: Scratch, n: int, fsync_frequency: float, producers: int) -> Sample:
    """deferq, queue level: ``producers`` coroutines ``await queue.aenqueue(Noop, i)``, then
    ``wait_idle()``: every task has run and been removed from the WAL."""

    def sample() -> float:
        path = scratch.new("enq-queue")
        disk = Disk(path=path, fsync_frequency=fsync_frequency)
        try:
            elapsed = asyncio.run(_run_queue(disk, n, producers))
            left = len(disk.pending_tasks())
        finally:
            disk.close()
            scratch.remove(path)
        if left:
            raise RuntimeError(f"queue enqueue: {left} tasks still pending")
        return elapsed / n
    return sample


def _timed_producers(n: int, producers: int, one: Callable[[int], Awaitable[None]]) -> float:
    async def produce(first: int) -> None:
        for number in range(first, n, producers):
            await one(number)

    async def main() -> float:
        start = time.perf_counter()
        await asyncio.gather(*(produce(k) for k in range(producers)))
        return time.perf_counter() - start

    return asyncio.run(main())


def raw_enqueue(scratch: Scratch, n: int, fsync: bool, producers: int) -> Sample:
    """Raw: an add line and a rem line per task on an O_APPEND fd, fsync after each when
    ``fsync``. With producers > 1, coroutines on one loop yield after every write."""
    payload = task_payload()
    seed, pid = str(int(time.time())), str(os.getpid())

    def sample() -> float:
        path = scratch.fresh_dir("enq-raw")
        fd = os.open(os.path.join(path, RAW_LOG), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        fsync_dir(path)
        try:
            if producers == 1:
                start = time.perf_counter()
                for number in range(n):
                    tid = f"{seed}-{pid}-{number}".encode()
                    os.write(fd, b"add " + tid + b" " + payload + b"\n")
                    if fsync:
                        os.fsync(fd)
                    os.write(fd, b"rem " + tid + b"\n")
                    if fsync:
                        os.fsync(fd)
                elapsed = time.perf_counter() - start
            else:
                async def one(number: int) -> None:
                    tid = f"{seed}-{pid}-{number}".encode()
                    os.write(fd, b"add " + tid + b" " + payload + b"\n")
                    if fsync:
                        os.fsync(fd)
                    await asyncio.sleep(0)
                    os.write(fd, b"rem " + tid + b"\n")
                    if fsync:
                        os.fsync(fd)
                    await asyncio.sleep(0)
                elapsed = _timed_producers(n, producers, one)
        finally:
            os.close(fd)
            scratch.remove(path)
        return elapsed / n
    return sample


def sqlite_enqueue(scratch: Scratch, n: int, synchronous: str, producers: int) -> Sample:
    """SQLite: INSERT then DELETE per task, each its own commit. With producers > 1, the
    coroutines share one connection and yield after every statement (sqlite3 is blocking,
    so the statements run one at a time on the loop)."""
    payload = task_payload()
    seed, pid = str(int(time.time())), str(os.getpid())

    def sample() -> float:
        path = scratch.fresh_dir("enq-sqlite")
        conn = sq.create(path, sq.TASKS_SCHEMA, synchronous)
        try:
            if producers == 1:
                start = time.perf_counter()
                for number in range(n):
                    tid = f"{seed}-{pid}-{number}"
                    sq.insert_task(conn, tid, payload)
                    sq.delete_task(conn, tid)
                elapsed = time.perf_counter() - start
            else:
                async def one(number: int) -> None:
                    tid = f"{seed}-{pid}-{number}"
                    sq.insert_task(conn, tid, payload)
                    await asyncio.sleep(0)
                    sq.delete_task(conn, tid)
                    await asyncio.sleep(0)
                elapsed = _timed_producers(n, producers, one)
            left = conn.execute("SELECT count(*) FROM tasks").fetchone()
        finally:
            conn.close()
            scratch.remove(path)
        if left is None or left[0] != 0:
            raise RuntimeError(f"sqlite enqueue: rows left {left!r}")
        return elapsed / n
    return sample


# ----------------------------------------------------------------------------- dead-task adds


class DeadWork:
    """The n dead tasks of one repetition: the exception, the context, the ids, the
    precomputed encoded lines (raw) and their JSON bodies (SQLite)."""

    def __init__(self, n: int) -> None:
        self.exc = make_exception()
        self.context = random.Random(1).randbytes(DEAD_CONTEXT_BYTES)
        self.ids = [f"{SEED0 + i}-{FAKE_PID}-{i}" for i in range(n)]
        failure = Failure.of(self.exc)
        self.lines = [encode_dead(dead_task(tid, failure, self.context)) for tid in self.ids]
        self.bodies = [dead_json(line).decode("utf-8") for line in self.lines]


def _dead_setup(side: str, path: str) -> tuple[Callable[[DeadWork, int], None], Callable[[], None]]:
    """(add the i-th dead task, close) for one side, opened on ``path``."""
    if side == "deferq":
        disk = Disk(path=path, fsync_frequency=0)  # the WAL stays empty; 0: no ticker thread

        def add_deferq(work: DeadWork, i: int) -> None:
            disk.add_dead_task(work.ids[i], work.context, work.exc, task_class=TASK_CLASS,
                               attempts=ATTEMPTS)
        return add_deferq, disk.close
    if side == "raw":
        lock_fd = os.open(os.path.join(path, "raw.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        fd = os.open(os.path.join(path, "raw.data"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

        def add_raw(work: DeadWork, i: int) -> None:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            try:
                os.write(fd, work.lines[i])
                os.fsync(fd)
            finally:
                fcntl.flock(lock_fd, fcntl.LOCK_UN)

        def close_raw() -> None:
            os.close(fd)
            os.close(lock_fd)
        return add_raw, close_raw
    if side == "sqlite":
        conn = sq.connect(path, "FULL")

        def add_sqlite(work: DeadWork, i: int) -> None:
            sq.insert_dead(conn, work.ids[i], work.bodies[i])
        return add_sqlite, conn.close
    raise ValueError(f"unknown side {side!r}")


def _prepare_dead_dir(scratch: Scratch, side: str) -> str:
    path = scratch.fresh_dir(f"dead-add-{side}")
    if side == "sqlite":
        sq.create(path, sq.DEAD_SCHEMA, "FULL").close()
    fsync_dir(path)
    return path


def dead_add(scratch: Scratch, side: str, work: DeadWork) -> Sample:
    """One process: every add durable before the next starts."""

    def sample() -> float:
        path = _prepare_dead_dir(scratch, side)
        add, close = _dead_setup(side, path)
        try:
            start = time.perf_counter()
            for i in range(len(work.ids)):
                add(work, i)
            elapsed = time.perf_counter() - start
        finally:
            close()
            scratch.remove(path)
        return elapsed / len(work.ids)
    return sample


Spans: TypeAlias = "Connection[tuple[float, float, int], tuple[float, float, int]]"
TIMEOUTS_PER_ADD_MAX = 50


def _dead_worker(side: str, path: str, n: int, part: int, parts: int, ready: Event, go: Event,
                 out: Spans) -> None:
    """A child process: add its share of the dead tasks; send (start, end, lock timeouts).

    deferq's store lock is non-blocking with bounded retries (L-1..L-3): under contention an
    add may raise ``DeadTasksLockTimeout`` before writing anything. The worker then retries
    that add, as an application would, and counts the timeouts (they are reported)."""
    work = DeadWork(n)
    add, close = _dead_setup(side, path)
    timeouts = 0
    try:
        ready.set()
        go.wait()
        start = time.perf_counter()
        for i in range(part, n, parts):
            for _ in range(TIMEOUTS_PER_ADD_MAX):
                try:
                    add(work, i)
                    break
                except DeadTasksLockTimeout:
                    timeouts += 1
            else:
                raise RuntimeError(f"dead add {i}: {TIMEOUTS_PER_ADD_MAX} lock timeouts in a row")
        out.send((start, time.perf_counter(), timeouts))
    finally:
        close()
        out.close()


def dead_add_procs(scratch: Scratch, side: str, n: int, parts: int,
                   info: dict[str, float]) -> Sample:
    """``parts`` processes add n dead tasks to one store concurrently; seconds per add is
    (last end - first start) / n (perf_counter is the system-wide monotonic clock). Lock
    timeouts are added up in ``info["dead_add_2p_lock_timeouts_{side}"]``."""
    ctx = multiprocessing.get_context("spawn")
    info_key = f"dead_add_{parts}p_lock_timeouts_{side}"
    info[info_key] = 0

    def sample() -> float:
        path = _prepare_dead_dir(scratch, side)
        go = ctx.Event()
        children: list[tuple[BaseProcess, Event, Spans]] = []
        spans: list[tuple[float, float]] = []
        try:
            for part in range(parts):
                ready = ctx.Event()
                receive, send = ctx.Pipe(duplex=False)
                child: BaseProcess = ctx.Process(
                    target=_dead_worker, args=(side, path, n, part, parts, ready, go, send))
                child.start()
                send.close()
                children.append((child, ready, receive))
            for proc, ready, _ in children:
                if not ready.wait(60):
                    raise RuntimeError(f"dead add worker {proc.pid} did not start")
            go.set()
            for proc, _, receive in children:
                start, end, timeouts = receive.recv()
                spans.append((float(start), float(end)))
                info[info_key] += int(timeouts)
                proc.join(60)
                if proc.exitcode != 0:
                    raise RuntimeError(f"dead add worker exited with {proc.exitcode}")
        finally:
            for proc, _, receive in children:
                receive.close()
                if proc.is_alive():
                    proc.kill()
                    proc.join()
        try:
            count = _count_dead(side, path)
        finally:
            scratch.remove(path)
        if count != n:
            raise RuntimeError(f"dead add ({side}, {parts} processes): {count} of {n} stored")
        return (max(e for _, e in spans) - min(s for s, _ in spans)) / n
    return sample


def _count_dead(side: str, path: str) -> int:
    if side == "deferq":
        with Disk(path=path, fsync_frequency=0) as disk:
            return len(disk.list_dead_tasks())
    if side == "raw":
        with open(os.path.join(path, "raw.data"), "rb") as f:
            return f.read().count(b"\n")
    conn = sq.connect(path, "NORMAL")
    try:
        row = conn.execute("SELECT count(*) FROM dead").fetchone()
        return -1 if row is None else int(row[0])
    finally:
        conn.close()
