"""The PostgreSQL backend's tables, their versions and migrations, and its errors
(spec/postgres.md P-1..P-6).

Rules:
- Plain SQL, no ORM. Every object lives in one PostgreSQL schema (namespace) named by the
  caller; the name is checked (``check_schema_name``) and always quoted as an identifier.
- ``schema_version`` holds one row: the version of the tables. ``MIGRATIONS[n - 1]`` takes
  the tables from version n - 1 to n; ``migrate`` applies the missing ones in one
  transaction, under an advisory lock of the schema, so two ``deferq db upgrade`` never
  interleave and a failed one changes nothing (P-3).
- A schema of a version this deferq does not know (a newer deferq made it) is refused, as
  is a schema without deferq's tables; the message says what to run (P-4, P-5).
- psycopg is imported by the functions that use it, never at load: the core keeps zero
  runtime dependencies (P-1).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Final

from deferq._core.errors import DeferqError

if TYPE_CHECKING:
    import psycopg

SCHEMA_VERSION: Final = 1
DEFAULT_SCHEMA: Final = "deferq"
NOTIFY_PREFIX: Final = "deferq_"  # + schema: the LISTEN/NOTIFY channel of new work (P-20)
_SCHEMA_NAME: Final = re.compile(r"[a-z_][a-z0-9_]{0,39}")


class PostgresError(DeferqError):
    """The PostgreSQL backend could not do what was asked: the server is unreachable, the
    connection dropped, a statement failed, or the schema is missing or of another version.

    The message says which, and what to do; the psycopg error, if any, is the ``__cause__``.
    When an add or a removal raises this, it may or may not have been committed (the
    connection dropped before the answer): at-least-once, the task may run again.
    """


def check_schema_name(schema: object) -> str:
    if not isinstance(schema, str) or not _SCHEMA_NAME.fullmatch(schema):
        raise ValueError(f"schema must be a PostgreSQL schema name of 1 to 40 characters: a "
                         f"lowercase letter or '_', then lowercase letters, digits or '_'; "
                         f"got {schema!r}")
    return schema


def _v1(s: str) -> tuple[str, ...]:
    return (
        f"""CREATE TABLE {s}.schema_version (
              singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
              version integer NOT NULL,
              changed_at timestamptz NOT NULL DEFAULT now())""",
        f"CREATE SEQUENCE {s}.task_seq",
        # P-10: a pending task; lease_owner/lease_until are its claim (P-20..P-26).
        f"""CREATE TABLE {s}.pending (
              id text PRIMARY KEY,
              seq bigint NOT NULL DEFAULT nextval('{s}.task_seq'),
              context bytea NOT NULL,
              publish_at bigint,
              lease_owner text,
              lease_until timestamptz,
              CHECK ((lease_owner IS NULL) = (lease_until IS NULL)))""",
        f"CREATE INDEX pending_due ON {s}.pending ((coalesce(publish_at, 0)), seq)",
        f"CREATE INDEX pending_owner ON {s}.pending (lease_owner) "
        f"WHERE lease_owner IS NOT NULL",
        f"CREATE SEQUENCE {s}.dead_seq",
        # P-11: a dead task; seq orders them (newest first), a re-add takes a new one.
        f"""CREATE TABLE {s}.dead (
              id text PRIMARY KEY,
              seq bigint NOT NULL DEFAULT nextval('{s}.dead_seq'),
              task_class text NOT NULL,
              attempts integer NOT NULL,
              enqueued_at bigint NOT NULL,
              failed_at bigint NOT NULL,
              exception_class text NOT NULL,
              exception_message text NOT NULL,
              backtrace text[] NOT NULL,
              context bytea NOT NULL)""",
        f"CREATE UNIQUE INDEX dead_newest ON {s}.dead (seq)",
        f"CREATE INDEX dead_by_task_class ON {s}.dead (task_class, seq)",
        f"CREATE INDEX dead_by_exception_class ON {s}.dead (exception_class, seq)",
        f"CREATE INDEX dead_by_failed_at ON {s}.dead (failed_at, seq)",
    )


# MIGRATIONS[n - 1] builds version n from version n - 1 (version 0: nothing).
MIGRATIONS: Final = (_v1,)
assert len(MIGRATIONS) == SCHEMA_VERSION


def quoted(schema: str) -> str:
    """The schema as an SQL identifier (its name is checked: no quote can be in it)."""
    return '"' + check_schema_name(schema) + '"'


def _read_version(conn: psycopg.Connection[tuple[object, ...]], schema: str) -> int | None:
    """The schema's version; None when it has no ``schema_version`` table."""
    row = conn.execute("SELECT to_regclass(%s)", (f"{quoted(schema)}.schema_version",)).fetchone()
    if row is None or row[0] is None:
        return None
    got = conn.execute(f"SELECT version FROM {quoted(schema)}.schema_version").fetchone()
    if got is None or not isinstance(got[0], int):
        raise PostgresError(f"schema {schema!r}: its schema_version table is empty; it was not "
                            f"made by deferq db init")
    return got[0]


def _refuse_newer(schema: str, version: int) -> None:
    if version > SCHEMA_VERSION:
        raise PostgresError(
            f"schema {schema!r} is at version {version}, made by a newer deferq; this deferq "
            f"knows versions up to {SCHEMA_VERSION}: upgrade deferq (nothing was changed)")


def check_version(conn: psycopg.Connection[tuple[object, ...]], schema: str) -> None:
    """Implements P-4, P-5: the schema holds deferq's tables at exactly this version."""
    version = _read_version(conn, schema)
    if version is None:
        raise PostgresError(
            f"schema {schema!r} holds no deferq tables: create them with `deferq db init "
            f"--schema {schema}` (or Postgres(..., create_schema=True))")
    _refuse_newer(schema, version)
    if version < SCHEMA_VERSION:
        raise PostgresError(
            f"schema {schema!r} is at version {version}; this deferq needs version "
            f"{SCHEMA_VERSION}: run `deferq db upgrade --schema {schema}`")


def migrate(conn: psycopg.Connection[tuple[object, ...]], schema: str, *,
            create: bool) -> tuple[int, int]:
    """Implements P-3: bring the schema to ``SCHEMA_VERSION``; (version before, after).

    ``create`` allows a schema without deferq's tables (``db init``); without it such a
    schema is refused (``db upgrade`` never creates). One transaction: all or nothing.
    """
    s = quoted(schema)
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"deferq schema {schema}",))
        version = _read_version(conn, schema)
        if version is None:
            if not create:
                raise PostgresError(f"schema {schema!r} holds no deferq tables: create them "
                                    f"with `deferq db init --schema {schema}`")
            conn.execute(f"CREATE SCHEMA IF NOT EXISTS {s}")
            before = 0
        else:
            _refuse_newer(schema, version)
            before = version
        for step in MIGRATIONS[before:]:
            for statement in step(s):
                conn.execute(statement)  # built from checked names only
        if before == 0:
            conn.execute(f"INSERT INTO {s}.schema_version (version) VALUES (%s)",
                         (SCHEMA_VERSION,))
        elif before < SCHEMA_VERSION:
            conn.execute(f"UPDATE {s}.schema_version SET version = %s, changed_at = now()",
                         (SCHEMA_VERSION,))
    return before, SCHEMA_VERSION
