"""The Postgres backend against a real server: schema, rows, transactions, dead tasks, faults.

Goal: each statement of spec/postgres.md about one backend holds on PostgreSQL 15 with
fsync=on. Method: every test gets its own schema (``pg`` fixture, tests/postgres/conftest.py)
and checks the tables with a second, plain psycopg connection where the rows themselves are
the point.
"""

from __future__ import annotations

import contextlib

import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from deferq import StorageClosedError
from deferq._core.errors import LimitExceededError
from deferq.backends import Backend, Disk, Memory, Nil, Postgres, PostgresError
from deferq.backends._pgschema import SCHEMA_VERSION
from deferq.backends.protocol import ClaimingBackend
from tests.postgres.conftest import PgSchema


@pytest.fixture
def db(pg: PgSchema) -> Iterator[Postgres]:
    with Postgres(dsn=pg.dsn, schema=pg.schema, create_schema=True) as backend:
        yield backend


def sql(pg: PgSchema, query: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    return pg.sql(query, params)


def failure() -> RuntimeError:
    try:
        raise RuntimeError("card declined")
    except RuntimeError as exc:
        return exc


@pytest.mark.spec("P-1")
def test_importing_deferq_and_its_backends_loads_no_psycopg() -> None:
    probe = ("import sys, deferq, deferq.backends, deferq._cli\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] == 'psycopg'))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=60).stdout.strip()
    assert out == "[]"


@pytest.mark.spec("P-1")
def test_without_psycopg_a_postgres_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)
    with pytest.raises(PostgresError, match=r"deferq\[postgres\]"):
        Postgres(dsn="host=/nowhere")


@pytest.mark.spec("P-2", "P-70")
@pytest.mark.parametrize("options", [
    {"schema": "Bad"}, {"schema": ""}, {"schema": "a-b"}, {"schema": "x" * 41},
    {"schema": 'a"b'}, {"dsn": ""}, {"dsn": 3}, {"lease_seconds": 0.5},
    {"poll_seconds": 0.0}, {"lease_seconds": float("nan")}, {"create_schema": 1},
])
def test_bad_options_are_refused_before_connecting(options: dict[str, object]) -> None:
    kwargs: dict[str, object] = {"dsn": "host=/nowhere port=1", **options}
    with pytest.raises(ValueError, match=next(iter(options))):
        Postgres(**kwargs)  # type: ignore[arg-type]


@pytest.mark.spec("P-3")
def test_creating_the_tables_twice_changes_nothing(pg: PgSchema) -> None:
    Postgres(dsn=pg.dsn, schema=pg.schema, create_schema=True).close()
    with Postgres(dsn=pg.dsn, schema=pg.schema, create_schema=True) as db:
        db.add_task(b"x")
    Postgres(dsn=pg.dsn, schema=pg.schema, create_schema=True).close()
    assert sql(pg, "SELECT version FROM {s}.schema_version") == [(SCHEMA_VERSION,)]
    assert sql(pg, "SELECT count(*) FROM {s}.pending") == [(1,)]


@pytest.mark.spec("P-3", "P-71")
def test_an_upgrade_never_creates_tables(pg: PgSchema) -> None:
    from deferq.backends._pgschema import migrate
    from deferq.backends._pgconn import connect

    with connect(pg.dsn) as conn:
        with pytest.raises(PostgresError, match="db init"):
            migrate(conn, pg.schema, create=False)
    assert sql(pg, "SELECT count(*) FROM pg_namespace WHERE nspname = %s", (pg.schema,)) == [(0,)]


@pytest.mark.spec("P-4")
def test_a_schema_without_tables_is_refused_and_nothing_is_created(pg: PgSchema) -> None:
    with pytest.raises(PostgresError, match=f"{pg.schema}.*deferq db init"):
        Postgres(dsn=pg.dsn, schema=pg.schema)
    assert sql(pg, "SELECT count(*) FROM pg_namespace WHERE nspname = %s", (pg.schema,)) == [(0,)]


@pytest.mark.spec("P-5")
def test_a_schema_of_a_newer_or_older_version_is_refused(pg: PgSchema) -> None:
    Postgres(dsn=pg.dsn, schema=pg.schema, create_schema=True).close()
    sql(pg, "UPDATE {s}.schema_version SET version = 99")
    for create in (False, True):
        with pytest.raises(PostgresError, match=f"version 99.*newer deferq.*{SCHEMA_VERSION}"):
            Postgres(dsn=pg.dsn, schema=pg.schema, create_schema=create)
    assert sql(pg, "SELECT version FROM {s}.schema_version") == [(99,)]
    sql(pg, "UPDATE {s}.schema_version SET version = 0")
    with pytest.raises(PostgresError, match="deferq db upgrade"):
        Postgres(dsn=pg.dsn, schema=pg.schema)


@pytest.mark.spec("P-6")
def test_a_wrong_dsn_is_a_clear_error_without_the_password(pg: PgSchema) -> None:
    wrong = f"host={pg.cluster.root} port=5432 dbname=nosuchdb user=deferq password=hunter2"
    with pytest.raises(PostgresError, match="cannot connect.*nosuchdb") as caught:
        Postgres(dsn=wrong, schema=pg.schema)
    assert "hunter2" not in str(caught.value)
    with pytest.raises(PostgresError, match="cannot connect"):
        Postgres(dsn="host=/nonexistent-dir port=1 user=x", schema=pg.schema)


@pytest.mark.spec("P-6", "P-51")
def test_a_connection_dropped_while_idle_is_replaced_before_the_next_statement(
        pg: PgSchema, db: Postgres) -> None:
    def kill() -> None:
        assert db._session.conn is not None
        pg.terminate(db._session.conn.info.backend_pid)

    kill()
    tid = db.add_task(b"x", None, "7-1")  # an idempotent write
    kill()
    assert [t.task_id for t in db.pending_tasks()] == []  # a read
    kill()
    new = db.add_task(b"y")  # a new id is never retried: it must not be sent on a dead connection
    assert sql(pg, "SELECT id FROM {s}.pending ORDER BY seq") == [(tid,), (new,)]


@pytest.mark.spec("P-51")
def test_a_connection_whose_end_was_already_read_is_replaced(pg: PgSchema,
                                                             db: Postgres) -> None:
    import psycopg

    conn = db._session.conn
    assert conn is not None
    pg.terminate(conn.info.backend_pid)
    # libpq reads the server's FATAL first and the end of the socket at a later read (as
    # after a crash, when no FATAL comes at all): the check then finds the connection gone.
    with contextlib.suppress(psycopg.Error):
        conn.pgconn.consume_input()
        conn.pgconn.notifies()
    new = db.add_task(b"y")  # a new id: never retried, so it must go to a fresh connection
    assert db._session.conn is not conn
    assert sql(pg, "SELECT id FROM {s}.pending") == [(new,)]


@pytest.mark.spec("P-51")
def test_a_notice_outside_a_failure_costs_the_next_statement_one_probe(pg: PgSchema,
                                                                       db: Postgres) -> None:
    db._session.run("notice", lambda c: c.execute("DO $$ BEGIN RAISE NOTICE 'hi'; END $$"))
    assert db._session._heard  # heard: the next statement first checks the connection
    conn = db._session.conn
    tid = db.add_task(b"x")
    assert not db._session._heard and db._session.conn is conn  # checked, kept
    assert sql(pg, "SELECT id FROM {s}.pending") == [(tid,)]


@pytest.mark.spec("P-6", "P-50", "P-59")
def test_a_connection_dropped_mid_statement_fails_that_call_and_the_next_reconnects(
        pg: PgSchema, db: Postgres) -> None:
    import psycopg

    assert db._session.conn is not None
    pid = db._session.conn.info.backend_pid
    failed: list[BaseException] = []

    def add() -> None:
        try:
            db.add_task(b"blocked")
        except PostgresError as exc:
            failed.append(exc)

    with psycopg.connect(pg.dsn) as locker:  # the add waits for this lock, mid-statement
        locker.execute(f'LOCK TABLE "{pg.schema}".pending IN ACCESS EXCLUSIVE MODE')
        adder = threading.Thread(target=add)
        adder.start()
        deadline = time.monotonic() + 20
        while not sql(pg, "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event_type "
                          "= 'Lock'", (pid,)):
            assert time.monotonic() < deadline, "the add never waited for the lock"
            time.sleep(0.01)
        pg.terminate(pid)
        adder.join(20)
    assert len(failed) == 1
    assert "add a task: the connection to PostgreSQL was lost" in str(failed[0])
    assert db.add_task(b"next")
    assert [r[0] for r in sql(pg, "SELECT context FROM {s}.pending")] == [b"next"]


@pytest.mark.spec("P-6")
def test_a_failing_statement_names_the_operation_and_the_schema(
        pg: PgSchema, db: Postgres) -> None:
    sql(pg, "DROP TABLE {s}.dead")
    with pytest.raises(PostgresError, match=f"schema '{pg.schema}'.*list dead tasks.*dead"):
        db.list_dead_tasks()


@pytest.mark.spec("P-6")
def test_a_read_only_server_and_a_statement_timeout_are_clear_errors(pg: PgSchema) -> None:
    import psycopg

    Postgres(dsn=pg.dsn, schema=pg.schema, create_schema=True).close()
    read_only = f"{pg.dsn} options='-c default_transaction_read_only=on'"
    with Postgres(dsn=read_only, schema=pg.schema) as replica:
        assert replica.list_dead_tasks() == []  # reads work
        with pytest.raises(PostgresError, match="add a task: it failed: .*read-only"):
            replica.add_task(b"x")
    slow = f"{pg.dsn} options='-c statement_timeout=50'"
    with Postgres(dsn=slow, schema=pg.schema) as db:
        with psycopg.connect(pg.dsn) as locker:  # holds a lock the add must wait for
            locker.execute(f'LOCK TABLE "{pg.schema}".pending IN ACCESS EXCLUSIVE MODE')
            with pytest.raises(PostgresError, match="add a task: it failed: .*statement timeout"):
                db.add_task(b"x")
        assert db.add_task(b"x")  # the connection is fine afterwards
    assert sql(pg, "SELECT count(*) FROM {s}.pending") == [(1,)]


@pytest.mark.spec("P-10", "P-12", "P-16", "P-17", "P-18")
def test_adds_removes_and_rows(pg: PgSchema, db: Postgres) -> None:
    assert db.group_commit is False
    first = db.add_task(b"one", sync=False)
    second = db.add_task(b"two", 1_900_000_000)
    seed, _, n = first.partition("-")
    assert seed.isdigit() and n.isdigit() and first != second
    rows = sql(pg, "SELECT id, context, publish_at, lease_owner FROM {s}.pending ORDER BY seq")
    assert rows == [(first, b"one", None, None), (second, b"two", 1_900_000_000, None)]
    assert db.add_task(b"one again", 5, first) == first
    assert sql(pg, "SELECT context, publish_at FROM {s}.pending WHERE id = %s", (first,)) == [
        (b"one again", 5)]
    db.remove_task(first)
    db.remove_task(first)
    db.remove_task("never-added")
    assert sql(pg, "SELECT id FROM {s}.pending") == [(second,)]
    ticket = db.written_ticket()
    db.sync_through(ticket)
    db.sync()
    with pytest.raises(ValueError, match="ticket"):
        db.sync_through(-1)
    with pytest.raises(ValueError, match="context"):
        db.add_task("text")  # type: ignore[arg-type]
    with pytest.raises(LimitExceededError):
        db.add_task(b"x" * (10**7))
    with pytest.raises(ValueError, match="publish_at"):
        db.add_task(b"x", -1)


def _taken_ids(pg: PgSchema, count: int) -> list[str]:
    """Chosen ids for the ``count`` values of ``task_seq`` that generated ids take next once
    they are added, in this second and the next two (a test may cross a second's boundary).
    Each of these adds takes a value of ``task_seq`` for its ``seq``: they are skipped."""
    [(second, last)] = sql(pg, "SELECT floor(extract(epoch from now()))::bigint, "
                               "nextval('{s}.task_seq')")
    assert isinstance(second, int) and isinstance(last, int)
    skip = last + 3 * count  # the values the chosen adds themselves take
    return [f"{second + d}-{skip + k}" for d in range(3) for k in range(1, count + 1)]


@pytest.mark.spec("P-12", "P-45")
def test_a_generated_id_already_taken_is_skipped_never_replaced(
        pg: PgSchema, db: Postgres) -> None:
    taken = _taken_ids(pg, 3)
    for tid in taken:
        assert db.add_task(b"chosen " + tid.encode(), None, tid) == tid
    new = db.add_task(b"generated")
    assert new not in taken
    rows = {row[0]: row[1] for row in sql(pg, "SELECT id, context FROM {s}.pending")}
    assert rows == {**{tid: b"chosen " + tid.encode() for tid in taken}, new: b"generated"}
    [(seq,)] = sql(pg, "SELECT seq FROM {s}.pending WHERE id = %s", (new,))
    assert new.endswith(f"-{seq}")  # this implementation: one nextval, n is the seq


@pytest.mark.spec("P-45")
def test_eight_taken_ids_fail_the_add_and_store_nothing(pg: PgSchema, db: Postgres) -> None:
    for tid in _taken_ids(pg, 8):
        db.add_task(b"chosen", None, tid)
    before = sql(pg, "SELECT id, context FROM {s}.pending ORDER BY id")
    with pytest.raises(PostgresError, match="add a task: it failed: duplicate key"):
        db.add_task(b"generated")
    assert sql(pg, "SELECT id, context FROM {s}.pending ORDER BY id") == before
    assert db.add_task(b"next")  # the ninth value is free: the backend goes on


@pytest.mark.spec("P-11", "P-30", "P-31", "P-33")
def test_the_give_up_is_one_transaction_and_dead_tasks_list_newest_first(
        pg: PgSchema, db: Postgres) -> None:
    ids = [db.add_task(f"t{i}".encode()) for i in range(4)]
    for tid in ids:
        db.add_dead_task(tid, b"ctx-" + tid.encode(), failure(), task_class="Charge", attempts=3)
    assert sql(pg, "SELECT count(*) FROM {s}.pending") == [(0,)]
    listed = db.list_dead_tasks()
    assert [t.id for t in listed] == ids[::-1]
    memory = Memory()
    memory.add_dead_task(ids[0], b"ctx-" + ids[0].encode(), failure(), task_class="Charge",
                         attempts=3)
    mine, theirs = listed[-1], memory.list_dead_tasks()[0]
    assert (mine.task_class, mine.attempts, mine.enqueued_at, mine.exception_class,
            mine.exception_message, mine.context) == (
        theirs.task_class, theirs.attempts, theirs.enqueued_at, theirs.exception_class,
        theirs.exception_message, theirs.context)
    assert mine.backtrace and mine.backtrace[-1].endswith(":in failure")
    db.add_dead_task(ids[1], b"again", failure(), task_class="Charge", attempts=4)
    assert [t.id for t in db.list_dead_tasks(limit=2, offset=1)] == [ids[3], ids[2]]
    assert db.list_dead_tasks(limit=1)[0].context == b"again"
    assert db.find_dead_task(ids[2]) == listed[1]
    assert db.find_dead_task("nope") is None
    assert db.remove_dead_tasks([ids[0], ids[0], "nope"]) == 1
    assert db.remove_dead_tasks(ids[1]) == 1
    assert db.remove_dead_tasks(None) == 0
    assert [t.id for t in db.list_dead_tasks()] == [ids[3], ids[2]]
    with pytest.raises(ValueError, match="offset"):
        db.list_dead_tasks(offset=-1)


@pytest.mark.spec("P-30")
def test_a_failed_give_up_leaves_the_task_pending_and_no_dead_task(
        pg: PgSchema, db: Postgres) -> None:
    tid = db.add_task(b"x")
    # The DELETE of the handoff fails after the INSERT ran: the transaction must undo both.
    sql(pg, """CREATE FUNCTION "%s".refuse() RETURNS trigger LANGUAGE plpgsql AS
               $$ BEGIN RAISE EXCEPTION 'no deletes today'; END $$""" % pg.schema)
    sql(pg, "CREATE TRIGGER refuse BEFORE DELETE ON {s}.pending FOR EACH ROW "
            f'EXECUTE FUNCTION "{pg.schema}".refuse()')
    with pytest.raises(PostgresError, match="no deletes today"):
        db.add_dead_task(tid, b"x", failure(), task_class="K", attempts=1)
    assert sql(pg, "SELECT count(*) FROM {s}.dead") == [(0,)]
    assert sql(pg, "SELECT id FROM {s}.pending") == [(tid,)]


@pytest.mark.spec("P-13")
def test_a_nul_in_dead_task_text_is_stored_escaped(db: Postgres) -> None:
    try:
        raise ValueError("bad\x00byte")
    except ValueError as exc:
        db.add_dead_task("1-1", b"\x00ctx", exc, task_class="A\x00B", attempts=1)
    stored = db.find_dead_task("1-1")
    assert stored is not None
    assert (stored.exception_message, stored.task_class, stored.context) == (
        "bad\\x00byte", "A\\x00B", b"\x00ctx")


@pytest.mark.spec("P-32")
def test_dead_tasks_filter_by_class_exception_and_time(pg: PgSchema, db: Postgres) -> None:
    for i, (cls, exc) in enumerate([("A", ValueError()), ("B", KeyError()), ("A", KeyError())]):
        db.add_dead_task(f"9-{i}", b"c", exc, task_class=cls, attempts=1)
    sql(pg, "UPDATE {s}.dead SET failed_at = 1000 + seq - (SELECT min(seq) FROM {s}.dead)")
    assert [t.id for t in db.list_dead_tasks(task_class="A")] == ["9-2", "9-0"]
    assert [t.id for t in db.list_dead_tasks(exception_class="KeyError")] == ["9-2", "9-1"]
    assert [t.id for t in db.list_dead_tasks(task_class="A", exception_class="KeyError")] == [
        "9-2"]
    assert [t.id for t in db.list_dead_tasks(failed_from=1001, failed_until=1002)] == ["9-1"]
    assert [t.id for t in db.list_dead_tasks(task_class="A", offset=1, limit=5)] == ["9-0"]
    with pytest.raises(ValueError, match="failed_from"):
        db.list_dead_tasks(failed_from="1")  # type: ignore[arg-type]
    plan = "\n".join(str(r[0]) for r in sql(
        pg, "EXPLAIN SELECT * FROM {s}.dead WHERE task_class = 'A' ORDER BY seq DESC LIMIT 5"))
    assert "dead_by_task_class" in plan or "dead_newest" in plan


@pytest.mark.spec("C-29", "C-30", "C-32")
def test_only_postgres_is_a_claiming_backend_and_claim_arguments_are_checked(
        tmp_path: object, db: Postgres) -> None:
    typed: Backend = db  # mypy checks the protocol's signatures
    assert isinstance(typed, ClaimingBackend)
    assert not isinstance(Memory(), ClaimingBackend)
    assert not isinstance(Nil(), ClaimingBackend)
    disk = Disk(path=str(tmp_path) + "/store")
    try:
        assert not isinstance(disk, ClaimingBackend)
    finally:
        disk.close()
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="limit"):
            db.claim_due(bad)  # type: ignore[arg-type]
    for wait in (-1.0, float("inf")):
        with pytest.raises(ValueError, match="timeout"):
            db.wait_for_tasks(wait)


def test_a_closed_backend_refuses_every_call(db: Postgres) -> None:
    db.close()
    db.close()
    for call in (lambda: db.add_task(b"x"), db.pending_tasks, db.list_dead_tasks, db.sync,
                 lambda: db.claim_due(1), db.written_ticket, lambda: db.sync_through(0),
                 lambda: db.wait_for_tasks(0)):
        with pytest.raises(StorageClosedError):
            call()


@pytest.mark.slow
@pytest.mark.spec("P-40", "P-16")
def test_what_was_acknowledged_survives_a_server_crash(pg: PgSchema) -> None:
    with Postgres(dsn=pg.dsn, schema=pg.schema, create_schema=True) as db:
        kept = [db.add_task(f"{i}".encode(), sync=False) for i in range(20)]
        gone = kept.pop()
        db.remove_task(gone)
        db.add_dead_task(kept[0], b"0", RuntimeError("x"), task_class="K", attempts=1)
        pg.cluster.stop(mode="immediate")  # the server dies without a checkpoint
        pg.cluster.start()
        # The backend's connection died with the server; a read reconnects (P-6).
        assert db.find_dead_task(kept[0]) is not None
    ids = [row[0] for row in sql(pg, "SELECT id FROM {s}.pending ORDER BY seq")]
    assert ids == kept[1:]


@pytest.mark.spec("C-29", "C-16")
def test_postgres_has_every_member_of_the_protocols_with_their_signatures() -> None:
    import inspect

    from tests.unit.test_backend_protocol import BACKEND_MEMBERS

    claim_members = ("start_claiming", "claim_due", "renew_claims", "release_claims",
                     "wait_for_tasks", "wake")
    for protocol, names in ((Backend, BACKEND_MEMBERS), (ClaimingBackend, claim_members)):
        for name in names:
            wanted = inspect.getattr_static(protocol, name)
            got = inspect.getattr_static(Postgres, name)
            if isinstance(wanted, property):
                assert isinstance(got, property), name
                continue
            want = [(p.name, p.kind, p.default)
                    for p in inspect.signature(wanted).parameters.values()]
            params = list(inspect.signature(got).parameters.values())
            # The protocol's parameters, in order; only optional keyword-only ones may follow
            # (list_dead_tasks' filters, P-32).
            assert [(p.name, p.kind, p.default) for p in params[:len(want)]] == want, name
            assert all(p.kind is p.KEYWORD_ONLY and p.default is not p.empty
                       for p in params[len(want):]), name


@pytest.mark.spec("C-23", "F-51")
def test_a_dead_task_keeps_when_its_task_was_first_enqueued(db: Postgres) -> None:
    """The give-up's ``enqueued_at`` is stored, not the id's seed; without it, the seed."""
    first = db.add_task(b"first")
    second = db.add_task(b"second")
    db.add_dead_task(first, b"first", failure(), task_class="Charge", attempts=1,
                     enqueued_at=1_700_000_000)
    db.add_dead_task(second, b"second", failure(), task_class="Charge", attempts=1)
    kept = db.find_dead_task(first)
    fallback = db.find_dead_task(second)
    assert kept is not None and kept.enqueued_at == 1_700_000_000
    assert fallback is not None and fallback.enqueued_at != 1_700_000_000
    with pytest.raises(ValueError, match="enqueued_at"):
        db.add_dead_task(second, b"x", failure(), task_class="Charge", attempts=1,
                         enqueued_at=2**63)
