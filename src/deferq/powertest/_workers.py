"""Worker and operator processes: real OS processes that use ``Disk`` on the mounted image.

Theory of operation. The harness forks one process per role. Each child opens
its own ``Disk`` (adopting orphaned WALs, W-27..W-4) and then works until it is
killed, reporting over its own pipe to the harness, which holds the log in
memory outside the image (a pipe survives both SIGKILL and the power cut):

- ``I`` (issued) is written BEFORE the call, ``A`` (acknowledged) after it
  returned, ``F`` (failed) when it raised. A kill between the return and the
  ``A`` line only makes an acknowledged operation look in flight, which the
  check treats more leniently, never more strictly.
- Task bodies travel as ``sha256`` digests: the check compares digests.

A worker has the shape of a queue worker: add a task, "run" a pending one,
which succeeds (``remove_task``), fails and is retried (re-add, same id, same
worker, one more attempt) or gives up (``add_dead_task`` THEN ``remove_task``,
D-13); some workers fsync every write, others use a timer and call ``sync()``.
The operator lists dead tasks, retries some (re-enqueues the context as a new
task in its own WAL, then ``remove_dead_tasks``) and removes others.

Queue-level workers (``_queue_roles``) add their ``Body`` to ``BODIES`` and give a
real ``deferq.Queue`` a ``ReportingDisk`` (from ``open_reporting``) as its backend:
every backend call the queue makes is then reported exactly like the storage-level
ones. A queue role sets ``TAG`` around an enqueue (or an operator retry or removal)
so the add (or ``rdead``) event also names the task it carries; the queue calls
the dead-task store from worker threads, so ``Emit`` is thread-safe.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TypeVar

from deferq._core.errors import DeferqError, StorageBrokenError
from deferq._core.types import DeadTask, PendingTask
from deferq.backends import Disk

_T = TypeVar("_T")

Event = dict[str, object]

# What the next engine-id add (or dead-task removal) of this context carries: set by a
# queue role around ``enqueue`` / ``retry_dead_tasks`` / ``remove_dead_tasks``. A
# ContextVar, because ``asyncio.to_thread`` copies it into the thread doing the call.
TAG: ContextVar[dict[str, object] | None] = ContextVar("deferq_power_tag", default=None)


@dataclass(frozen=True, slots=True)
class Role:
    """One long-lived worker slot: restarted as a new incarnation after each kill."""

    name: str
    body: str  # a key of BODIES
    fsync_frequency: float


def digest(context: bytes) -> str:
    return hashlib.sha256(context).hexdigest()


class Emit:
    """Writes one JSON line per event to the harness pipe (unbuffered, survives SIGKILL)."""

    def __init__(self, fd: int, incarnation: str) -> None:
        self._fd = fd
        self.incarnation = incarnation
        self._seq = 0
        self._lock = threading.Lock()  # the queue writes from its loop and from threads

    def send(self, event: Event) -> None:
        data = (json.dumps(event, separators=(",", ":")) + "\n").encode()
        with self._lock:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]

    def issue(self, kind: str, **fields: object) -> int:
        with self._lock:
            self._seq += 1
            seq = self._seq
        self.send({"e": "I", "s": seq, "k": kind, "t": time.monotonic(), **fields})
        return seq

    def ack(self, seq: int, **fields: object) -> None:
        # The moment the call returned (CLOCK_MONOTONIC is system-wide): an acknowledgement
        # that returned after the power cut began proves nothing (see docs/power-test.md).
        self.send({"e": "A", "s": seq, "t": time.monotonic(), **fields})

    def fail(self, seq: int, exc: BaseException) -> None:
        self.send({"e": "F", "s": seq, "x": type(exc).__name__, "m": str(exc)[:200]})


class GiveUp(Exception):
    """The exception a task that gave up is dead-lettered with."""


def _context(rng: random.Random, who: str, seq: int, attempt: int) -> bytes:
    size = rng.choice((0, 16, 64, 200, 900)) if rng.random() < 0.95 else rng.randint(4096, 40000)
    pad = rng.randbytes(size // 2).hex().encode()
    return f"{who}|{seq}|a={attempt}|".encode() + pad


def _attempt_of(context: bytes) -> int:
    try:
        return int(context.split(b"|")[2][2:])
    except (IndexError, ValueError):
        return 0


class ReportingDisk:
    """A ``Disk`` that reports every write to the harness: the seam for queue-level workers.

    Give it to anything that drives a backend (a storage-level body below, or a real
    queue) and the harness sees each add, remove, dead-task write, dead-task removal and
    sync issued (before the call), acknowledged (after it returned, with the time) or
    failed (it raised; the exception propagates unchanged).
    """

    def __init__(self, disk: Disk, emit: Emit) -> None:
        self.disk = disk
        self.emit = emit
        self.durable = disk.fsync_frequency == 0

    def _call(self, seq: int, fn: Callable[[], _T]) -> _T:
        try:
            return fn()
        except BaseException as exc:
            self.emit.fail(seq, exc)
            raise

    def add_task(self, context: bytes, publish_at: int | None = None,
                 task_id: str | None = None) -> str:
        tag = TAG.get() if task_id is None else None
        extra: dict[str, object] = {} if tag is None else {"g": tag}
        seq = self.emit.issue("add", id=task_id, h=digest(context), p=publish_at, d=self.durable,
                              **extra)
        new_id = self._call(seq, lambda: self.disk.add_task(context, publish_at, task_id))
        self.emit.ack(seq, id=new_id)
        return new_id

    def remove_task(self, task_id: str) -> None:
        seq = self.emit.issue("rem", id=task_id, d=self.durable)
        self._call(seq, lambda: self.disk.remove_task(task_id))
        self.emit.ack(seq)

    def sync(self) -> None:
        seq = self.emit.issue("sync")
        self._call(seq, self.disk.sync)
        self.emit.ack(seq)

    def add_dead_task(self, task_id: str, context: bytes, exception: BaseException, *,
                      task_class: str, attempts: int,
                      enqueued_at: int | None = None) -> str:
        seq = self.emit.issue("dead", id=task_id, h=digest(context), c=task_class, n=attempts,
                              m=str(exception))
        result = self._call(seq, lambda: self.disk.add_dead_task(
            task_id, context, exception, task_class=task_class, attempts=attempts,
            enqueued_at=enqueued_at))
        self.emit.ack(seq)
        return result

    def remove_dead_tasks(self, ids: str | Iterable[str] | None) -> int:
        listed = [ids] if isinstance(ids, str) else list(ids or [])
        tag = TAG.get()
        seq = self.emit.issue("rdead", ids=listed, **({} if tag is None else {"g": tag}))
        removed = self._call(seq, lambda: self.disk.remove_dead_tasks(listed))
        self.emit.ack(seq, n=removed)
        return removed

    def pending_tasks(self) -> list[PendingTask]:
        return self.disk.pending_tasks()

    def list_dead_tasks(self, *, limit: int | None = None, offset: int = 0) -> list[DeadTask]:
        return self.disk.list_dead_tasks(limit=limit, offset=offset)

    def find_dead_task(self, task_id: str) -> DeadTask | None:
        return self.disk.find_dead_task(task_id)

    def tick(self) -> None:
        self.disk.tick()

    def close(self) -> None:
        self.disk.close()


class ReportingQueueDisk(Disk):
    """A real ``Disk`` (the queue recognizes it as one) that reports every write.

    The queue writes completions, retries and ``aenqueue`` adds with ``sync=False``
    and makes them durable with a group commit: ``written_ticket()`` on its loop,
    then ``sync_through(ticket)`` in a thread (Q-20, Q-22). A write acknowledged
    before ``written_ticket()`` returned has a ticket at most that one, so the
    ``sync`` event of ``sync_through`` names (``upto``) exactly the acknowledged,
    unsynced writes it covers; writes it may not cover stay unsynced in the model.
    ``sync()`` covers every write, as for ``ReportingDisk``.
    """

    def __init__(self, *, emit: Emit, **options: float | str) -> None:
        self.emit = emit
        self._lock = threading.Lock()
        self._unsynced: list[int] = []  # acknowledged writes not known durable, in ack order
        self._covered: dict[int, list[int]] = {}  # ticket -> unsynced writes it covers
        path, fsync_frequency = options["path"], options["fsync_frequency"]
        assert isinstance(path, str) and isinstance(fsync_frequency, float)
        super().__init__(path=path, fsync_frequency=fsync_frequency)
        self.durable = self.fsync_frequency == 0

    def _acked(self, seq: int, durable: bool, **fields: object) -> None:
        if not durable:
            with self._lock:
                self._unsynced.append(seq)
        self.emit.ack(seq, **fields)

    def _call(self, seq: int, fn: Callable[[], _T]) -> _T:
        try:
            return fn()
        except BaseException as exc:
            self.emit.fail(seq, exc)
            raise

    def add_task(self, context: bytes, publish_at: int | None = None,
                 task_id: str | None = None, *, sync: bool = True) -> str:
        tag = TAG.get() if task_id is None else None
        durable = self.durable and sync
        seq = self.emit.issue("add", id=task_id, h=digest(context), p=publish_at, d=durable,
                              **({} if tag is None else {"g": tag}))
        new_id = self._call(seq, lambda: super(ReportingQueueDisk, self).add_task(
            context, publish_at, task_id, sync=sync))
        self._acked(seq, durable, id=new_id)
        return new_id

    def remove_task(self, task_id: str, *, sync: bool = True) -> None:
        durable = self.durable and sync
        seq = self.emit.issue("rem", id=task_id, d=durable)
        self._call(seq, lambda: super(ReportingQueueDisk, self).remove_task(task_id, sync=sync))
        self._acked(seq, durable)

    def remove_tasks(self, task_ids: Iterable[str], *, sync: bool = True) -> int:
        """Reports one ``rem`` per id (W-79 writes them in one append), all in flight
        together until it returns."""
        ids = list(task_ids)
        durable = self.durable and sync
        seqs = [self.emit.issue("rem", id=task_id, d=durable) for task_id in ids]
        try:
            removed = super().remove_tasks(ids, sync=sync)
        except BaseException as exc:
            for seq in seqs:
                self.emit.fail(seq, exc)
            raise
        for seq in seqs:
            self._acked(seq, durable)
        return removed

    def written_ticket(self) -> int:
        with self._lock:
            covered = list(self._unsynced)  # taken before the ticket is read: all covered
        ticket = super().written_ticket()
        with self._lock:
            self._covered[ticket] = covered
        return ticket

    def sync_through(self, ticket: int) -> None:
        with self._lock:
            covered = self._covered.pop(ticket, [])
        seq = self.emit.issue("sync", upto=covered)
        self._call(seq, lambda: super(ReportingQueueDisk, self).sync_through(ticket))
        with self._lock:
            done = set(covered)
            self._unsynced = [s for s in self._unsynced if s not in done]
            # Every ticket up to this one is durable now: a later sync_through of one of
            # them covers nothing new (the queue reads a ticket per completion but waits
            # only for the latest, so without this the map would grow for the whole run).
            for stale in [t for t in self._covered if t <= ticket]:
                del self._covered[stale]
        self.emit.ack(seq)

    def sync(self) -> None:
        with self._lock:
            covered = list(self._unsynced)
            tickets = list(self._covered)  # read before the fsync: all covered by it
        seq = self.emit.issue("sync")
        self._call(seq, super().sync)
        with self._lock:
            done = set(covered)
            self._unsynced = [s for s in self._unsynced if s not in done]
            for stale in tickets:
                self._covered.pop(stale, None)
        self.emit.ack(seq)

    def add_dead_task(self, task_id: str, context: bytes, exception: BaseException, *,
                      task_class: str, attempts: int,
                      enqueued_at: int | None = None) -> str:
        seq = self.emit.issue("dead", id=task_id, h=digest(context), c=task_class, n=attempts,
                              m=str(exception))
        result = self._call(seq, lambda: super(ReportingQueueDisk, self).add_dead_task(
            task_id, context, exception, task_class=task_class, attempts=attempts,
            enqueued_at=enqueued_at))
        self.emit.ack(seq)
        return result

    def remove_dead_tasks(self, ids: str | Iterable[str] | None) -> int:
        listed = [ids] if isinstance(ids, str) else list(ids or [])
        tag = TAG.get()
        seq = self.emit.issue("rdead", ids=listed, **({} if tag is None else {"g": tag}))
        removed = self._call(seq, lambda: super(ReportingQueueDisk, self).remove_dead_tasks(
            listed))
        self.emit.ack(seq, n=removed)
        return removed


def open_queue_disk(role: Role, path: str, emit: Emit) -> ReportingQueueDisk:
    """Open a reporting ``Disk`` for a queue and report what it adopted (D-4)."""
    seq = emit.issue("open")
    disk = ReportingQueueDisk(emit=emit, path=path, fsync_frequency=float(role.fsync_frequency))
    tasks = [[t.task_id, digest(t.context), t.publish_at] for t in disk.pending_tasks()]
    emit.ack(seq, tasks=tasks)
    return disk


def open_reporting(role: Role, path: str, emit: Emit) -> ReportingDisk:
    """Open a ``Disk`` and report what it adopted (so the harness can check it, D-4)."""
    seq = emit.issue("open")
    disk = Disk(path=path, fsync_frequency=role.fsync_frequency)
    tasks = [[t.task_id, digest(t.context), t.publish_at] for t in disk.pending_tasks()]
    emit.ack(seq, tasks=tasks)
    return ReportingDisk(disk, emit)


def storage_worker(role: Role, path: str, emit: Emit, rng: random.Random) -> None:
    """A storage-level stand-in for a queue worker: add, run, retry, give up, sync."""
    disk = open_reporting(role, path, emit)
    mine: dict[str, bytes] = {t.task_id: t.context for t in disk.pending_tasks()}
    counter = 0
    while True:
        counter += 1
        roll = rng.random()
        if not mine or roll < 0.35:
            context = _context(rng, emit.incarnation, counter, 0)
            publish_at = None if rng.random() < 0.7 else rng.randint(1, 2_000_000_000)
            explicit = None if rng.random() < 0.8 else f"t-{emit.incarnation}-{counter}"
            mine[disk.add_task(context, publish_at, explicit)] = context
        elif not disk.durable and roll < 0.45:
            disk.sync()
        else:
            task_id = rng.choice(list(mine))
            context = mine[task_id]
            attempt = _attempt_of(context)
            outcome = rng.random()
            if outcome < 0.55:  # success
                disk.remove_task(task_id)
                del mine[task_id]
            elif outcome < 0.85 and attempt < 3:  # failure: retry with one more attempt
                mine[task_id] = _context(rng, emit.incarnation, counter, attempt + 1)
                disk.add_task(mine[task_id], None, task_id)
            else:  # give up: dead-task record first, WAL removal second (D-13)
                message = f"gave up after {attempt + 1} attempt(s)"
                try:
                    raise GiveUp(message)
                except GiveUp as exc:
                    disk.add_dead_task(task_id, context, exc, task_class="PowerTask",
                                       attempts=attempt + 1)
                disk.remove_task(task_id)
                del mine[task_id]


def storage_operator(role: Role, path: str, emit: Emit, rng: random.Random) -> None:
    """An operator: list dead tasks, retry some (re-enqueue, then remove the record), remove some.

    A retry re-enqueues under a new id: re-adding the old id could make it pending in two
    WALs at once (the task may still be in its worker's WAL, D-13), and removals in one WAL
    do not reach the other.
    """
    disk = open_reporting(role, path, emit)
    while True:
        dead = disk.list_dead_tasks(limit=rng.choice((5, 20, None)), offset=rng.choice((0, 0, 3)))
        if not dead:
            continue
        picks = rng.sample(dead, k=min(len(dead), rng.randint(1, 3)))
        if rng.random() < 0.5:
            for task in picks:  # retry: back into a WAL as a new task before it leaves the store
                disk.add_task(task.context)
        ids = [t.id for t in picks] + (["no-such-task"] if rng.random() < 0.2 else [])
        disk.remove_dead_tasks(ids)


Body = Callable[[Role, str, Emit, random.Random], None]
BODIES: dict[str, Body] = {"worker": storage_worker, "operator": storage_operator}


def child_main(role: Role, incarnation: str, path: str, seed: int, fd: int) -> None:
    """The forked child: run the role's body, report how it ended, never return."""
    code = 0
    emit = Emit(fd, incarnation)
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        BODIES[role.body](role, path, emit, random.Random(seed))
    except (DeferqError, OSError) as exc:
        # The op in flight failed: report it (the harness marks the op failed).
        code = 3 if not isinstance(exc, StorageBrokenError) else 4
        try:
            emit.send({"e": "X", "x": type(exc).__name__, "m": str(exc)[:300],
                       "tb": traceback.format_exc(limit=6)[-1500:]})
        except OSError:
            pass
    except BaseException as exc:  # noqa: BLE001 - a harness bug: report it, never hide it.
        code = 5
        try:
            emit.send({"e": "X", "x": type(exc).__name__, "m": str(exc)[:300], "bug": True,
                       "tb": traceback.format_exc(limit=8)[-3000:]})
        except OSError:
            pass
    finally:
        try:
            sys.stdout.flush()
        finally:
            os._exit(code)
