"""``deferq db init|upgrade`` and the operator commands with ``--dsn`` / ``DEFERQ_DSN``, on a real
server (spec/postgres.md P-3..P-7, P-32).

Goal: the tables are created and upgraded only by the commands meant to, a newer schema is
refused, the dead-task commands behave as on a directory, and every fault is one line with the
CLI's exit status, never a traceback. Method: ``deferq._cli.main`` in-process (its output read
with capsys), and one real ``python -m deferq`` subprocess for the traceback check.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from deferq import Operator
from deferq._cli import main
from deferq._runtime.serialize import JSON_CODEC, Context, decode_context
from deferq.backends import Postgres
from tests.postgres.conftest import PgSchema


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


def _fail(exc: Exception) -> Exception:
    try:
        raise exc
    except Exception as caught:  # noqa: BLE001 - a real traceback for the record
        return caught


def _context(value: object) -> Context:
    assert isinstance(value, bytes)
    return decode_context(value)


@pytest.fixture
def store(pg: PgSchema, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Three dead tasks (two app.Mail, one app.Sms) and one pending task; the dead ids, oldest
    first. DEFERQ_* variables are cleared so that only what a test sets counts."""
    for name in list(os.environ):
        if name.startswith("DEFERQ_") and name != "DEFERQ_REQUIRE_POSTGRES":
            monkeypatch.delenv(name)
    ids = []
    with Postgres(dsn=pg.dsn, schema=pg.schema, create_schema=True) as db:
        for n, (name, exc) in enumerate([("app.Mail", KeyError("smtp down")),
                                         ("app.Sms", ValueError("bad number")),
                                         ("app.Mail", KeyError("quota"))]):
            context = JSON_CODEC.encode(Context(name, (n,), {}, 21))
            task_id = db.add_task(context)
            db.add_dead_task(task_id, context, _fail(exc), task_class=name, attempts=21)
            ids.append(task_id)
        db.add_task(JSON_CODEC.encode(Context("app.Report", (), {}, 2)))
    yield ids


@pytest.mark.spec("P-7", "P-3", "P-71")
def test_db_init_creates_then_changes_nothing_and_upgrade_never_creates(
        pg: PgSchema, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = cli(capsys, "db", "upgrade", "--dsn", pg.dsn, "--schema", pg.schema)
    assert status == 1 and out == ""
    assert err.startswith("deferq: error: ") and "deferq db init" in err and len(
        err.splitlines()) == 1
    assert pg.sql("SELECT 1 FROM pg_namespace WHERE nspname = %s", (pg.schema,)) == []
    status, out, _ = cli(capsys, "db", "init", "--dsn", pg.dsn, "--schema", pg.schema)
    assert (status, out) == (0, f"schema '{pg.schema}': created deferq's tables at version 1\n")
    status, out, _ = cli(capsys, "db", "init", "--dsn", pg.dsn, "--schema", pg.schema, "--json")
    assert status == 0 and json.loads(out) == {"schema": pg.schema, "version_before": 1,
                                               "version": 1}
    status, out, _ = cli(capsys, "db", "upgrade", "--dsn", pg.dsn, "--schema", pg.schema)
    assert (status, out) == (0, f"schema '{pg.schema}' is already at version 1; nothing changed\n")


@pytest.mark.spec("P-7", "P-5")
def test_db_commands_refuse_a_newer_schema_and_need_a_dsn(
        pg: PgSchema, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DEFERQ_DSN", raising=False)
    Postgres(dsn=pg.dsn, schema=pg.schema, create_schema=True).close()
    pg.sql("UPDATE {s}.schema_version SET version = 7")
    for command in ("init", "upgrade"):
        status, _, err = cli(capsys, "db", command, "--dsn", pg.dsn, "--schema", pg.schema)
        assert status == 1 and "version 7, made by a newer deferq" in err
    assert pg.sql("SELECT version FROM {s}.schema_version") == [(7,)]
    status, _, err = cli(capsys, "db", "init")
    assert status == 2 and "--dsn" in err and "DEFERQ_DSN" in err
    status, _, err = cli(capsys, "db", "init", "--dsn", pg.dsn, "--schema", "No-Good")
    assert status == 1 and "schema must be" in err


@pytest.mark.spec("P-7", "P-32", "P-52")
def test_dead_commands_on_postgres(pg: PgSchema, store: list[str],
                                   capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    where = ("--dsn", pg.dsn, "--schema", pg.schema)
    status, out, _ = cli(capsys, "dead", "list", *where, "--json")
    assert status == 0 and [t["id"] for t in json.loads(out)] == store[::-1]
    filtered: list[tuple[str | None, str | None]] = []
    original = Postgres.list_dead_tasks_where

    def spy(self: Postgres, **kwargs: object) -> object:
        filtered.append((kwargs["task_class"], kwargs["exception_class"]))  # type: ignore[arg-type]
        return original(self, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Postgres, "list_dead_tasks_where", spy)
    status, out, _ = cli(capsys, "dead", "list", *where, "--task-class", "app.Mail")
    assert status == 0 and out.splitlines()[-1] == "2 dead task(s)"
    assert filtered == [("app.Mail", None)]
    status, out, _ = cli(capsys, "dead", "show", store[1], *where)
    assert status == 0 and "bad number" in out
    status, _, err = cli(capsys, "dead", "show", "no-such", *where)
    assert status == 3 and "no dead task with id 'no-such'" in err
    status, out, _ = cli(capsys, "dead", "retry", store[0], *where)
    assert status == 0 and "running workers claim them now" in out
    retried = [row for row in pg.sql("SELECT id, context, lease_owner FROM {s}.pending")
               if _context(row[1]).task == "app.Mail"]
    assert len(retried) == 1 and retried[0][2] is None  # free: any worker claims it
    assert _context(retried[0][1]).attempts == 0
    status, out, _ = cli(capsys, "dead", "remove", "--all", "--exception-class", "KeyError",
                         *where, "--json")
    assert status == 0 and json.loads(out) == {"removed": 1, "missing": []}
    with Postgres(dsn=pg.dsn, schema=pg.schema) as db:
        assert [t.id for t in Operator(db).list_dead()] == [store[1]]


@pytest.mark.spec("P-7", "P-52", "P-54")
def test_stats_and_the_environment_choose_the_database(
        pg: PgSchema, store: list[str], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DEFERQ_DSN", pg.dsn)
    monkeypatch.setenv("DEFERQ_SCHEMA", pg.schema)
    status, out, _ = cli(capsys, "stats", "--json")
    assert status == 0 and json.loads(out) == {
        "schema": pg.schema, "pending_tasks": 1, "claimed_tasks": 0, "dead_tasks": 3,
        "by_task_class": {"app.Mail": 2, "app.Sms": 1},
        "by_exception_class": {"KeyError": 2, "ValueError": 1}}
    status, out, _ = cli(capsys, "stats")
    assert status == 0 and "claimed tasks" in out and "app.Mail" in out
    # --path wins over DEFERQ_DSN: the directory is the store (and there is none there).
    status, _, err = cli(capsys, "stats", "--path", str(tmp_path / "none"))
    assert status == 5 and "no storage directory" in err
    status, _, err = cli(capsys, "dead", "list", "--dsn", pg.dsn, "--path", str(tmp_path))
    assert status == 2 and "two different stores" in err
    status, _, err = cli(capsys, "verify")
    assert status == 2 and "deferq stats" in err


@pytest.mark.spec("P-7", "P-53")
def test_pending_list_shows_every_row_and_who_holds_it(
        pg: PgSchema, store: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with Postgres(dsn=pg.dsn, schema=pg.schema) as worker:
        worker.start_claiming()
        held = worker.add_task(JSON_CODEC.encode(Context("app.Mail", (9,), {}, 0)), 2_000_000_000)
        status, out, _ = cli(capsys, "pending", "list", "--dsn", pg.dsn, "--schema", pg.schema,
                             "--json")
        assert status == 0
        rows = json.loads(out)
        assert [(r["held_by"], r["publish_at"]) for r in rows] == [
            (None, None), (worker.owner, 2_000_000_000)]
        assert rows[1]["id"] == held and rows[1]["lease_until"] > 0
        assert "app.Report" in json.dumps(rows[0]["context"])
        status, out, _ = cli(capsys, "pending", "list", "--dsn", pg.dsn, "--schema", pg.schema)
        assert status == 0 and worker.owner in out and "app.Report" in out
        assert out.splitlines()[-1] == f"2 pending task(s) in schema '{pg.schema}'"


@pytest.mark.spec("P-7", "P-6", "P-4")
def test_a_wrong_dsn_or_schema_is_one_line_and_never_a_traceback(pg: PgSchema) -> None:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("DEFERQ_")}
    for args, expected in (
            (["dead", "list", "--dsn", "host=/nonexistent-dir port=1 user=x password=pw"],
             "cannot connect to PostgreSQL"),
            (["stats", "--dsn", pg.dsn, "--schema", "nothing_here"],
             "holds no deferq tables")):
        result = subprocess.run([sys.executable, "-m", "deferq", *args], env=environ,
                                capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode == 1, result
        [line] = result.stderr.splitlines()
        assert line.startswith("deferq: error: ") and expected in line
        assert "Traceback" not in result.stderr and "password=pw" not in line
        assert "PostgreSQL (" in line and "host=" in line, line  # P-6: it names the server
