"""The ``Postgres`` backend: pending and dead tasks in a PostgreSQL database that several
workers on several hosts share (spec/postgres.md).

Rules:
- It implements ``Backend`` and ``DeadTaskAdmin`` with ``Disk``'s argument checks (C-7),
  and ``ClaimingBackend`` (C-29..C-32): a running queue claims due tasks from the shared
  table, renews its leases, and wakes on LISTEN/NOTIFY (``_runtime/claimer.py``).
- Every write is one transaction, committed before the method returns: durable on the
  server when it returns (P-16). ``sync`` flags are accepted and change nothing.
- psycopg 3 is imported only when a ``Postgres`` is made (P-1); a missing psycopg is a
  ``PostgresError`` saying what to install.
- One connection for the statements and one for LISTEN (``_pgconn``): a dropped connection
  makes the call raise ``PostgresError`` and the next call connects again; reads and
  idempotent writes are tried once more on a fresh connection first (P-6).
- The backend remembers which tasks it holds (claimed or added while claiming); a
  heartbeat renews only those, so a task claimed by a statement whose answer was lost
  expires and is taken by another worker rather than held forever (P-25).
- While it claims, its removals, re-adds by id and give-ups are fenced by its owner (P-41):
  a task another worker holds under a live lease is left as it is, so a worker that stalled
  past its lease cannot undo the new holder's claim.
"""

from __future__ import annotations

import logging
import math
import socket
import threading
import time
import uuid
from collections.abc import Iterable
from types import TracebackType
from typing import TYPE_CHECKING

from deferq._core.errors import StorageClosedError
from deferq._core.taskid import check_task_id
from deferq._core.types import DeadTask, PendingTask
from deferq.backends import _pgclaims, _pgdead
from deferq.backends._arguments import (
    check_context,
    check_dead_task,
    check_ids,
    check_page,
    check_publish_at,
)
from deferq.backends._deadtask import dead_task_for
from deferq.backends._pgconn import (
    DEFAULT_TIMEOUT_S,
    Listener,
    Session,
    Watchdog,
    dsn_parts,
    require_psycopg,
)
from deferq.backends._pgnotify import Notifier
from deferq.backends._pgschema import (
    DEFAULT_SCHEMA,
    NOTIFY_PREFIX,
    PostgresError,
    check_schema_name,
    check_version,
    migrate,
    quoted,
)

if TYPE_CHECKING:
    import psycopg

__all__ = ["Postgres", "PostgresError", "migrate_schema"]

log = logging.getLogger("deferq.postgres")


def _seconds(name: str, value: object, low: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
            value) or value < low:
        raise ValueError(f"{name} must be a number of seconds >= {low}, got {value!r}")
    return float(value)


def migrate_schema(dsn: str, schema: str, *, create: bool,
                   timeout_seconds: float = DEFAULT_TIMEOUT_S) -> tuple[int, int]:
    """Implements P-3 for ``deferq db init`` (``create``) and ``db upgrade``: (before, after).

    Its statements are watched like a backend's (P-47).
    """
    check_schema_name(schema)
    watchdog = Watchdog(_seconds("timeout_seconds", timeout_seconds, 1.0))
    session = Session(dsn, schema, watchdog)
    try:
        return session.run("create or upgrade the tables",
                           lambda conn: migrate(conn, schema, create=create))
    finally:
        session.close()
        watchdog.close()


class Postgres:
    """Pending and dead tasks in PostgreSQL, shared by every worker that connects (P-10..).

    Args:
        dsn: a libpq connection string or URI.
        schema: the PostgreSQL schema holding deferq's tables (``deferq db init``).
        lease_seconds: how long a claim lasts without a heartbeat (P-23); the queue renews
            it every third of that.
        poll_seconds: the longest an idle queue waits for a NOTIFY before it looks (P-27).
        create_schema: create or upgrade the tables if needed (what ``deferq db init`` does).
        timeout_seconds: how long a statement may go unanswered before its connection is
            cut and the call fails (P-47); connecting is bounded by the DSN's
            ``connect_timeout``, else 10 s (P-49).
    """

    def __init__(self, *, dsn: str, schema: str = DEFAULT_SCHEMA, lease_seconds: float = 30.0,
                 poll_seconds: float = 2.0, create_schema: bool = False,
                 timeout_seconds: float = DEFAULT_TIMEOUT_S) -> None:
        require_psycopg()
        if not isinstance(dsn, str) or not dsn.strip():
            raise ValueError("dsn must be a non-empty libpq connection string, got "
                             f"{repr(dsn) if isinstance(dsn, str) else 'a ' + type(dsn).__name__}")
        self.schema = check_schema_name(schema)
        self.lease_seconds = _seconds("lease_seconds", lease_seconds, 1.0)
        self.poll_seconds = _seconds("poll_seconds", poll_seconds, 0.01)
        self.timeout_seconds = _seconds("timeout_seconds", timeout_seconds, 1.0)  # P-48
        if create_schema is not True and create_schema is not False:
            raise ValueError(f"create_schema must be a bool, got {create_schema!r}")
        dsn_parts(dsn)  # Implements P-46: an unparsable DSN is refused, quoting none of it
        self._dsn = dsn
        self._s = quoted(schema)
        self._channel = NOTIFY_PREFIX + schema
        self.owner = f"{socket.gethostname()[:40]}/{uuid.uuid4().hex[:16]}"
        self._lock = threading.Lock()  # of the state below; the connections have their own
        self._watchdog = Watchdog(self.timeout_seconds)  # Implements P-47, for both
        self._session = Session(dsn, schema, self._watchdog)
        self._do = self._session.run
        self._listener = Listener(dsn, self._channel, self._watchdog)
        self._held: set[str] = set()
        self._claiming = False
        self._closed = False
        self._written = 0
        self._give_up_probe: _pgdead.Probe | None = None  # tests only (P-43)
        # P-73, P-74: a producer's adds wake idle workers, at most once per interval.
        self._notifier = Notifier(lambda: self._do(
            "notify the workers", lambda c: _pgclaims.notify(c, self._channel)))
        try:
            if create_schema:
                self._do("create the schema", lambda c: migrate(c, schema, create=True))
            else:
                self._do("check the schema", lambda c: check_version(c, schema), retry=True)
        except BaseException:
            self.close()
            raise

    @property
    def group_commit(self) -> bool:
        return False

    # --- pending tasks
    def add_task(self, context: bytes, publish_at: int | None = None,
                 task_id: str | None = None, *, sync: bool = True) -> str:
        data = check_context(context)
        when = check_publish_at(publish_at)
        tid = None if task_id is None else check_task_id(task_id)
        if sync is not True and sync is not False:
            raise ValueError(f"sync must be a bool, not {type(sync).__name__}")
        owner = self.owner if self._claiming else None
        try:
            added = self._do("add a task", lambda c: _pgclaims.add(
                c, self._s, data, when, tid, owner, self.lease_seconds),
                retry=tid is not None)
        except PostgresError:
            self._let_go(tid)
            raise
        if added is None:  # P-41: another worker holds it under a live lease; it is theirs
            assert tid is not None
            self._let_go(tid)
            return tid
        with self._lock:
            self._written += 1
            if owner is not None:
                self._held.add(added)
        if owner is None:
            self._notifier.added()  # P-73: after the add committed
        return added

    def remove_task(self, task_id: str, *, sync: bool = True) -> None:
        tid = check_task_id(task_id)
        if sync is not True and sync is not False:
            raise ValueError(f"sync must be a bool, not {type(sync).__name__}")
        self._remove(tid)

    def remove_held(self, task_id: str) -> bool:
        """Implements C-36: ``remove_task``, saying whether a task was removed (False when
        another worker holds it under a live lease, P-41, or it is gone)."""
        return self._remove(check_task_id(task_id))

    def _remove(self, tid: str) -> bool:
        owner = self.owner if self._claiming else None
        try:
            removed = self._do("remove a task", lambda c: _pgclaims.remove(
                c, self._s, tid, owner), retry=True)
        except PostgresError:
            self._let_go(tid)
            raise
        with self._lock:
            if removed:
                self._written += 1
            self._held.discard(tid)
        return removed

    def _let_go(self, task_id: str | None) -> None:
        """Implements P-25 for a task that is done here, or whose removal, re-add or give-up
        failed: the queue no longer has it scheduled, so its lease is left to expire and the
        task runs again on some worker (at-least-once), instead of being renewed forever."""
        if task_id is not None:
            with self._lock:
                self._held.discard(task_id)

    def pending_tasks(self) -> list[PendingTask]:
        """The tasks this backend holds (claimed or added by it), oldest first (P-25)."""
        tasks = self._do("list held tasks", lambda c: _pgclaims.held(c, self._s, self.owner),
                         retry=True)
        with self._lock:
            self._held.update(t.task_id for t in tasks)
        return tasks

    def written_ticket(self) -> int:
        with self._lock:
            self._check_open()
            return self._written

    def sync_through(self, ticket: int) -> None:
        if isinstance(ticket, bool) or not isinstance(ticket, int) or ticket < 0:
            raise ValueError(f"ticket must be an int >= 0 from written_ticket(), got {ticket!r}")
        self._check_open()

    def sync(self) -> None:
        self._check_open()  # every write was committed before it returned (P-16)

    # --- claims (ClaimingBackend, C-29..C-32)
    def start_claiming(self) -> None:
        """Implements C-29: from now on the tasks this backend adds are held by it."""
        self._check_open()
        self._claiming = True

    def claim_due(self, limit: int) -> list[PendingTask]:
        """Implements C-30, P-22: claim up to ``limit`` due tasks no live worker holds."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be an int >= 1, got {limit!r}")
        tasks = self._do("claim due tasks", lambda c: _pgclaims.claim(
            c, self._s, self.owner, limit, self.lease_seconds))
        with self._lock:
            self._held.update(t.task_id for t in tasks)
        return tasks

    def renew_claims(self) -> int:
        """Implements C-30, P-25: extend the leases of the tasks held; how many still are."""
        with self._lock:
            held = sorted(self._held)
        if not held:
            return 0
        kept = self._do("renew leases", lambda c: _pgclaims.renew(
            c, self._s, self.owner, held, self.lease_seconds), retry=True)
        with self._lock:
            lost = set(held) - kept
            self._held -= lost
        return len(kept)

    def release_claims(self) -> int:
        """Implements C-31, P-26: stop claiming; give back every task held, waking workers."""
        self._claiming = False
        with self._lock:
            self._held.clear()
        return self._do("release leases", lambda c: _pgclaims.release(
            c, self._s, self._channel, self.owner), retry=True)

    def wait_for_tasks(self, timeout: float) -> bool:
        """Implements C-32, P-27: block until a NOTIFY of new work, ``wake`` or ``timeout`` s.

        True when a notification came.
        """
        wait_s = _seconds("timeout", timeout, 0.0)
        self._check_open()
        return self._listener.wait(wait_s)

    def wake(self) -> None:
        """Make a ``wait_for_tasks`` in progress (or the next one) return at once."""
        self._listener.wake()

    # --- dead tasks
    def add_dead_task(self, task_id: str, context: bytes, exception: BaseException, *,
                      task_class: str, attempts: int, enqueued_at: int | None = None) -> str:
        """Implements P-30, P-41: insert the dead task and delete the pending one, atomically;
        while claiming, nothing when another worker holds the task under a live lease.

        ``enqueued_at`` is when the task was first enqueued (C-23, F-17).
        """
        tid, data, error, name, count, first = check_dead_task(
            task_id, context, exception, task_class, attempts, enqueued_at)
        task = dead_task_for(tid, data, error, name, count, int(time.time()), first)
        owner = self.owner if self._claiming else None
        probe = self._give_up_probe
        try:
            done = self._do("add a dead task", lambda c: _pgdead.add_dead(
                c, self._s, task, owner, probe), retry=True)
        finally:
            self._let_go(tid)
        if not done:
            log.warning("task %s was not dead-lettered: its lease ran out and another worker "
                        "now holds it and decides its fate (P-41)", tid)
        return tid

    def list_dead_tasks(self, *, limit: int | None = None, offset: int = 0,
                        task_class: str | None = None, exception_class: str | None = None,
                        failed_from: int | None = None,
                        failed_until: int | None = None) -> list[DeadTask]:
        """Dead tasks newest first; optionally only those of a task class, an exception class,
        or failed in ``[failed_from, failed_until)`` (epoch seconds) (P-31, P-32)."""
        lim, off = check_page(limit, offset)
        for name, text in (("task_class", task_class), ("exception_class", exception_class)):
            if text is not None and not isinstance(text, str):
                raise ValueError(f"{name} must be a str or None, not {type(text).__name__}")
        for name, second in (("failed_from", failed_from), ("failed_until", failed_until)):
            if second is not None and (isinstance(second, bool) or not isinstance(second, int)):
                raise ValueError(f"{name} must be an int (epoch seconds) or None, got {second!r}")
        return self._do("list dead tasks", lambda c: _pgdead.list_dead(
            c, self._s, limit=lim, offset=off, task_class=task_class,
            exception_class=exception_class, failed_from=failed_from,
            failed_until=failed_until), retry=True)

    def list_dead_tasks_where(self, *, limit: int | None, offset: int, task_class: str | None,
                              exception_class: str | None) -> list[DeadTask]:
        """``DeadTaskFilters``: what the operator's filtered listing uses (P-32)."""
        return self.list_dead_tasks(limit=limit, offset=offset, task_class=task_class,
                                    exception_class=exception_class)

    def find_dead_task(self, task_id: str) -> DeadTask | None:
        tid = check_task_id(task_id)
        return self._do("find a dead task", lambda c: _pgdead.find_dead(c, self._s, tid),
                        retry=True)

    def remove_dead_tasks(self, ids: str | Iterable[str] | None) -> int:
        wanted = check_ids(ids)
        return self._do("remove dead tasks", lambda c: _pgdead.remove_dead(c, self._s, wanted),
                        retry=True)

    def list_pending(self) -> list[_pgclaims.PendingRow]:
        """Every pending task of the schema, whoever holds it, in due order (``pending list``)."""
        return self._do("list pending tasks", lambda c: _pgclaims.listing(c, self._s),
                        retry=True)

    def stats(self) -> dict[str, object]:
        """Pending tasks, those under a live lease, and dead tasks by task and exception class,
        in one REPEATABLE READ snapshot (``deferq stats``)."""
        def work(conn: psycopg.Connection[tuple[object, ...]]) -> dict[str, object]:
            with conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
                pending, claimed = _pgclaims.count_pending(conn, self._s)
                by_task = _pgdead.counts_by(conn, self._s, "task_class")
                by_exception = _pgdead.counts_by(conn, self._s, "exception_class")
            return {"pending_tasks": pending, "claimed_tasks": claimed,
                    "dead_tasks": sum(by_task.values()), "by_task_class": by_task,
                    "by_exception_class": by_exception}
        return self._do("count tasks", work, retry=True)

    # --- lifecycle
    def close(self) -> None:
        """Give back the tasks held (P-26), then close both connections; idempotent."""
        if self._closed:
            return
        if self._claiming or self._held:
            try:
                self.release_claims()
            except PostgresError:
                pass  # unreachable: the leases expire on their own (P-23)
        self._notifier.close()  # P-74: one still owed goes out before the connection closes
        self._closed = True
        self._listener.close()
        self._session.close()
        self._watchdog.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StorageClosedError("the Postgres backend is closed")

    def __enter__(self) -> Postgres:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Postgres(schema={self.schema!r}, owner={self.owner!r})"
