"""A queue on PostgreSQL keeps its event loop running while the server does not answer
(spec/queue.md Q-179 … Q-183).

Goal: every write the queue makes for an execution's outcome (a success's removal, the
removal of a run-soon batch's plain successes, a retry's re-add) and for ``aenqueue`` /
``adefer`` runs off the event loop on a shared database, so a silent server freezes no
application; once the server answers again everything completes and nothing is lost.
Method: a real server (``tests/postgres/cluster.py``); the server process serving the
backend's statement connection is SIGSTOPped (``stalled``), so every statement on it waits,
as for a server that stopped answering. A ticker coroutine measures the longest the loop
went without running it (``Ticker``); a frozen loop shows as a gap of seconds. A watchdog
thread SIGCONTs the server process after ``WATCHDOG_S`` whatever happens, and ``stalled``
does in its ``finally``, so the test cluster is never left stopped (and a loop frozen by an
inline write fails the gap check instead of hanging the test).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Final

import pytest

import deferq
from deferq import Hooks, TaskInterrupted, TaskRetryScheduled, TaskSucceeded
from deferq.backends import Postgres
from tests.postgres.conftest import PgSchema

REG = deferq.TaskRegistry()
RUNS: collections.Counter[str] = collections.Counter()
TASKS: Final = 12  # completions in flight at once (the problem's report)
WATCHDOG_S: Final = 4.0  # the longest a server process stays stopped
GAP_MAX_S: Final = 0.5  # the longest the loop may go without running the ticker
STALL_S: Final = 1.0  # how long each test watches the loop while the server is stopped


@dataclass
class Deps:
    """What the tasks get as ``self.deps``: a gate they wait at, and who reached it."""

    gate: asyncio.Event = field(default_factory=asyncio.Event)
    started: set[str] = field(default_factory=set)


def _deps(task: deferq.Task) -> Deps:
    deps = task.deps
    assert isinstance(deps, Deps)
    return deps


class Gated(deferq.Task, name="off.Gated", registry=REG):
    async def perform(self, key: str) -> None:
        deps = _deps(self)
        deps.started.add(key)
        await deps.gate.wait()
        RUNS[key] += 1


class FailsOnce(deferq.Task, name="off.FailsOnce", registry=REG):
    max_retries = 3

    async def perform(self, key: str) -> None:
        deps = _deps(self)
        deps.started.add(key)
        await deps.gate.wait()
        RUNS[key] += 1
        if self.attempt == 1:
            raise RuntimeError(f"{key} failed once")

    def retry_interval(self, exception: BaseException, attempt: int) -> object:
        return 0


class GivesUp(deferq.Task, name="off.GivesUp", registry=REG):
    max_retries = 0

    async def perform(self, key: str) -> None:
        deps = _deps(self)
        deps.started.add(key)
        await deps.gate.wait()
        RUNS[key] += 1
        raise RuntimeError(f"{key} gives up")


class Inline(deferq.Task, name="off.Inline", registry=REG, inline=True):
    def perform(self, key: str) -> None:
        RUNS[key] += 1


class Record(deferq.Task, name="off.Record", registry=REG):
    def perform(self, key: str) -> None:
        RUNS[key] += 1


class Recorder(Hooks):
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def on_succeeded(self, event: TaskSucceeded) -> None:
        self.events.append(("succeeded", event.task_id))

    def on_retry_scheduled(self, event: TaskRetryScheduled) -> None:
        self.events.append(("retry", event.task_id))

    def on_interrupted(self, event: TaskInterrupted) -> None:
        self.events.append(("interrupted", event.task_id))

    def ids(self, kind: str) -> list[str]:
        return [task_id for what, task_id in self.events if what == kind]


class Ticker:
    """A coroutine that wakes every 10 ms; ``worst`` is the longest gap between its runs."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._job: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            self.worst = max(self.worst, now - last)
            last = now

    def __enter__(self) -> Ticker:
        self._job = asyncio.get_running_loop().create_task(self._tick())
        return self

    def __exit__(self, *exc_info: object) -> None:
        assert self._job is not None
        self._job.cancel()


def _statement_pid(db: Postgres) -> int:
    """The server process serving the backend's statement connection."""
    conn = db._session.conn
    assert conn is not None and not conn.closed
    return int(conn.info.backend_pid)


@contextlib.contextmanager
def stalled(db: Postgres) -> Iterator[None]:
    """The server process of ``db``'s statements stopped: each statement waits until the
    block ends (or ``WATCHDOG_S`` passed)."""
    pid = _statement_pid(db)
    os.kill(pid, signal.SIGSTOP)
    watchdog = threading.Timer(WATCHDOG_S, os.kill, (pid, signal.SIGCONT))
    watchdog.daemon = True
    watchdog.start()
    try:
        yield
    finally:
        watchdog.cancel()
        os.kill(pid, signal.SIGCONT)


def backend(pg: PgSchema, **options: object) -> Postgres:
    settings: dict[str, object] = {"poll_seconds": 0.05, **options}
    return Postgres(dsn=pg.dsn, schema=pg.schema, create_schema=True,
                    **settings)  # type: ignore[arg-type]


def pending(pg: PgSchema) -> int:
    return int(str(pg.sql("SELECT count(*) FROM {s}.pending")[0][0]))


async def eventually(what: str, check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        await asyncio.sleep(0.02)


async def watch_loop(ticker: Ticker, seconds: float = STALL_S) -> None:
    """Let the loop run for ``seconds`` and check it never went ``GAP_MAX_S`` without the
    ticker (a write on the loop would hold it until the watchdog)."""
    await asyncio.sleep(seconds)
    assert ticker.worst < GAP_MAX_S, f"the event loop froze for {ticker.worst:.2f} s"


async def start_gated(db: Postgres, task: type[deferq.Task], prefix: str
                      ) -> tuple[deferq.Queue, Deps, Recorder, list[str]]:
    """A started queue with ``TASKS`` tasks of ``task`` running, each waiting at the gate."""
    deps, hooks = Deps(), Recorder()
    queue = deferq.Queue(db, registry=REG, deps=deps, hooks=[hooks])
    await queue.start()
    ids = [queue.enqueue(task, f"{prefix}{i}") for i in range(TASKS)]
    await eventually("every task running", lambda: len(deps.started) == TASKS)
    return queue, deps, hooks, ids


@pytest.fixture(autouse=True)
def _fresh_runs() -> None:
    RUNS.clear()


@pytest.mark.spec("Q-179", "Q-183")
def test_successes_are_removed_off_the_loop_while_the_server_is_silent(pg: PgSchema) -> None:
    async def scenario() -> None:
        with backend(pg) as db:
            queue, deps, hooks, ids = await start_gated(db, Gated, "g")
            with Ticker() as ticker, stalled(db):
                deps.gate.set()  # every perform returns: TASKS removals wait on the server
                await watch_loop(ticker)
                assert sum(RUNS.values()) == TASKS  # every perform ended...
                assert hooks.ids("succeeded") == []  # ...none is reported before its write
                assert [await queue.status(t) for t in ids] == [deferq.TaskStatus.RUNNING] * TASKS
                assert queue.running == TASKS and pending(pg) == TASKS
                # its outcome is being written: cancel leaves it alone, at once.
                assert await queue.cancel(ids[0]) is False
                assert ticker.worst < GAP_MAX_S
            await eventually("every removal written", lambda: pending(pg) == 0)
            await queue.wait_idle()
            assert sorted(hooks.ids("succeeded")) == sorted(ids)
            assert hooks.ids("interrupted") == [] and queue.running == 0
            assert [await queue.status(t) for t in ids] == [deferq.TaskStatus.UNKNOWN] * TASKS
            assert await queue.stop(5)
        assert RUNS == {f"g{i}": 1 for i in range(TASKS)}
    asyncio.run(scenario())


@pytest.mark.spec("Q-180")
def test_a_batch_of_plain_successes_is_removed_off_the_loop(pg: PgSchema) -> None:
    async def scenario() -> None:
        hooks = Recorder()
        with backend(pg) as db:
            queue = deferq.Queue(db, registry=REG, hooks=[hooks])
            await queue.start()
            # Due in a second: their inline performs run (one run-soon batch) while stalled.
            ids = [queue.enqueue(Inline, f"p{i}", delay=1) for i in range(TASKS)]
            with Ticker() as ticker, stalled(db):
                await eventually("every inline perform ran", lambda: sum(RUNS.values()) == TASKS,
                                 timeout=WATCHDOG_S - 1)
                await watch_loop(ticker, 0.3)
                # RUNNING and holding their slots until the write returned.
                assert [await queue.status(t) for t in ids] == [deferq.TaskStatus.RUNNING] * TASKS
                assert queue.running == TASKS and hooks.ids("succeeded") == []
                assert pending(pg) == TASKS
                idle = asyncio.ensure_future(queue.wait_idle())
                await asyncio.sleep(0.1)
                assert not idle.done()  # wait_idle waits for the write
                assert ticker.worst < GAP_MAX_S, f"the loop froze for {ticker.worst:.2f} s"
            await asyncio.wait_for(idle, 20)
            assert pending(pg) == 0 and queue.running == 0
            assert sorted(hooks.ids("succeeded")) == sorted(ids)
            assert await queue.stop(5)
        assert RUNS == {f"p{i}": 1 for i in range(TASKS)}
    asyncio.run(scenario())


@pytest.mark.spec("Q-179")
def test_a_retry_is_re_added_off_the_loop(pg: PgSchema) -> None:
    async def scenario() -> None:
        with backend(pg) as db:
            queue, deps, hooks, ids = await start_gated(db, FailsOnce, "r")
            with Ticker() as ticker, stalled(db):
                deps.gate.set()  # every first attempt fails: TASKS re-adds wait on the server
                await watch_loop(ticker)
                assert RUNS == {f"r{i}": 1 for i in range(TASKS)}
                assert hooks.ids("retry") == []  # scheduled only once written
            await eventually("every retry ran and was removed", lambda: sum(RUNS.values())
                             == 2 * TASKS and pending(pg) == 0)
            await queue.wait_idle()
            assert sorted(hooks.ids("retry")) == sorted(ids)
            assert sorted(hooks.ids("succeeded")) == sorted(ids)
            assert await queue.stop(5)
            assert db.list_dead_tasks() == []
        assert RUNS == {f"r{i}": 2 for i in range(TASKS)}
    asyncio.run(scenario())


@pytest.mark.spec("Q-179", "Q-141")
def test_a_give_up_on_a_silent_server_keeps_the_loop_running(pg: PgSchema) -> None:
    async def scenario() -> None:
        with backend(pg) as db:
            queue, deps, hooks, ids = await start_gated(db, GivesUp, "d")
            with Ticker() as ticker, stalled(db):
                deps.gate.set()  # every task gives up: its dead-task write, then its removal
                await watch_loop(ticker)
                assert queue.running == TASKS and pending(pg) == TASKS
            await eventually("every task dead-lettered", lambda: pending(pg) == 0)
            await queue.wait_idle()
            assert sorted(t.id for t in db.list_dead_tasks()) == sorted(ids)
            assert [await queue.status(t) for t in ids] == [deferq.TaskStatus.DEAD] * TASKS
            assert await queue.stop(5)
    asyncio.run(scenario())


@pytest.mark.spec("Q-181")
def test_aenqueue_before_start_writes_off_the_loop_too(pg: PgSchema) -> None:
    async def scenario() -> None:
        with backend(pg) as db:
            queue = deferq.Queue(db, registry=REG)
            with Ticker() as ticker, stalled(db):
                job = asyncio.ensure_future(queue.aenqueue(Record, "early"))
                await watch_loop(ticker, 0.5)
                assert not job.done()
            task_id = await asyncio.wait_for(job, 20)
            assert pending(pg) == 1
            await queue.start()  # not scheduled before start: claimed, then run
            await eventually("it ran", lambda: RUNS["early"] == 1 and pending(pg) == 0)
            assert await queue.stop(5)
            assert task_id not in {t.id for t in db.list_dead_tasks()}
    asyncio.run(scenario())


@pytest.mark.spec("Q-181", "Q-54")
def test_aenqueue_and_adefer_write_off_the_loop(pg: PgSchema) -> None:
    async def scenario() -> None:
        with backend(pg) as db:
            queue = deferq.Queue(db, registry=REG)
            await queue.start()
            with Ticker() as ticker, stalled(db):
                plain = [asyncio.ensure_future(queue.aenqueue(Record, f"a{i}"))
                         for i in range(TASKS)]
                keyed = [asyncio.ensure_future(queue.adefer(Record.options(key="one"), "k"))
                         for _ in range(3)]
                gone = asyncio.ensure_future(queue.aenqueue(Record, "cancelled-caller"))
                await watch_loop(ticker)
                assert not any(job.done() for job in [*plain, *keyed, gone])
                gone.cancel()
                await asyncio.sleep(0.05)
                assert ticker.worst < GAP_MAX_S
            ids = [await asyncio.wait_for(job, 20) for job in plain]
            owners = {await asyncio.wait_for(job, 20) for job in keyed}
            assert len(set(ids)) == TASKS and len(owners) == 1  # one task holds the key
            with pytest.raises(asyncio.CancelledError):
                await gone
            # the cancelled caller's task was written, so it is scheduled and runs.
            await eventually("every task ran", lambda: sum(RUNS.values()) == TASKS + 2
                             and pending(pg) == 0)
            await queue.wait_idle()
            assert await queue.stop(5)
        assert RUNS == {**{f"a{i}": 1 for i in range(TASKS)}, "k": 1, "cancelled-caller": 1}
    asyncio.run(scenario())


@pytest.mark.spec("Q-182", "P-25")
def test_a_failed_off_loop_removal_is_logged_and_the_task_runs_again(
        pg: PgSchema, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        deps, hooks = Deps(), Recorder()
        with backend(pg, lease_seconds=1) as db:
            queue = deferq.Queue(db, registry=REG, deps=deps, hooks=[hooks])
            await queue.start()
            gated = queue.enqueue(Gated, "g")
            inline = queue.enqueue(Inline, "p", delay=1)
            await eventually("the gated task running", lambda: deps.started == {"g"})
            pg.sql("ALTER TABLE {s}.pending RENAME TO pending_away")  # every write fails
            try:
                deps.gate.set()
                await eventually("both removals failed", lambda: sorted(hooks.ids(
                    "interrupted")) == sorted([gated, inline]), timeout=10)
            finally:
                pg.sql("ALTER TABLE {s}.pending_away RENAME TO pending")
            assert RUNS == {"g": 1, "p": 1} and hooks.ids("succeeded") == []
            assert pending(pg) == 2  # still stored: their leases run out, they run again
            await eventually("both ran again and were removed", lambda: RUNS == {"g": 2, "p": 2}
                             and pending(pg) == 0)
            await queue.wait_idle()
            assert sorted(hooks.ids("succeeded")) == sorted([gated, inline])
            assert await queue.stop(5)
        stays = [r.getMessage() for r in caplog.records
                 if "storage error" in r.getMessage()]
        assert any(line.startswith(f"deferred task {gated}: storage error")
                   and line.endswith("it stays pending in the database") for line in stays), stays
        assert any(line.startswith(f"deferred task {inline}: storage error")
                   and line.endswith("it stays pending in the database") for line in stays), stays
    with caplog.at_level(logging.ERROR, logger="deferq.queue"):
        asyncio.run(scenario())


@pytest.mark.spec("Q-186", "Q-40")
def test_cancel_removes_the_task_off_the_loop(pg: PgSchema) -> None:
    async def scenario() -> None:
        with backend(pg) as db:
            queue = deferq.Queue(db, registry=REG)
            await queue.start()
            task_id = queue.enqueue(Record, "never", delay=600)
            with Ticker() as ticker, stalled(db):
                cancel = asyncio.ensure_future(queue.cancel(task_id))
                await watch_loop(ticker, 0.5)
                assert not cancel.done()  # its removal waits on the server, not the loop
            assert await asyncio.wait_for(cancel, 20) is True
            assert pending(pg) == 0
            assert await queue.status(task_id) is deferq.TaskStatus.UNKNOWN
            assert await queue.stop(5)
        assert RUNS == {}
    asyncio.run(scenario())


@pytest.mark.spec("Q-186", "Q-9")
def test_start_reads_the_held_tasks_off_the_loop(pg: PgSchema) -> None:
    async def scenario() -> None:
        with backend(pg) as db:
            queue = deferq.Queue(db, registry=REG)
            with Ticker() as ticker, stalled(db):
                start = asyncio.ensure_future(queue.start())
                await watch_loop(ticker, 0.5)
                assert not start.done()  # its read waits on the server, not the loop
            await asyncio.wait_for(start, 20)
            task_id = await queue.aenqueue(Record, "after")
            await eventually("the task ran", lambda: RUNS["after"] == 1)
            await queue.wait_idle()
            assert await queue.status(task_id) is deferq.TaskStatus.UNKNOWN
            assert await queue.stop(5)
    asyncio.run(scenario())
