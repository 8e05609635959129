"""The PostgreSQL backend's dead-task statements (spec/postgres.md P-11, P-13, P-30..P-33).

Rules:
- Each function is one statement or one transaction on a connection in autocommit mode;
  the caller holds the connection's lock and turns psycopg errors into ``PostgresError``.
- The give-up handoff is one transaction: the dead task is inserted (or replaces the one of
  the same id) and the pending task is deleted, both or neither (P-30).
- Owner fencing (P-41): with an ``owner`` (a worker that claims), the handoff first locks the
  pending row (``FOR UPDATE``, so no claim can take it until the commit) and does nothing
  when another worker holds it under a live lease.
- ``probe`` (tests only, P-43) is called before each statement of the handoff and before its
  commit, with the step's name and the session's server process id.
- Listing is newest first by ``seq`` (an index scan), filtered by exact task class,
  exception class and a ``failed_at`` range on their own indexes (P-32).
- PostgreSQL text cannot hold NUL: a NUL in a dead task's text is stored as the four
  characters ``\\x00`` (P-13), the way the file store escapes lone surrogates (F-17).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from deferq._core.types import DeadTask, dead_task_of

if TYPE_CHECKING:
    import psycopg

_COLUMNS = ("id, task_class, attempts, enqueued_at, failed_at, exception_class, "
            "exception_message, backtrace, context")


def _text(value: str) -> str:
    return value.replace("\x00", "\\x00") if "\x00" in value else value


Probe = Callable[[str, int], None]


def add_dead(conn: psycopg.Connection[tuple[object, ...]], s: str, task: DeadTask,
             owner: str | None, probe: Probe | None = None) -> bool:
    """Implements P-30, P-41: insert the dead task and delete the pending one in one
    transaction; False (nothing changed) when ``owner`` is fenced off."""
    pid = conn.info.backend_pid

    def step(name: str) -> None:
        if probe is not None:
            probe(name, pid)

    with conn.transaction():
        step("begin")
        if owner is not None:
            row = conn.execute(f"SELECT lease_owner IS NOT NULL AND lease_owner <> %s AND "
                               f"lease_until >= now() FROM {s}.pending WHERE id = %s "
                               f"FOR UPDATE", (owner, task.id)).fetchone()
            if row is not None and row[0] is True:
                return False
            step("locked")
        conn.execute(
            f"""INSERT INTO {s}.dead ({_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)
                ON CONFLICT (id) DO UPDATE SET seq = nextval('{s}.dead_seq'),
                  task_class = EXCLUDED.task_class, attempts = EXCLUDED.attempts,
                  enqueued_at = EXCLUDED.enqueued_at, failed_at = EXCLUDED.failed_at,
                  exception_class = EXCLUDED.exception_class,
                  exception_message = EXCLUDED.exception_message,
                  backtrace = EXCLUDED.backtrace, context = EXCLUDED.context""",
            (task.id, _text(task.task_class), task.attempts, task.enqueued_at, task.failed_at,
             _text(task.exception_class), _text(task.exception_message),
             [_text(frame) for frame in task.backtrace], task.context))
        step("inserted")
        conn.execute(f"DELETE FROM {s}.pending WHERE id = %s", (task.id,))
        step("deleted")  # the commit follows
    return True


def _dead_of(row: Sequence[object]) -> DeadTask:
    tid, task_class, attempts, enqueued_at, failed_at, exc_class, message, trace, context = row
    assert isinstance(tid, str) and isinstance(task_class, str) and isinstance(attempts, int)
    assert isinstance(enqueued_at, int) and isinstance(failed_at, int)
    assert isinstance(exc_class, str) and isinstance(message, str)
    assert isinstance(trace, list) and isinstance(context, bytes)
    return dead_task_of(tid, task_class, attempts, enqueued_at, failed_at, exc_class, message,
                        tuple(str(frame) for frame in trace), context)


def list_dead(conn: psycopg.Connection[tuple[object, ...]], s: str, *, limit: int | None,
              offset: int, task_class: str | None = None, exception_class: str | None = None,
              failed_from: int | None = None, failed_until: int | None = None
              ) -> list[DeadTask]:
    """Implements P-31, P-32: newest first, filtered, then ``offset`` and ``limit``."""
    where: list[str] = []
    params: list[object] = []
    for column, value, op in (("task_class", task_class, "="),
                              ("exception_class", exception_class, "="),
                              ("failed_at", failed_from, ">="), ("failed_at", failed_until, "<")):
        if value is not None:
            where.append(f"{column} {op} %s")
            params.append(_text(value) if isinstance(value, str) else value)
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    params.extend([limit, offset])
    rows = conn.execute(f"SELECT {_COLUMNS} FROM {s}.dead {clause} ORDER BY seq DESC "
                        f"LIMIT %s OFFSET %s", params).fetchall()
    return [_dead_of(row) for row in rows]


def find_dead(conn: psycopg.Connection[tuple[object, ...]], s: str,
              task_id: str) -> DeadTask | None:
    row = conn.execute(f"SELECT {_COLUMNS} FROM {s}.dead WHERE id = %s", (task_id,)).fetchone()
    return None if row is None else _dead_of(row)


def remove_dead(conn: psycopg.Connection[tuple[object, ...]], s: str, ids: set[str]) -> int:
    """Implements P-33: one statement; the number of distinct ids that were there."""
    if not ids:
        return 0
    cur = conn.execute(f"DELETE FROM {s}.dead WHERE id = ANY(%s)", (sorted(ids),))
    return cur.rowcount


def counts_by(conn: psycopg.Connection[tuple[object, ...]], s: str,
              column: str) -> dict[str, int]:
    """Dead tasks per value of ``column`` (``task_class`` or ``exception_class``), most first."""
    assert column in ("task_class", "exception_class")
    rows = conn.execute(f"SELECT {column}, count(*) FROM {s}.dead GROUP BY {column} "
                        f"ORDER BY count(*) DESC, {column}").fetchall()
    return {str(name): int(str(n)) for name, n in rows}
