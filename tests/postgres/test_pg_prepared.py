"""The hot statements run through libpq as named prepared statements (spec/postgres.md P-77).

Goal: the statements every task makes are prepared once per connection with their types,
never pile up on the server whatever limits callers pass, are prepared again on a new
connection, carry any bytes and any publish time exactly, and fail as psycopg's own errors
do. Method: a real server; what a connection has prepared is read from its own
``pg_prepared_statements``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from deferq.backends import Postgres, PostgresError
from deferq.backends import _pgprepared as prep
from tests.postgres.conftest import PgSchema


@pytest.fixture
def db(pg: PgSchema) -> Iterator[Postgres]:
    with Postgres(dsn=pg.dsn, schema=pg.schema, create_schema=True) as backend:
        yield backend


def prepared(db: Postgres) -> dict[str, str]:
    """The statements deferq prepared on ``db``'s connection: name -> parameter types."""
    rows = db._session.run("read the prepared statements", lambda c: c.execute(
        "SELECT name, parameter_types::text FROM pg_prepared_statements "
        "WHERE name LIKE 'deferq\\_%'").fetchall())
    return {str(name): str(types) for name, types in rows}


@pytest.mark.spec("P-77")
def test_a_producers_statements_are_prepared_once_with_their_types(db: Postgres) -> None:
    first = db.add_task(b"a")  # the first add of a quiet spell also notifies at once
    db.remove_task(first)
    seen = prepared(db)
    assert sorted(seen.values()) == ["{bytea,bigint}", "{text}", "{text}"], seen
    for n in range(20):
        db.remove_task(db.add_task(b"%d" % n, n % 2 or None))
    assert prepared(db) == seen  # each prepared once on this connection


@pytest.mark.spec("P-77")
def test_a_workers_statements_are_prepared_once_and_large_claims_never_kept(
        db: Postgres) -> None:
    db.start_claiming()
    held = db.add_task(b"held")  # P-72: held by this worker at once
    db.remove_task(held)
    assert db.claim_due(5) == []
    base = prepared(db)
    assert sorted(base.values()) == ['{bytea,bigint,text,"double precision"}',
                                     '{text,"double precision"}', "{text,text}"], base
    with Postgres(dsn=db._dsn, schema=db.schema) as producer:
        added = [producer.add_task(bytes([n])) for n in range(70)]
    got = db.claim_due(70)
    assert [t.task_id for t in got] == added  # oldest first, all of them
    assert [t.context for t in got] == [bytes([n]) for n in range(70)]
    for limit in (65, 66, 1000):
        db.claim_due(limit)
    assert prepared(db) == base  # a claim of more than 64 is unnamed: nothing kept
    db.claim_due(64)
    assert len(prepared(db)) == len(base) + 1
    for task in got:
        db.remove_task(task.task_id)
    assert len(prepared(db)) == len(base) + 1


@pytest.mark.spec("P-77", "P-50")
def test_a_new_connection_prepares_them_again(pg: PgSchema, db: Postgres) -> None:
    db.add_task(b"before")
    assert prepared(db)
    assert db._session.conn is not None
    pg.terminate(db._session.conn.info.backend_pid)
    after = db.add_task(b"after")  # P-51 notices the loss; the new connection prepares it
    assert "{bytea,bigint}" in prepared(db).values()
    assert pg.sql("SELECT id FROM {s}.pending ORDER BY seq DESC LIMIT 1") == [(after,)]


@pytest.mark.spec("P-77")
def test_every_byte_and_every_publish_time_round_trips(pg: PgSchema, db: Postgres) -> None:
    every_byte = bytes(range(256)) * 3
    latest = 10**18 - 1  # the largest publish time an add takes
    ids = [db.add_task(every_byte, when) for when in (None, 1, 2, latest)]
    assert pg.sql("SELECT context, publish_at FROM {s}.pending ORDER BY seq") == [
        (every_byte, None), (every_byte, 1), (every_byte, 2), (every_byte, latest)]
    db.start_claiming()
    claimed = db.claim_due(10)
    assert [(t.task_id, t.publish_at) for t in claimed] == [
        (ids[0], None), (ids[1], 1), (ids[2], 2)]  # the latest is not due
    assert all(t.context == every_byte for t in claimed)


@pytest.mark.spec("P-77", "P-6")
def test_a_failed_statement_raises_the_error_of_its_sqlstate(pg: PgSchema,
                                                             db: Postgres) -> None:
    import psycopg.errors

    db.add_task(b"prepared first")
    pg.sql("ALTER TABLE {s}.pending RENAME TO gone")
    with pytest.raises(PostgresError, match="add a task") as raised:
        db.add_task(b"x")
    assert isinstance(raised.value.__cause__, psycopg.errors.UndefinedTable)
    assert "does not exist" in str(raised.value)
    with pytest.raises(PostgresError, match="remove a task") as raised:
        db.remove_task("1-1")
    assert isinstance(raised.value.__cause__, psycopg.errors.UndefinedTable)


def test_binary_values_decode_as_the_server_sent_them() -> None:
    assert prep.int8(None) is None
    assert prep.int8(b"\xff" * 8) == -1
    assert prep.int8((2**63 - 1).to_bytes(8, "big")) == 2**63 - 1
    assert prep.text("é-1".encode()) == "é-1"


@pytest.mark.spec("P-77")
def test_statements_the_connection_lost_are_prepared_again(pg: PgSchema, db: Postgres) -> None:
    import psycopg

    db.start_claiming()
    first = db.add_task(b"first")

    def roll_back_after_psycopg_prepared(conn: psycopg.Connection[tuple[object, ...]]) -> None:
        for _ in range(6):  # psycopg prepares a statement at its fifth run
            conn.execute("SELECT %s::int", (1,))
        with pytest.raises(RuntimeError), conn.transaction():
            conn.execute("SELECT 1")
            raise RuntimeError("roll back")  # psycopg then sends DEALLOCATE ALL

    db._session.run("roll back", roll_back_after_psycopg_prepared)
    assert prepared(db) == {}  # deferq's statements went with psycopg's
    second = db.add_task(b"second")  # an add with a new id: never retried by P-50
    assert [t.task_id for t in db.claim_due(5)] == []  # both held by this worker (P-72)
    db.remove_task(first)
    db._session.run("discard", lambda conn: conn.execute("DISCARD ALL"))
    db.remove_task(second)
    assert pg.sql("SELECT count(*) FROM {s}.pending") == [(0,)]
    assert len(prepared(db)) == 1  # the removal, prepared again after DISCARD ALL
