"""Queues running on the Postgres backend: end to end, two queues sharing one database, a dead
worker's tasks taken over, claims given back at stop, faults of the claimer.

Goal: spec/queue.md Q-76, Q-77, Q-227, Q-228 hold with real queues on a real server. Method: plain ``Queue``s with ``poll_seconds`` small so that waits are short; every
wait is bounded (``eventually``) and fails with what it was waiting for.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable

import pytest

import deferq
from deferq._runtime.serialize import JSON_CODEC, Context
from deferq.backends import Postgres
from tests.postgres.conftest import PgSchema

REG = deferq.TaskRegistry()
RUNS: collections.Counter[str] = collections.Counter()


class Record(deferq.Task, name="pg.Record", registry=REG):
    def perform(self, key: str) -> None:
        RUNS[key] += 1


class SlowRecord(deferq.Task, name="pg.SlowRecord", registry=REG):
    async def perform(self, key: str) -> None:
        await asyncio.sleep(0.01)
        RUNS[key] += 1


class Fails(deferq.Task, name="pg.Fails", registry=REG):
    max_retries = 1

    def perform(self, key: str) -> None:
        RUNS[key] += 1
        raise RuntimeError(f"{key} failed")

    def retry_interval(self, exception: BaseException, attempt: int) -> object:
        return 0


def context(task: str, *args: object) -> bytes:
    return JSON_CODEC.encode(Context(task, args, {}, 0))


def backend(pg: PgSchema, **options: object) -> Postgres:
    settings: dict[str, object] = {"poll_seconds": 0.05, **options}
    return Postgres(dsn=pg.dsn, schema=pg.schema, create_schema=True,
                    **settings)  # type: ignore[arg-type]


def sql(pg: PgSchema, query: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    return pg.sql(query, params)


async def eventually(what: str, check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        await asyncio.sleep(0.02)


@pytest.fixture(autouse=True)
def _fresh_runs() -> None:
    RUNS.clear()


@pytest.mark.spec("C-29", "P-30", "Q-227")
def test_a_queue_runs_retries_and_dead_letters_on_postgres(pg: PgSchema) -> None:
    async def scenario() -> None:
        with backend(pg) as db:
            queue = deferq.Queue(db, registry=REG)
            await queue.start()
            queue.enqueue(Record, "a")
            await queue.aenqueue(SlowRecord, "b")
            queue.enqueue(Fails, "c")
            await eventually("a, b ran and c gave up", lambda: RUNS == {"a": 1, "b": 1, "c": 2}
                             and bool(sql(pg, "SELECT 1 FROM {s}.dead")))
            await queue.wait_idle()
            assert await queue.stop(5)
            dead = db.list_dead_tasks()
            assert [(t.task_class, t.attempts, t.exception_message) for t in dead] == [
                ("pg.Fails", 2, "c failed")]
        assert sql(pg, "SELECT count(*) FROM {s}.pending") == [(0,)]
    asyncio.run(scenario())


class Held(deferq.Task, name="pg.Held", registry=REG):
    async def perform(self, key: str) -> None:
        await asyncio.sleep(0.05)
        RUNS[key] += 1


@pytest.mark.spec("Q-227", "Q-228")
def test_a_queue_claims_only_what_it_can_begin_and_claims_again_when_a_slot_frees(
        pg: PgSchema) -> None:
    keys = [f"h{i}" for i in range(12)]

    async def scenario() -> None:
        # A long poll: claiming again must come from the freed slots, not the poll.
        with backend(pg, poll_seconds=30) as worker, backend(pg) as producer:
            queue = deferq.Queue(worker, registry=REG, max_concurrency=2)
            await queue.start()
            for key in keys:
                producer.add_task(context("pg.Held", key))
            most = 0
            loop = asyncio.get_running_loop()
            started = loop.time()
            while sum(RUNS.values()) < len(keys):
                held = sql(pg, "SELECT count(*) FROM {s}.pending WHERE lease_owner = %s",
                           (worker.owner,))
                most = max(most, int(str(held[0][0])))
                assert loop.time() - started < 20, f"only {sum(RUNS.values())} ran"
                await asyncio.sleep(0.005)
            assert await queue.stop(5)
        assert most <= 2, f"held {most} tasks at once with max_concurrency=2"
        assert most >= 1  # the check saw the worker at work
        assert set(RUNS) == set(keys) and set(RUNS.values()) == {1}
    asyncio.run(scenario())


@pytest.mark.spec("P-22", "Q-207", "P-72", "Q-227")
def test_two_queues_on_one_database_run_each_task_once(pg: PgSchema) -> None:
    keys = [f"k{i}" for i in range(120)]

    async def scenario() -> None:
        with backend(pg) as one, backend(pg) as two, backend(pg) as producer:
            queues = [deferq.Queue(one, registry=REG), deferq.Queue(two, registry=REG)]
            for queue in queues:
                await queue.start()
            for i, key in enumerate(keys):  # a producer that runs no queue: free tasks
                producer.add_task(context("pg.SlowRecord" if i % 2 else "pg.Record", key))
            queues[0].enqueue(Record, "own-0")  # held by the queue that enqueued it
            queues[1].enqueue(Record, "own-1")
            await eventually("every task ran", lambda: sum(RUNS.values()) >= len(keys) + 2
                             and not sql(pg, "SELECT 1 FROM {s}.pending"))
            for queue in queues:
                assert await queue.stop(5)
        assert set(RUNS) == {*keys, "own-0", "own-1"}
        assert set(RUNS.values()) == {1}, [k for k, n in RUNS.items() if n != 1]
    asyncio.run(scenario())


@pytest.mark.spec("P-23", "Q-227")
def test_a_dead_workers_tasks_are_run_once_its_leases_expire(pg: PgSchema) -> None:
    async def scenario() -> None:
        with backend(pg) as dead_worker, backend(pg) as live:
            dead_worker.start_claiming()
            dead_worker.add_task(context("pg.Record", "orphan"))
            queue = deferq.Queue(live, registry=REG)
            await queue.start()
            await asyncio.sleep(0.2)
            assert RUNS["orphan"] == 0  # held under a live lease
            sql(pg, "UPDATE {s}.pending SET lease_until = now() - interval '1 s'")
            await eventually("the orphan ran", lambda: RUNS["orphan"] == 1)
            assert await queue.stop(5)
    asyncio.run(scenario())


class Parked(deferq.Task, name="pg.Parked", registry=REG):
    async def perform(self, key: str) -> None:
        RUNS[key] += 1
        await asyncio.sleep(3600)


class Interrupts(deferq.Hooks):
    def __init__(self) -> None:
        self.events: list[str] = []

    def on_interrupted(self, event: deferq.TaskInterrupted) -> None:
        self.events.append(f"interrupted {event.task_id}")

    def on_cancelled(self, event: deferq.TaskCancelled) -> None:
        self.events.append(f"cancelled {event.task_id}")


@pytest.mark.spec("Q-229", "C-36", "P-41")
def test_cancel_of_a_task_another_worker_took_is_false_and_leaves_it_to_that_worker(
        pg: PgSchema, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        with backend(pg) as mine, backend(pg) as other:
            hooks = Interrupts()
            queue = deferq.Queue(mine, registry=REG, hooks=[hooks])
            await queue.start()
            tid = queue.enqueue(Parked, "stalled")  # held by this queue, running
            await eventually("it runs", lambda: RUNS["stalled"] == 1)
            # This worker's lease runs out (a stall) and another worker takes the task.
            sql(pg, "UPDATE {s}.pending SET lease_until = now() - interval '1 s'")
            other.start_claiming()
            assert [t.task_id for t in other.claim_due(5)] == [tid]
            with caplog.at_level(logging.WARNING, logger="deferq.queue"):
                assert await queue.cancel(tid) is False
            assert f"deferred task {tid} was not cancelled: another worker holds it" in caplog.text
            assert sql(pg, "SELECT id, lease_owner FROM {s}.pending") == [(tid, other.owner)]
            assert hooks.events == [f"interrupted {tid}"]
            assert mine.remove_held(tid) is False  # still the other worker's
            assert other.remove_held(tid) is True and other.remove_held(tid) is False
            assert await queue.stop(5)
    asyncio.run(scenario())


@pytest.mark.spec("Q-77", "P-26")
def test_stop_gives_back_what_the_queue_did_not_run(pg: PgSchema) -> None:
    async def scenario() -> None:
        with backend(pg) as db, backend(pg) as other:
            queue = deferq.Queue(db, registry=REG)
            await queue.start()
            delayed = queue.enqueue(Record, "later", delay=3600)
            assert sql(pg, "SELECT lease_owner FROM {s}.pending") == [(db.owner,)]
            assert await queue.stop(5)
            assert sql(pg, "SELECT id, lease_owner FROM {s}.pending") == [(delayed, None)]
            sql(pg, "UPDATE {s}.pending SET publish_at = 1")
            assert [t.task_id for t in other.claim_due(5)] == [delayed]
    asyncio.run(scenario())


@pytest.mark.spec("Q-9", "Q-227")
def test_a_claimed_task_that_cannot_be_loaded_is_dead_lettered(pg: PgSchema) -> None:
    async def scenario() -> None:
        with backend(pg) as db, backend(pg) as producer:
            bad = producer.add_task(b"not json at all")
            unknown = producer.add_task(context("pg.NoSuchTask"))
            queue = deferq.Queue(db, registry=REG)
            await queue.start()
            await eventually("both dead-lettered", lambda: len(sql(pg, "SELECT 1 FROM {s}.dead"))
                             == 2)
            assert await queue.stop(5)
            assert {t.id for t in db.list_dead_tasks()} == {bad, unknown}
            assert sql(pg, "SELECT count(*) FROM {s}.pending") == [(0,)]
    asyncio.run(scenario())


@pytest.mark.spec("Q-76")
def test_a_failing_claim_is_logged_and_the_queue_goes_on(
        pg: PgSchema, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        with backend(pg, lease_seconds=1) as db, backend(pg) as producer:
            queue = deferq.Queue(db, registry=REG)
            await queue.start()
            sql(pg, "ALTER TABLE {s}.pending RENAME TO pending_away")
            await eventually("a claim failure logged",
                             lambda: "claiming due tasks failed" in caplog.text)
            sql(pg, "ALTER TABLE {s}.pending_away RENAME TO pending")
            producer.add_task(context("pg.Record", "after"))
            await eventually("the queue recovered", lambda: RUNS["after"] == 1)
            assert await queue.stop(5)
    with caplog.at_level(logging.ERROR, logger="deferq.queue"):
        asyncio.run(scenario())


@pytest.mark.slow
@pytest.mark.spec("Q-76", "P-25", "Q-208")
def test_the_heartbeat_keeps_a_long_task_held(pg: PgSchema) -> None:
    async def scenario() -> None:
        with backend(pg, lease_seconds=1) as db, backend(pg) as other:
            queue = deferq.Queue(db, registry=REG)
            await queue.start()
            queue.enqueue(Record, "held", delay=3600)
            await asyncio.sleep(1.6)  # past the first lease: only renewals keep it
            assert await asyncio.to_thread(other.claim_due, 5) == []
            left = sql(pg, "SELECT extract(epoch from lease_until - now()) FROM {s}.pending")
            assert float(str(left[0][0])) > 0
            assert await queue.stop(5)
    asyncio.run(scenario())


@pytest.mark.spec("Q-76", "P-6", "P-50")
def test_a_queue_survives_the_server_dropping_all_its_connections(
        pg: PgSchema, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        with backend(pg) as db, backend(pg) as producer:
            queue = deferq.Queue(db, registry=REG)
            await queue.start()
            queue.enqueue(Record, "before")
            await eventually("the first task ran", lambda: RUNS["before"] == 1)
            await asyncio.sleep(0.1)  # the claimer is waiting on its LISTEN connection
            sessions = [row[0] for row in sql(
                pg, "SELECT pid FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
                    "AND backend_type = 'client backend'")]
            assert len(sessions) >= 3  # the queue's statement and LISTEN ones, the producer's
            for pid in sessions:
                assert isinstance(pid, int)
                pg.terminate(pid)
            producer.add_task(context("pg.Record", "after"))  # on a fresh connection (P-6)
            await eventually("the queue reconnected and ran the next task",
                             lambda: RUNS["after"] == 1)
            queue.enqueue(Record, "own")  # its statement connection is back too
            await eventually("its own enqueue ran", lambda: RUNS["own"] == 1)
            assert await queue.stop(5)
    with caplog.at_level(logging.ERROR, logger="deferq.queue"):
        asyncio.run(scenario())


@pytest.mark.spec("Q-77", "P-27", "Q-227")
def test_an_idle_queue_wakes_on_notify_and_stops_at_once_with_a_long_poll(pg: PgSchema) -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        with backend(pg, poll_seconds=60) as db, backend(pg) as producer:
            queue = deferq.Queue(db, registry=REG)
            await queue.start()
            await asyncio.sleep(0.3)  # the claimer found nothing and waits on LISTEN
            started = loop.time()
            producer.add_task(context("pg.Record", "woken"))
            await eventually("the NOTIFY woke the queue", lambda: RUNS["woken"] == 1, 10)
            assert loop.time() - started < 10  # polling alone would take 60 s
            await asyncio.sleep(0.3)  # waiting on LISTEN again
            started = loop.time()
            assert await queue.stop(5)
            await asyncio.to_thread(db.close)  # waits for the LISTEN thread to let go
            assert loop.time() - started < 10  # wake() ended the wait
    asyncio.run(scenario())
