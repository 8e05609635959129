"""Claims and leases of the Postgres backend: several workers (backends on separate connections)
sharing one schema.

Goal: a due task is held by one live worker at a time, a lease that expires hands it over,
and idle workers wake on NOTIFY (spec/postgres.md P-20..P-27, api.md C-30..C-32). Method:
real backends on one server; a lease is expired by moving its ``lease_until`` into the past
with plain SQL (what waiting ``lease_seconds`` would do, without the wait), and one test
waits a real one-second lease out.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator

import pytest

from deferq.backends import Postgres
from tests.postgres.conftest import PgSchema


@pytest.fixture
def workers(pg: PgSchema) -> Iterator[list[Postgres]]:
    made = [Postgres(dsn=pg.dsn, schema=pg.schema, create_schema=True, poll_seconds=0.05)
            for _ in range(3)]
    try:
        yield made
    finally:
        for backend in made:
            backend.close()


def sql(pg: PgSchema, query: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    return pg.sql(query, params)


def expire(pg: PgSchema) -> None:
    sql(pg, "UPDATE {s}.pending SET lease_until = now() - interval '1 second' "
            "WHERE lease_owner IS NOT NULL")


@pytest.mark.spec("P-20", "P-10")
def test_every_backend_has_its_own_owner_and_holds_only_its_claims(
        workers: list[Postgres]) -> None:
    a, b, producer = workers
    assert len({w.owner for w in workers}) == 3
    ids = [producer.add_task(f"{i}".encode()) for i in range(4)]
    got_a = a.claim_due(2)
    got_b = b.claim_due(10)
    assert [t.task_id for t in got_a] == ids[:2]  # oldest first
    assert [t.task_id for t in got_b] == ids[2:]
    assert a.pending_tasks() == got_a and b.pending_tasks() == got_b
    assert producer.pending_tasks() == []


@pytest.mark.spec("P-22", "C-30")
def test_concurrent_claims_on_separate_connections_never_share_a_task(
        workers: list[Postgres]) -> None:
    a, b, producer = workers
    ids = {producer.add_task(b"x") for _ in range(200)}
    results: dict[str, list[str]] = {}
    barrier = threading.Barrier(2)

    def claim(worker: Postgres, name: str) -> None:
        barrier.wait()
        got: list[str] = []
        while batch := worker.claim_due(7):
            got.extend(t.task_id for t in batch)
        results[name] = got

    threads = [threading.Thread(target=claim, args=(w, n)) for w, n in ((a, "a"), (b, "b"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not set(results["a"]) & set(results["b"])
    assert set(results["a"]) | set(results["b"]) == ids
    assert a.claim_due(5) == [] and b.claim_due(5) == []


@pytest.mark.spec("P-23", "P-24")
def test_a_task_not_due_is_never_claimed_and_due_order_is_publish_time(
        pg: PgSchema, workers: list[Postgres]) -> None:
    a, _, producer = workers
    now = int(time.time())
    late = producer.add_task(b"later", now + 3600)
    past = producer.add_task(b"past", now - 100)
    plain = producer.add_task(b"plain")
    assert [t.task_id for t in a.claim_due(10)] == [plain, past]
    row = sql(pg, "SELECT extract(epoch from lease_until - now()) FROM {s}.pending "
                  "WHERE id = %s", (past,))
    assert 25 <= float(str(row[0][0])) <= 30  # lease_seconds=30 from the claim
    sql(pg, "UPDATE {s}.pending SET publish_at = %s WHERE id = %s", (now - 1, late))
    assert [t.task_id for t in a.claim_due(10)] == [late]


@pytest.mark.spec("P-23")
def test_an_expired_lease_hands_the_task_to_another_worker(
        pg: PgSchema, workers: list[Postgres]) -> None:
    a, b, producer = workers
    tid = producer.add_task(b"x")
    assert [t.task_id for t in a.claim_due(5)] == [tid]
    assert b.claim_due(5) == []  # held by a live lease
    expire(pg)
    assert [t.task_id for t in b.claim_due(5)] == [tid]
    assert a.renew_claims() == 0  # a's claim is gone: it no longer holds the task
    assert b.renew_claims() == 1
    a.remove_task(tid)  # the old holder finishing it still removes it (at-least-once)
    assert sql(pg, "SELECT count(*) FROM {s}.pending") == [(0,)]


@pytest.mark.slow
@pytest.mark.spec("P-23")
def test_a_real_one_second_lease_runs_out_without_a_heartbeat(pg: PgSchema) -> None:
    with Postgres(dsn=pg.dsn, schema=pg.schema, create_schema=True, lease_seconds=1) as a, \
            Postgres(dsn=pg.dsn, schema=pg.schema) as b:
        tid = a.add_task(b"x")
        assert [t.task_id for t in a.claim_due(1)] == [tid]
        assert b.claim_due(1) == []
        time.sleep(1.2)
        assert [t.task_id for t in b.claim_due(1)] == [tid]


@pytest.mark.spec("P-17", "P-25", "P-72")
def test_a_claiming_backend_holds_what_it_adds_and_renews_exactly_that(
        pg: PgSchema, workers: list[Postgres]) -> None:
    a, b, _ = workers
    a.start_claiming()
    mine = a.add_task(b"mine")
    delayed = a.add_task(b"later", int(time.time()) + 3600)
    assert b.claim_due(10) == []
    assert {t.task_id for t in a.pending_tasks()} == {mine, delayed}
    a.add_task(b"retry", None, mine)  # a re-add keeps the claim
    sql(pg, "UPDATE {s}.pending SET lease_until = now() + interval '1 second'")
    assert a.renew_claims() == 2
    left = sql(pg, "SELECT min(extract(epoch from lease_until - now())) FROM {s}.pending")
    assert float(str(left[0][0])) > 20
    a.remove_task(mine)
    assert a.renew_claims() == 1
    # A task claimed by a statement whose answer was lost: owned in the table, unknown to
    # the backend, so never renewed (it expires and another worker takes it).
    lost = b.add_task(b"lost")
    sql(pg, "UPDATE {s}.pending SET lease_owner = %s, lease_until = now() + interval '30 s' "
            "WHERE id = %s", (a.owner, lost))
    assert a.renew_claims() == 1


@pytest.mark.spec("P-26", "C-31", "P-72")
def test_release_and_close_give_every_held_task_back_at_once(
        pg: PgSchema, workers: list[Postgres]) -> None:
    a, b, _ = workers
    a.start_claiming()
    ids = {a.add_task(b"x") for _ in range(3)}
    assert a.release_claims() == 3
    assert a.pending_tasks() == [] and a.renew_claims() == 0
    assert {t.task_id for t in b.claim_due(10)} == ids
    free = a.add_task(b"free now")  # no longer claiming: a free task
    assert sql(pg, "SELECT lease_owner FROM {s}.pending WHERE id = %s", (free,)) == [(None,)]
    b.start_claiming()
    b.add_task(b"held")
    b.close()
    assert len(a.claim_due(10)) == 5


@pytest.mark.spec("P-27", "C-32", "P-73")
def test_idle_workers_wake_on_notify_and_on_wake(workers: list[Postgres]) -> None:
    a, _, producer = workers
    assert a.wait_for_tasks(0.05) is False  # LISTEN starts; nothing came
    started = time.monotonic()
    assert a.wait_for_tasks(0.0) is False
    timer = threading.Timer(0.2, lambda: producer.add_task(b"x"))
    timer.start()
    assert a.wait_for_tasks(20) is True
    assert time.monotonic() - started < 10
    timer.join()
    waker = threading.Timer(0.2, a.wake)
    waker.start()
    started = time.monotonic()
    assert a.wait_for_tasks(20) is False
    assert time.monotonic() - started < 10
    waker.join()


@pytest.mark.spec("P-25")
def test_a_task_whose_removal_or_re_add_failed_is_no_longer_renewed(
        pg: PgSchema, workers: list[Postgres]) -> None:
    from deferq.backends import PostgresError

    a, _, _ = workers
    a.start_claiming()
    ids = [a.add_task(b"x") for _ in range(3)]
    assert a.renew_claims() == 3
    sql(pg, f'''CREATE FUNCTION "{pg.schema}".refuse() RETURNS trigger LANGUAGE plpgsql AS
                $$ BEGIN RAISE EXCEPTION 'refused'; END $$''')
    sql(pg, "CREATE TRIGGER refuse BEFORE DELETE OR UPDATE ON {s}.pending FOR EACH ROW "
            f'EXECUTE FUNCTION "{pg.schema}".refuse()')
    with pytest.raises(PostgresError, match="remove a task: it failed: refused"):
        a.remove_task(ids[0])
    with pytest.raises(PostgresError, match="add a task: it failed: refused"):
        a.add_task(b"retry", None, ids[1])
    with pytest.raises(PostgresError, match="add a dead task: it failed: refused"):
        a.add_dead_task(ids[2], b"x", RuntimeError("x"), task_class="K", attempts=1)
    sql(pg, "DROP TRIGGER refuse ON {s}.pending")
    assert a.renew_claims() == 0  # all three are left to expire, and to run again elsewhere
    assert sql(pg, "SELECT count(*) FROM {s}.pending") == [(3,)]
    assert sql(pg, "SELECT count(*) FROM {s}.dead") == [(0,)]


@pytest.mark.spec("P-76")
def test_a_prepared_claim_carries_its_limit_in_its_text(pg: PgSchema) -> None:
    """After enough claims for psycopg to prepare them, the server holds one claim statement
    per limit used, each with its limit written in: never a generic ``LIMIT $n``."""
    with Postgres(dsn=pg.dsn, schema=pg.schema, create_schema=True) as producer, \
            Postgres(dsn=pg.dsn, schema=pg.schema) as worker:
        worker.start_claiming()
        for n in range(40):
            producer.add_task(b"%d" % n)
        for limit in (1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2):
            assert worker.claim_due(limit)
        conn = worker._session.conn
        assert conn is not None
        texts = [str(row[0]) for row in conn.execute(
            "SELECT statement FROM pg_prepared_statements WHERE statement LIKE '%SKIP LOCKED%'")]
    assert len(texts) == 2, texts  # prepared: one per limit
    assert sorted(re.findall(r"LIMIT (\S+)", t)[0] for t in texts) == ["1", "2"]
