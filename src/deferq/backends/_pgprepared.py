"""The PostgreSQL backend's hot statements, run through libpq itself (spec/postgres.md P-77).

Goal: the statements every task makes (an add with a new id, a removal, a claim, a
notification) cost the client as little CPU as libpq allows. psycopg's cursors cost about 50 µs
of client CPU per statement on the benchmark's machine, its libpq layer (``psycopg.pq``, a
documented interface) about 24 µs for the same prepared statement (docs/benchmarks.md,
"PostgreSQL session 10"). In one process with many threads the difference is paid under the
GIL, so it bounds what 16 producers can add.

Rules:
- Each statement is a named prepared statement (``Statement``: ``deferq_`` and a digest of its
  text), prepared on a connection the first time it runs there, with explicit parameter types
  (the server would otherwise guess ``text`` for a parameter in an ``INSERT ... SELECT`` list).
  Which names a connection has prepared is kept per connection object, so a new connection
  (after a lost one, P-50) prepares them again; a connection whose statements were dropped
  (``DEALLOCATE ALL``, which psycopg itself sends after a rollback once it has prepared
  statements of its own) answers "does not exist", and the statement is prepared and run again:
  it did not run, so this is safe even for an add.
- Parameters: ``bytes`` go as binary ``bytea``, ``int``, ``float`` and ``str`` as text, None as
  NULL. Results come back in binary: ``text`` as UTF-8, ``bigint`` as 8 bytes big-endian.
- Only for statements in autocommit mode, one at a time on the connection (the caller holds the
  session's lock).
- A statement that fails raises the psycopg error of its SQLSTATE (``psycopg.errors.lookup``),
  or ``OperationalError`` when the connection failed, so the session's handling (P-6, P-47,
  P-50) is the same as for a statement run through psycopg's cursors.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from typing import TYPE_CHECKING, Final, NamedTuple

if TYPE_CHECKING:
    import psycopg
    from psycopg import pq

BYTEA: Final = 17
INT8: Final = 20
TEXT: Final = 25
FLOAT8: Final = 701
TEXT_FORMAT: Final = 0
BINARY_FORMAT: Final = 1
NO_SUCH_STATEMENT: Final = b"26000"  # SQLSTATE invalid_sql_statement_name

Param = bytes | int | float | str | None


class Statement(NamedTuple):
    """One named statement: its name on the server, its text, its parameters' type OIDs."""

    name: bytes
    sql: bytes
    types: tuple[int, ...]


def statement(sql: str, types: tuple[int, ...], *, named: bool = True) -> Statement:
    """The statement ``sql`` (parameters ``$1``, ``$2``, ...) under a name made from its text,
    or unnamed (``named=False``: parsed and planned at each run, never kept on the server)."""
    text = sql.encode()
    if not named:
        return Statement(b"", text, types)
    digest = hashlib.blake2s(text + repr(types).encode(), digest_size=10).hexdigest()
    return Statement(b"deferq_" + digest.encode(), text, types)


# Which statements each live connection has prepared (a new connection starts with none).
_prepared: weakref.WeakKeyDictionary[object, set[bytes]] = weakref.WeakKeyDictionary()
_prepared_lock = threading.Lock()


def run(conn: psycopg.Connection[tuple[object, ...]], stmt: Statement,
        params: tuple[Param, ...]) -> pq.abc.PGresult:
    """Run ``stmt`` with ``params`` on ``conn``; its result (``TUPLES_OK`` or ``COMMAND_OK``)."""
    from psycopg import pq
    pgconn = conn.pgconn
    names: set[bytes] = set()
    if stmt.name:
        with _prepared_lock:
            names = _prepared.setdefault(conn, names)
        if stmt.name not in names:
            _prepare(pgconn, stmt, names)
    values: list[bytes | None] = []
    formats: list[int] = []
    for p in params:
        if p is None or isinstance(p, bytes):
            values.append(p)
            formats.append(BINARY_FORMAT)
        else:
            values.append(str(p).encode())
            formats.append(TEXT_FORMAT)
    if not stmt.name:
        res = pgconn.exec_params(stmt.sql, values, stmt.types, formats, BINARY_FORMAT)
    else:
        res = _exec_named(pgconn, stmt, values, formats)
        if (res.status == pq.ExecStatus.FATAL_ERROR
                and res.error_field(pq.DiagnosticField.SQLSTATE) == NO_SUCH_STATEMENT):
            # The connection lost its prepared statements: psycopg sends DEALLOCATE ALL
            # after a rollback once it prepared statements of its own, and so may anyone
            # with DISCARD ALL. Nothing ran, so even an add is safe to run again.
            names.clear()
            _prepare(pgconn, stmt, names)
            res = _exec_named(pgconn, stmt, values, formats)
    if res.status not in (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK):
        raise _error(pgconn, res)
    return res


def _exec_named(pgconn: pq.abc.PGconn, stmt: Statement, values: list[bytes | None],
                formats: list[int]) -> pq.abc.PGresult:
    # libpq takes None as NULL here as in exec_params; psycopg's stub leaves None out.
    return pgconn.exec_prepared(stmt.name, values, formats,  # type: ignore[arg-type]
                                BINARY_FORMAT)


def _prepare(pgconn: pq.abc.PGconn, stmt: Statement, names: set[bytes]) -> None:
    from psycopg import pq
    res = pgconn.prepare(stmt.name, stmt.sql, stmt.types)
    if res.status != pq.ExecStatus.COMMAND_OK:
        raise _error(pgconn, res)
    names.add(stmt.name)


def _error(pgconn: pq.abc.PGconn, res: pq.abc.PGresult) -> psycopg.Error:
    """The error psycopg raises for a failed result: the class of its SQLSTATE, its message;
    ``OperationalError`` when the connection failed (no SQLSTATE)."""
    import psycopg
    from psycopg import errors, pq
    if res.error_field(pq.DiagnosticField.SQLSTATE) is None:
        raw = res.error_message or pgconn.error_message or b"the connection failed"
        return psycopg.OperationalError(raw.decode("utf-8", "replace").strip())
    return errors.error_from_result(res)


def text(value: bytes | None) -> str:
    """A ``text`` column's binary value."""
    assert value is not None
    return value.decode()


def int8(value: bytes | None) -> int | None:
    """A ``bigint`` column's binary value (None for NULL)."""
    return None if value is None else int.from_bytes(value, "big", signed=True)
