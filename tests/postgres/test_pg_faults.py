"""The PostgreSQL backend against a server that stops answering, slow connects and malformed
DSNs (spec/postgres.md P-46..P-49).

Goal: no call, ``close``, ``Queue.stop`` or ``deferq db init`` waits without bound on a server
that stopped answering, connects honour the DSN's ``connect_timeout``, and no error shows a
piece of a DSN that does not parse. Method: a real server whose processes are SIGSTOPped (a
backend process stands in for a frozen host or a partition on that connection: the kernel
keeps accepting bytes, nothing answers; the postmaster for a server that accepts no new
connection), always SIGCONTed in a ``finally``; ``timeout_seconds=1`` keeps the waits short,
and each one is bounded by the test.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import deferq
from deferq._cli import main
from deferq.backends import Postgres, PostgresError
from deferq.backends._pgconn import CONNECT_TIMEOUT_S, connect_timeout_of
from deferq.backends.postgres import migrate_schema
from tests.postgres.conftest import PgSchema

REG = deferq.TaskRegistry()
RAN: list[str] = []


class Note(deferq.Task, name="pgfault.Note", registry=REG):
    async def perform(self, key: str) -> None:
        RAN.append(key)


@contextmanager
def stopped(*pids: int) -> Iterator[None]:
    """The processes ``pids`` are SIGSTOPped inside the block, and always resumed after it."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


def session_pid(db: Postgres) -> int:
    conn = db._session.conn
    assert conn is not None, "the backend has not connected yet"
    return int(conn.info.backend_pid)


def other_backends(pg: PgSchema) -> list[int]:
    """Every client session of the server but the one asking (the test's own connections)."""
    rows = pg.sql("SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' "
                  "AND pid <> pg_backend_pid()")
    return [int(str(row[0])) for row in rows]


def postmaster_pid(pg: PgSchema) -> int:
    return int((Path(pg.cluster.data) / "postmaster.pid").read_text().split()[0])


@pytest.mark.spec("P-47")
def test_a_statement_the_server_never_answers_fails_within_the_timeout(pg: PgSchema) -> None:
    with Postgres(dsn=pg.dsn, schema=pg.schema, create_schema=True, timeout_seconds=1) as db:
        before = db.add_task(b"before")
        with stopped(session_pid(db)):
            started = time.monotonic()
            with pytest.raises(PostgresError) as caught:
                db.add_task(b"unanswered")  # a new id: never retried (P-50)
            took = time.monotonic() - started
        message = str(caught.value)
        assert "did not answer within 1 s" in message and "timeout_seconds" in message, message
        assert "add a task" in message and pg.schema in message, message
        assert 0.9 <= took < 4, f"the unanswered add took {took:.1f} s"
        assert db._watchdog.fired == 1
        # P-50: the next call connects again and works.
        after = db.add_task(b"after")
        ids = {task.task_id for task in db.pending_tasks()} | {
            row[0] for row in pg.sql("SELECT id FROM {s}.pending")}
        assert {before, after} <= ids


@pytest.mark.spec("P-47", "P-50")
def test_a_read_on_a_silent_connection_is_retried_on_a_fresh_one(pg: PgSchema) -> None:
    with Postgres(dsn=pg.dsn, schema=pg.schema, create_schema=True, timeout_seconds=1) as db:
        task_id = db.add_task(b"x")
        with stopped(session_pid(db)):
            started = time.monotonic()
            assert db.find_dead_task(task_id) is None  # on a fresh connection (P-50)
            db.remove_task(task_id)  # an idempotent write: retried the same way
            took = time.monotonic() - started
        assert took < 4, f"the retried calls took {took:.1f} s"
        assert pg.sql("SELECT count(*) FROM {s}.pending") == [(0,)]


@pytest.mark.spec("P-47")
def test_a_queue_stops_and_its_backend_closes_while_the_server_is_silent(pg: PgSchema) -> None:
    RAN.clear()

    async def scenario() -> float:
        db = Postgres(dsn=pg.dsn, schema=pg.schema, create_schema=True, timeout_seconds=1,
                      poll_seconds=0.05)
        queue = deferq.Queue(db, registry=REG)
        await queue.start()
        await queue.aenqueue(Note, "ran")
        deadline = time.monotonic() + 20
        while RAN != ["ran"]:
            assert time.monotonic() < deadline, "the task did not run"
            await asyncio.sleep(0.02)
        await queue.wait_idle()
        with stopped(*other_backends(pg)):
            started = time.monotonic()
            await asyncio.wait_for(queue.stop(1), timeout=30)
            await asyncio.to_thread(db.close)
            return time.monotonic() - started

    took = asyncio.run(scenario())
    # release (retried once: two timeouts) and the listener's wait, each bounded.
    assert took < 12, f"stop and close took {took:.1f} s"


@pytest.mark.spec("P-47")
def test_db_init_waiting_on_a_stuck_holder_of_the_schema_lock_fails_within_the_timeout(
        pg: PgSchema) -> None:
    import psycopg
    with psycopg.connect(pg.dsn, autocommit=True) as holder:
        with holder.transaction():
            holder.execute("SELECT pg_advisory_xact_lock(hashtext(%s))",
                           (f"deferq schema {pg.schema}",))
            started = time.monotonic()
            with pytest.raises(PostgresError) as caught:
                migrate_schema(pg.dsn, pg.schema, create=True, timeout_seconds=1)
            took = time.monotonic() - started
    assert "did not answer within 1 s" in str(caught.value)
    assert took < 4, f"db init took {took:.1f} s"
    assert migrate_schema(pg.dsn, pg.schema, create=True) == (0, migrate_schema(
        pg.dsn, pg.schema, create=False)[1])  # nothing half-made: it works afterwards


@pytest.mark.spec("P-49")
def test_a_connect_honours_the_dsns_connect_timeout(pg: PgSchema) -> None:
    assert connect_timeout_of(pg.dsn) == CONNECT_TIMEOUT_S == 10
    assert connect_timeout_of(pg.dsn + " connect_timeout=2") is None  # libpq's own, then
    with stopped(postmaster_pid(pg)):  # accepts no new connection
        started = time.monotonic()
        with pytest.raises(PostgresError) as caught:
            Postgres(dsn=pg.dsn + " connect_timeout=1", schema=pg.schema)
        took = time.monotonic() - started
    assert "cannot connect" in str(caught.value)
    assert took < 5, f"the connect took {took:.1f} s, not about 1 s"


SECRET = "s3cr3tpw"
MALFORMED = [
    f"host=/tmp password={SECRET} {SECRET}x",
    f"host=/tmp password='{SECRET}",
    f"postgresql://u:{SECRET} x@h/db",
    f"host=/tmp password=a {SECRET}=1",
    f"postgresql://u:{SECRET}%zz@h/db",
]


@pytest.mark.spec("P-46", "P-6")
@pytest.mark.parametrize("dsn", MALFORMED)
def test_an_unparsable_dsn_is_refused_quoting_none_of_it(
        dsn: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(PostgresError) as caught:
        Postgres(dsn=dsn)
    assert "cannot be parsed" in str(caught.value) and SECRET not in str(caught.value)
    with pytest.raises(PostgresError) as caught:
        migrate_schema(dsn, "deferq", create=True)
    assert SECRET not in str(caught.value)
    monkeypatch.delenv("DEFERQ_DSN", raising=False)
    for argv in (["db", "init", "--dsn", dsn], ["stats", "--dsn", dsn],
                 ["dead", "list", "--dsn", dsn]):
        assert main(argv) == 1, argv
        out, err = capsys.readouterr()
        assert SECRET not in out + err and "cannot be parsed" in err, (argv, err)
        assert len(err.strip().splitlines()) == 1, err


@pytest.mark.spec("P-48")
@pytest.mark.parametrize("bad", [0, 0.5, -1, float("nan"), float("inf"), "30", True, None])
def test_a_bad_timeout_is_refused_before_connecting(bad: object) -> None:
    with pytest.raises(ValueError, match="timeout_seconds"):
        Postgres(dsn="host=/nonexistent", timeout_seconds=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout_seconds"):
        migrate_schema("host=/nonexistent", "deferq", create=True,
                       timeout_seconds=bad)  # type: ignore[arg-type]


@pytest.mark.spec("P-60", "P-47")
def test_the_commands_take_a_db_timeout(pg: PgSchema, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DEFERQ_DSN", raising=False)
    for bad in ("0", "0.5", "-3", "nan", "inf", "soon"):
        assert main(["stats", "--dsn", pg.dsn, "--db-timeout", bad]) == 2, bad
        _, err = capsys.readouterr()
        assert "--db-timeout" in err and len(err.strip().splitlines()) == 1, err
    assert main(["db", "init", "--dsn", pg.dsn, "--schema", pg.schema, "--db-timeout", "5"]) == 0
    capsys.readouterr()
    import psycopg
    with psycopg.connect(pg.dsn, autocommit=True) as holder:
        with holder.transaction():  # a stuck holder of the schema's lock: db init must wait
            holder.execute("SELECT pg_advisory_xact_lock(hashtext(%s))",
                           (f"deferq schema {pg.schema}",))
            started = time.monotonic()
            status = main(["db", "upgrade", "--dsn", pg.dsn, "--schema", pg.schema,
                           "--db-timeout", "1"])
            took = time.monotonic() - started
    _, err = capsys.readouterr()
    assert status == 1 and "did not answer within 1 s" in err, err
    assert took < 4, f"db upgrade took {took:.1f} s"
    assert main(["stats", "--dsn", pg.dsn, "--schema", pg.schema, "--db-timeout", "2.5"]) == 0


@pytest.mark.spec("P-47")
def test_an_idle_watchdog_thread_ends_and_the_next_statement_starts_another(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from deferq.backends import _pgconn
    monkeypatch.setattr(_pgconn, "_IDLE_EXIT_S", 0.0)
    watchdog = _pgconn.Watchdog(1.0)  # looks every 0.25 s
    try:
        watchdog.arm("session", -1)
        first = watchdog._thread
        assert first is not None and first.is_alive()
        time.sleep(0.4)
        assert first.is_alive()  # something is armed: it stays
        watchdog.disarm("session")
        first.join(timeout=5)
        assert not first.is_alive() and watchdog._thread is None
        watchdog.arm("session", -1)
        assert watchdog._thread is not None and watchdog._thread is not first
        watchdog.disarm("session")
    finally:
        watchdog.close()
    assert watchdog.fired == 0


@pytest.mark.spec("P-47")
def test_the_watchdog_cuts_a_tcp_connection_too() -> None:
    """The tests' server listens on a Unix socket; a real deployment mostly on TCP."""
    import socket
    import threading

    from deferq.backends._pgconn import _shut_down
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        with socket.create_connection(server.getsockname()) as client:
            accepted, _ = server.accept()
            with accepted:
                cut = threading.Timer(0.2, _shut_down, (client.fileno(),))
                cut.start()
                client.settimeout(10)
                assert client.recv(10) == b""  # the blocked read ends: end of stream
                cut.join()
