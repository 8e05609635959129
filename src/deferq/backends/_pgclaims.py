"""The PostgreSQL backend's pending-task statements: adds, removals and claims
(spec/postgres.md P-10, P-16..P-18, P-20..P-27).

Rules:
- One statement each, in autocommit mode (its own transaction, READ COMMITTED): when it
  returns, the commit is durable on the server (``synchronous_commit`` on, P-16).
- A task a running queue adds is claimed by that queue's backend at once (``owner``), so no
  other worker takes it while this one has it scheduled (P-72); a task added with ``owner``
  None (a producer that runs no queue) is free, and once its insert committed a NOTIFY in a
  transaction of its own, committed without waiting for its WAL flush, wakes the idle
  workers (P-73). Why not in the insert's transaction: PostgreSQL holds a database-wide lock
  from a notifying transaction's pre-commit until its end, WAL flush included, so notifying
  inserts commit one at a time and lose group commit (16 producers ran at 1.8-2.4x the
  floor). A notification is a hint (idle workers poll every ``poll_seconds`` anyway, P-27),
  so its own commit need not be durable and holds that lock for microseconds.
- The add of a new id, the removal, the claim and the notification run as named prepared
  statements through libpq (``_pgprepared``, P-77): every task makes them.
- A claim takes due, free tasks (no owner, or an expired lease) with ``FOR UPDATE SKIP
  LOCKED``: two concurrent claims never return the same task, and neither waits for the
  other (P-22). Leases are timed by the server's clock; ``publish_at`` is compared with the
  server's clock too (P-24).
- Owner fencing (P-41): a worker that claims passes its ``owner`` to a removal and a re-add by
  id; the statement then leaves alone a task another worker holds under a live lease, so a
  worker that stalled past its lease and resumes cannot delete, or take back, a task that
  someone else is now running. The condition is in the statement's own WHERE, which
  PostgreSQL re-checks on the row's newest version after waiting for a concurrent claim.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Final, NamedTuple

from deferq._core.types import PendingTask
from deferq.backends import _pgprepared as prep
from deferq.backends._pgprepared import BYTEA, FLOAT8, INT8, TEXT, Statement, statement

if TYPE_CHECKING:
    import psycopg

_NOW_S = "floor(extract(epoch from now()))::bigint"
# P-45: inserts of a new id tried before the add fails (each taken id costs one more).
NEW_ID_ATTEMPTS: Final = 8
# P-77: claims of at most this many tasks are prepared (a queue claims at most 64, Q-227).
PREPARED_CLAIM_MAX: Final = 64
UNIQUE_VIOLATION: Final = "23505"  # the SQLSTATE of a taken primary key
# P-41: the row is not held by another worker under a live lease (``{owner}``: the parameter
# that stands for the caller, ``%(owner)s`` through psycopg, ``$2`` in a prepared removal).
FREE_FOR = "(p.lease_owner IS NULL OR p.lease_owner = {owner} OR p.lease_until < now())"


def _pending_of(row: tuple[object, ...]) -> PendingTask:
    tid, context, publish_at = row
    assert isinstance(tid, str) and isinstance(context, bytes)
    assert publish_at is None or isinstance(publish_at, int)
    return PendingTask(tid, context, publish_at)


def add(conn: psycopg.Connection[tuple[object, ...]], s: str, context: bytes,
        publish_at: int | None, task_id: str | None, owner: str | None,
        lease_s: float) -> str | None:
    """Implements P-17, P-72, P-41: insert a task (a new id from the server) or replace
    ``task_id``'s; None when ``owner`` is fenced off (another worker's live lease holds it)."""
    if task_id is None:
        return _add_new(conn, s, context, publish_at, owner, lease_s)
    fence = "" if owner is None else " WHERE " + FREE_FOR.format(owner="%(owner)s")
    lease = "NULL" if owner is None else "now() + make_interval(secs => %(lease)s)"
    row = conn.execute(
        f"""INSERT INTO {s}.pending AS p (id, context, publish_at, lease_owner, lease_until)
            VALUES (%(id)s, %(context)s, %(publish_at)s, %(owner)s, {lease})
            ON CONFLICT (id) DO UPDATE SET context = EXCLUDED.context,
              publish_at = EXCLUDED.publish_at, lease_owner = EXCLUDED.lease_owner,
              lease_until = EXCLUDED.lease_until{fence}
            RETURNING id""",
        {"id": task_id, "context": context, "publish_at": publish_at, "owner": owner,
         "lease": lease_s}).fetchone()
    if row is None:
        return None
    assert isinstance(row[0], str)
    return row[0]


def _add_new(conn: psycopg.Connection[tuple[object, ...]], s: str, context: bytes,
             publish_at: int | None, owner: str | None, lease_s: float) -> str:
    """Implements P-12, P-45: insert a task under a new id, ``{epoch second}-{n}`` with *n*
    its ``seq`` (one ``nextval``); an id already taken (a task added under a chosen id of the
    same form) is never replaced: the insert fails and is made again with the next *n*.

    A plain INSERT, not an upsert: no conflict is expected, and one ``nextval`` instead of
    two made a single producer's add 8 % faster (docs/benchmarks.md, PostgreSQL session 7).
    """
    held = owner is not None  # P-72: a claiming backend's add is held by it at once
    stmt = _new_id_statement(s, held)
    params: tuple[prep.Param, ...] = ((context, publish_at, owner, lease_s) if held
                                      else (context, publish_at))
    for attempt in range(1, NEW_ID_ATTEMPTS + 1):
        try:
            res = prep.run(conn, stmt, params)
        except Exception as exc:
            if getattr(exc, "sqlstate", None) != UNIQUE_VIOLATION or attempt == NEW_ID_ATTEMPTS:
                raise
            continue  # P-45: that id is a chosen one; the next n is another id
        return prep.text(res.get_value(0, 0))
    raise AssertionError("unreachable")


@functools.lru_cache(maxsize=64)
def _new_id_statement(s: str, held: bool) -> Statement:
    """The new-id insert of schema ``s`` (held: with the adding backend's lease), built once:
    every add of a producer runs it (P-77)."""
    return statement(
        f"INSERT INTO {s}.pending (id, seq, context, publish_at"
        f"{', lease_owner, lease_until' if held else ''}) "
        f"SELECT {_NOW_S}::text || '-' || n, n, $1, $2"
        f"{', $3, now() + make_interval(secs => $4)' if held else ''} "
        f"FROM nextval('{s}.task_seq') AS n RETURNING id",
        (BYTEA, INT8, TEXT, FLOAT8) if held else (BYTEA, INT8))


def notify(conn: psycopg.Connection[tuple[object, ...]], channel: str) -> None:
    """Implements P-73: wake the idle workers, in a transaction committed asynchronously."""
    prep.run(conn, _NOTIFY, (channel,))


_NOTIFY = statement("SELECT set_config('synchronous_commit', 'off', true), pg_notify($1, '')",
                    (TEXT,))


def remove(conn: psycopg.Connection[tuple[object, ...]], s: str, task_id: str,
           owner: str | None) -> bool:
    """Implements P-18, P-41: delete the task (with ``owner``: unless another worker holds it
    under a live lease); whether a row was deleted."""
    params = (task_id,) if owner is None else (task_id, owner)
    return prep.run(conn, _remove_statement(s, owner is not None), params).command_tuples != 0


@functools.lru_cache(maxsize=64)
def _remove_statement(s: str, fenced: bool) -> Statement:
    if not fenced:
        return statement(f"DELETE FROM {s}.pending AS p WHERE p.id = $1", (TEXT,))
    return statement(f"DELETE FROM {s}.pending AS p WHERE p.id = $1 AND "
                     + FREE_FOR.format(owner="$2"), (TEXT, TEXT))


def held(conn: psycopg.Connection[tuple[object, ...]], s: str, owner: str) -> list[PendingTask]:
    """The tasks ``owner`` holds, oldest first (P-25)."""
    rows = conn.execute(f"SELECT id, context, publish_at FROM {s}.pending "
                        f"WHERE lease_owner = %s ORDER BY seq", (owner,)).fetchall()
    return [_pending_of(row) for row in rows]


def claim(conn: psycopg.Connection[tuple[object, ...]], s: str, owner: str, limit: int,
          lease_s: float) -> list[PendingTask]:
    """Implements P-22..P-24, P-76: claim up to ``limit`` due, free tasks, in publish order.

    The limit is written into the statement, not passed as a parameter: once a statement is
    prepared (P-77), PostgreSQL may plan it once for any ``LIMIT $1``, and that generic
    plan made a claim of one task 1.35x slower (0.36 ms against 0.27 ms on the benchmark's
    server). Each limit is one prepared statement; a queue uses at most 64 (Q-227).
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be an int >= 1, got {limit!r}")
    res = prep.run(conn, _claim_statement(s, limit), (owner, lease_s))
    rows = [(prep.text(res.get_value(i, 0)), res.get_value(i, 1), prep.int8(res.get_value(i, 2)),
             prep.int8(res.get_value(i, 3))) for i in range(res.ntuples)]
    rows.sort(key=lambda row: (row[2] or 0, row[3] or 0))
    return [_pending_of(row[:3]) for row in rows]


@functools.lru_cache(maxsize=256)
def _claim_statement(s: str, limit: int) -> Statement:
    """The claim of ``limit`` tasks; prepared (P-77) up to ``PREPARED_CLAIM_MAX``, so that a
    caller passing ever new limits never fills the server with prepared statements."""
    return statement(
        f"""WITH due AS (
              SELECT id FROM {s}.pending
              WHERE coalesce(publish_at, 0) <= {_NOW_S}
                AND (lease_owner IS NULL OR lease_until < now())
              ORDER BY coalesce(publish_at, 0), seq
              LIMIT {limit:d}
              FOR UPDATE SKIP LOCKED)
            UPDATE {s}.pending AS p
            SET lease_owner = $1, lease_until = now() + make_interval(secs => $2)
            FROM due WHERE p.id = due.id
            RETURNING p.id, p.context, p.publish_at, p.seq""", (TEXT, FLOAT8),
        named=limit <= PREPARED_CLAIM_MAX)


def renew(conn: psycopg.Connection[tuple[object, ...]], s: str, owner: str, ids: list[str],
          lease_s: float) -> set[str]:
    """Implements P-25: extend the leases of ``ids`` that ``owner`` still holds; those ids."""
    rows = conn.execute(
        f"UPDATE {s}.pending SET lease_until = now() + make_interval(secs => %s) "
        f"WHERE lease_owner = %s AND id = ANY(%s) RETURNING id", (lease_s, owner, ids)).fetchall()
    return {str(row[0]) for row in rows}


def release(conn: psycopg.Connection[tuple[object, ...]], s: str, channel: str,
            owner: str) -> int:
    """Implements P-26: give back every task ``owner`` holds, and wake the idle workers."""
    row = conn.execute(
        f"""WITH freed AS (
              UPDATE {s}.pending SET lease_owner = NULL, lease_until = NULL
              WHERE lease_owner = %s RETURNING 1)
            SELECT (SELECT count(*) FROM freed), pg_notify('{channel}', '')""", (owner,)).fetchone()
    assert row is not None and isinstance(row[0], int)
    return row[0]


class PendingRow(NamedTuple):
    """A pending task as ``deferq pending list`` shows it: who holds it, and until when."""

    task: PendingTask
    held_by: str | None
    lease_until: int | None  # epoch second; in the past: expired, any worker may claim it


def listing(conn: psycopg.Connection[tuple[object, ...]], s: str) -> list[PendingRow]:
    """Every pending task, in due order (P-7's ``pending list``)."""
    rows = conn.execute(
        f"SELECT id, context, publish_at, lease_owner, "
        f"floor(extract(epoch from lease_until))::bigint FROM {s}.pending "
        f"ORDER BY coalesce(publish_at, 0), seq").fetchall()
    out = []
    for row in rows:
        owner, until = row[3], row[4]
        assert owner is None or isinstance(owner, str)
        assert until is None or isinstance(until, int)
        out.append(PendingRow(_pending_of(row[:3]), owner, until))
    return out


def count_pending(conn: psycopg.Connection[tuple[object, ...]], s: str) -> tuple[int, int]:
    """(pending tasks, of which claimed by a live lease) for ``deferq stats``."""
    row = conn.execute(f"SELECT count(*), count(*) FILTER (WHERE lease_until >= now()) "
                       f"FROM {s}.pending").fetchone()
    assert row is not None and isinstance(row[0], int) and isinstance(row[1], int)
    return row[0], row[1]
