"""The PostgreSQL backend's connections: the statement session and the LISTEN connection
(spec/postgres.md P-1, P-6, P-27).

Rules:
- psycopg is imported by these functions when they run, never at load (P-1).
- ``Session`` is one autocommit connection used under a lock (the queue calls from its loop
  and from worker threads). Every psycopg error becomes ``PostgresError`` naming the server
  (never the password), the schema and the operation. A connection lost during a statement
  fails that call and is replaced at the next one; a read or an idempotent write
  (``retry``) is first tried once more on a fresh connection. A connection the server
  closed while idle is noticed before a statement is sent on it (P-51), from what libpq
  reads of it without blocking or giving up the GIL.
- ``Listener`` is a second connection that LISTENs on the schema's channel, and a socket
  pair whose write end ``wake`` writes, so that a wait in another thread returns at once
  (P-27).
- Every statement either connection sends is watched (``Watchdog``, P-47): one the server
  has not answered within the backend's ``timeout_seconds`` has its socket shut down, so the
  call fails as a lost connection instead of waiting forever on a server that stopped
  answering (a frozen host, a network partition, a SIGSTOPped backend). A connect is bounded
  by the DSN's ``connect_timeout``, else ``CONNECT_TIMEOUT_S`` (P-49).
- No error shows any part of a DSN that does not parse (P-46): libpq's parse errors quote
  fragments of it, which may be pieces of the password.

Why a socket shutdown: psycopg's blocking calls have no client-side deadline, a cancel
request goes to the server that is not answering, and ``statement_timeout`` is enforced by
that same server. Shutting the socket down makes libpq's wait return at once with "server
closed the connection", the path P-50 already handles. Arming costs a tuple and a lock per
statement; one thread per backend checks the deadlines a few times per timeout.
"""

from __future__ import annotations

import re
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, TypeVar

from deferq._core.errors import StorageClosedError
from deferq.backends._pgschema import PostgresError

if TYPE_CHECKING:
    import psycopg

T = TypeVar("T")

CONNECT_TIMEOUT_S: Final = 10  # P-49: a connect's bound when the DSN gives no connect_timeout
DEFAULT_TIMEOUT_S: Final = 30.0  # P-47: how long a statement may go unanswered
_TICKS_PER_TIMEOUT: Final = 4  # the watchdog looks this often per timeout (at most 1 s apart)
_IDLE_EXIT_S: Final = 10.0  # a watchdog thread with nothing armed for this long ends
_QUOTED: Final = re.compile(r'"[^"]*"|\'[^\']*\'')


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


def dsn_parts(dsn: str) -> dict[str, object]:
    """The DSN's parameters, or ``PostgresError`` that quotes none of it (P-46)."""
    require_psycopg()
    import psycopg
    from psycopg.conninfo import conninfo_to_dict
    try:
        return dict(conninfo_to_dict(dsn))
    except psycopg.Error as exc:
        # Implements P-46: libpq quotes the fragment it choked on, which may be a piece of
        # the password; every quoted fragment is hidden.
        reason = _QUOTED.sub('"..."', first_line(exc))
        raise PostgresError(f"the PostgreSQL DSN cannot be parsed ({reason}; quoted "
                            f"fragments hidden)") from None


def connect_timeout_of(dsn: str) -> int | None:
    """Implements P-49: None when the DSN sets ``connect_timeout`` (libpq honours it), else
    the timeout to give libpq, ``CONNECT_TIMEOUT_S``."""
    return None if "connect_timeout" in dsn_parts(dsn) else CONNECT_TIMEOUT_S


def connect(dsn: str) -> psycopg.Connection[tuple[object, ...]]:
    """An autocommit connection to ``dsn``, or ``PostgresError`` naming what failed (P-6)."""
    timeout = connect_timeout_of(dsn)
    import psycopg
    try:
        if timeout is None:
            return psycopg.connect(dsn, autocommit=True)
        return psycopg.connect(dsn, autocommit=True, connect_timeout=timeout)
    except psycopg.Error as exc:
        raise PostgresError(f"cannot connect to PostgreSQL ({where(dsn)}): "
                            f"{first_line(exc)}") from exc


class Watchdog:
    """Shuts down the socket of a statement not answered within ``timeout_s`` (P-47).

    ``arm(slot, fd)`` before a statement, ``disarm(slot)`` after it (in a ``finally``): a
    slot is one connection's statement in flight. One daemon thread looks at the deadlines
    every quarter of the timeout (at most every second), so an unanswered statement fails
    within that much after its deadline. ``arm`` starts it; ``close`` ends it, and so does
    ``_IDLE_EXIT_S`` with nothing armed (a backend never closed leaves no thread behind).
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._armed: dict[str, tuple[float, int]] = {}  # slot: (deadline, socket fd)
        self._cut: set[str] = set()  # slots whose statement's socket was shut down
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.fired = 0  # sockets shut down (tests count them)
        self._last_arm = 0.0

    def arm(self, slot: str, fd: int) -> None:
        with self._lock:
            self._last_arm = now = time.monotonic()
            self._armed[slot] = (now + self.timeout_s, fd)
            self._cut.discard(slot)
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="deferq-pg-watchdog")
                self._thread.start()

    def disarm(self, slot: str) -> None:
        """After this returns the watchdog never touches that statement's socket."""
        with self._lock:
            self._armed.pop(slot, None)

    def was_cut(self, slot: str) -> bool:
        """Whether the statement last armed in ``slot`` had its socket shut down."""
        with self._lock:
            return slot in self._cut

    def _run(self) -> None:
        tick = min(1.0, self.timeout_s / _TICKS_PER_TIMEOUT)
        while not self._stop.wait(tick):
            now = time.monotonic()
            with self._lock:
                if not self._armed and now - self._last_arm > _IDLE_EXIT_S:
                    self._thread = None  # idle: the next ``arm`` starts another
                    return
                late = [slot for slot, (deadline, _) in self._armed.items() if now >= deadline]
                for slot in late:
                    _, fd = self._armed.pop(slot)
                    self.fired += 1
                    self._cut.add(slot)
                    _shut_down(fd)  # under the lock: disarm, then close, cannot race it

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            self._armed.clear()


def _shut_down(fd: int) -> None:
    """Shut down the socket ``fd`` (a duplicate of it is closed; the connection's is not),
    so that libpq's wait on it returns: the statement fails as a lost connection."""
    try:
        sock = socket.fromfd(fd, socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError:
        return  # already closed
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # not connected any more
    finally:
        sock.close()


class Session:
    """One autocommit connection, used under a lock, connected again after it was lost."""

    def __init__(self, dsn: str, schema: str, watchdog: Watchdog) -> None:
        self._dsn = dsn
        self._schema = schema
        self._watchdog = watchdog
        self._lock = threading.Lock()
        self.conn: psycopg.Connection[tuple[object, ...]] | None = None
        self.closed = False
        self._heard = False  # the server sent a notice or an error outside a statement's result

    def run(self, what: str, work: Callable[[psycopg.Connection[tuple[object, ...]]], T], *,
            retry: bool = False) -> T:
        """Run ``work`` on the connection under the lock; psycopg errors become PostgresError."""
        import psycopg
        watchdog = self._watchdog
        with self._lock:
            if self.closed:
                raise StorageClosedError("the Postgres backend is closed")
            for attempt in (1, 2):
                conn = self._usable()
                watchdog.arm("session", conn.fileno())  # Implements P-47
                try:
                    return work(conn)
                except PostgresError as exc:  # the schema refused (P-4, P-5): say where
                    raise PostgresError(f"PostgreSQL ({where(self._dsn)}): {exc}") from None
                except psycopg.Error as exc:
                    lost = conn.closed or conn.broken
                    if lost:
                        self.conn = None
                        conn.close()
                    if lost and retry and attempt == 1:
                        continue  # a read, on a connection that died: once more, afresh
                    raise PostgresError(f"PostgreSQL ({where(self._dsn)}, schema "
                                        f"{self._schema!r}): {what}: "
                                        f"{_reason(watchdog, 'session', lost)}: "
                                        f"{first_line(exc)}") from exc
                finally:
                    watchdog.disarm("session")
            raise AssertionError("unreachable")

    def _usable(self) -> psycopg.Connection[tuple[object, ...]]:
        """The connection, after P-6's check: if the server spoke on it while it was idle
        (almost always to say it is closing it: a restart, ``pg_terminate_backend``, an idle
        timeout), a statement that changes nothing finds out whether it is gone, so that a
        write that cannot be retried is never sent on a dead connection."""
        import psycopg
        conn = self.conn
        if conn is not None and not conn.closed and self._said_something(conn):
            gone: bool = conn.closed  # libpq read its end already: no socket left to probe
            if not gone:
                try:
                    self._watchdog.arm("session", conn.fileno())
                    conn.execute("SELECT 1")
                except psycopg.Error:
                    gone = True
                finally:
                    self._watchdog.disarm("session")
            if gone:
                conn.close()
        if conn is None or conn.closed:
            conn = self.conn = connect(self._dsn)
            self._heard = False
            conn.add_notice_handler(self._hear)
        return conn

    def _hear(self, diagnostic: object) -> None:
        self._heard = True

    def _said_something(self, conn: psycopg.Connection[tuple[object, ...]]) -> bool:
        """Implements P-51: whether the server sent something on the idle connection, or
        closed it. libpq reads what arrived without blocking, and parsing it hands an error
        the server sent outside a statement (``pg_terminate_backend``'s FATAL, a shutdown's)
        to the notice handler, ``_hear``. Neither call gives up the GIL, where a ``select``
        on the socket did: with a busy thread beside it, getting the GIL back took up to the
        interpreter's switch interval (5 ms), and with 16 producers in one process the
        check cost the add 8 % of its time (docs/benchmarks.md, session 10)."""
        import psycopg
        pgconn = conn.pgconn
        try:
            pgconn.consume_input()
        except psycopg.Error:
            return True  # the server closed it
        if pgconn.notifies() is not None:  # (it never LISTENs: anything is news)
            return True
        heard, self._heard = self._heard, False
        return heard or pgconn.status != psycopg.pq.ConnStatus.OK

    def close(self) -> None:
        with self._lock:
            self.closed = True
            if self.conn is not None:
                self.conn.close()
                self.conn = None


def _reason(watchdog: Watchdog, slot: str, lost: bool) -> str:
    """Why a statement failed: the server's error, a lost connection, or no answer (P-47)."""
    if watchdog.was_cut(slot):
        return (f"the server did not answer within {watchdog.timeout_s:g} s "
                f"(timeout_seconds), so the connection was cut")
    return "the connection to PostgreSQL was lost" if lost else "it failed"


class Listener:
    """A connection that LISTENs on one channel, and a way to wake its waiter (P-27)."""

    def __init__(self, dsn: str, channel: str, watchdog: Watchdog) -> None:
        self._dsn = dsn
        self._channel = channel
        self._watchdog = watchdog
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
                    self._watchdog.arm("listener", self._conn.fileno())  # Implements P-47
                    try:
                        self._conn.execute(f'LISTEN "{self._channel}"')
                    finally:
                        self._watchdog.disarm("listener")
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
                                    f"tasks: {_reason(self._watchdog, 'listener', True)}: "
                                    f"{first_line(exc)}") from exc

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
