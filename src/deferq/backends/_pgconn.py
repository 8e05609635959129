"""The PostgreSQL backend's connections: the statement session and the LISTEN connection
(spec/postgres.md P-1, P-6, P-27).

Rules:
- psycopg is imported by these functions when they run, never at load (P-1).
- ``Session`` is one autocommit connection used under a lock (the queue calls from its loop
  and from worker threads). Every psycopg error becomes ``PostgresError`` naming the server
  (never the password), the schema and the operation. A connection lost during a statement
  fails that call and is replaced at the next one; a read or an idempotent write
  (``retry``) is first tried once more on a fresh connection. A connection the server
  closed while idle is noticed before a statement is sent on it (P-6).
- ``Listener`` is a second connection that LISTENs on the schema's channel, and a socket
  pair whose write end ``wake`` writes, so that a wait in another thread returns at once
  (P-27).
"""

from __future__ import annotations

import select
import socket
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from deferq._core.errors import StorageClosedError
from deferq.backends._pgschema import PostgresError

if TYPE_CHECKING:
    import psycopg

T = TypeVar("T")


def first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def require_psycopg() -> None:
    """Implements P-1: psycopg is loaded here, when a Postgres is made, or the error says why."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        raise PostgresError("the Postgres backend needs psycopg 3: pip install "
                            "'deferq[postgres]'") from None


def where(dsn: str) -> str:
    """The server a DSN names, without its password."""
    try:
        from psycopg.conninfo import conninfo_to_dict
        parts = conninfo_to_dict(dsn)
    except Exception:  # noqa: BLE001 - a DSN psycopg cannot parse: say so, show none of it
        return "an unparsable DSN"
    return ", ".join(f"{k}={parts[k]}" for k in ("host", "port", "dbname", "user") if k in parts)


def connect(dsn: str, timeout_s: float = 10.0) -> psycopg.Connection[tuple[object, ...]]:
    """An autocommit connection to ``dsn``, or ``PostgresError`` naming what failed (P-6)."""
    require_psycopg()
    import psycopg
    try:
        return psycopg.connect(dsn, autocommit=True, connect_timeout=max(1, int(timeout_s)))
    except psycopg.Error as exc:
        raise PostgresError(f"cannot connect to PostgreSQL ({where(dsn)}): "
                            f"{first_line(exc)}") from exc


def _said_something(conn: psycopg.Connection[tuple[object, ...]]) -> bool:
    """Whether an idle connection's socket is readable: the server sent something (or closed)."""
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


class Session:
    """One autocommit connection, used under a lock, connected again after it was lost."""

    def __init__(self, dsn: str, schema: str) -> None:
        self._dsn = dsn
        self._schema = schema
        self._lock = threading.Lock()
        self.conn: psycopg.Connection[tuple[object, ...]] | None = None
        self.closed = False

    def run(self, what: str, work: Callable[[psycopg.Connection[tuple[object, ...]]], T], *,
            retry: bool = False) -> T:
        """Run ``work`` on the connection under the lock; psycopg errors become PostgresError."""
        import psycopg
        with self._lock:
            if self.closed:
                raise StorageClosedError("the Postgres backend is closed")
            for attempt in (1, 2):
                conn = self._usable()
                try:
                    return work(conn)
                except psycopg.Error as exc:
                    lost = conn.closed or conn.broken
                    if lost:
                        self.conn = None
                        conn.close()
                    if lost and retry and attempt == 1:
                        continue  # a read, on a connection that died: once more, afresh
                    reason = "the connection to PostgreSQL was lost" if lost else "it failed"
                    raise PostgresError(f"PostgreSQL ({where(self._dsn)}, schema "
                                        f"{self._schema!r}): {what}: {reason}: "
                                        f"{first_line(exc)}") from exc
            raise AssertionError("unreachable")

    def _usable(self) -> psycopg.Connection[tuple[object, ...]]:
        """The connection, after P-6's check: if the server spoke on it while it was idle
        (almost always to say it is closing it: a restart, ``pg_terminate_backend``, an idle
        timeout), a statement that changes nothing finds out whether it is gone, so that a
        write that cannot be retried is never sent on a dead connection."""
        import psycopg
        conn = self.conn
        if conn is not None and not conn.closed and _said_something(conn):
            try:
                conn.execute("SELECT 1")
            except psycopg.Error:
                conn.close()
        if conn is None or conn.closed:
            conn = self.conn = connect(self._dsn)
        return conn

    def close(self) -> None:
        with self._lock:
            self.closed = True
            if self.conn is not None:
                self.conn.close()
                self.conn = None


class Listener:
    """A connection that LISTENs on one channel, and a way to wake its waiter (P-27)."""

    def __init__(self, dsn: str, channel: str) -> None:
        self._dsn = dsn
        self._channel = channel
        self._lock = threading.Lock()
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._closed = False

    def wait(self, timeout_s: float) -> bool:
        """Block until a notification (True), ``wake`` or ``timeout_s`` (False)."""
        import psycopg
        with self._lock:
            if self._closed:
                raise StorageClosedError("the Postgres backend is closed")
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = connect(self._dsn)
                    self._conn.execute(f'LISTEN "{self._channel}"')
                conn = self._conn
                if any(True for _ in conn.notifies(timeout=0)):
                    return True
                wake_fd = self._wake_r.fileno()
                ready, _, _ = select.select([conn.fileno(), wake_fd], [], [], timeout_s)
                if wake_fd in ready:
                    try:
                        self._wake_r.recv(4096)
                    except BlockingIOError:
                        pass
                return any(True for _ in conn.notifies(timeout=0))
            except psycopg.Error as exc:
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None
                raise PostgresError(f"PostgreSQL ({where(self._dsn)}): waiting for new "
                                    f"tasks: {first_line(exc)}") from exc

    def wake(self) -> None:
        try:
            self._wake_w.send(b"!")
        except OSError:
            pass  # already woken (the buffer is full), or closed

    def close(self) -> None:
        self.wake()
        with self._lock:
            self._closed = True
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            self._wake_r.close()
            self._wake_w.close()
