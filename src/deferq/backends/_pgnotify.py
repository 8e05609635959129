"""The PostgreSQL backend's notifications of new work: at most one per interval, the last one
never dropped (spec/postgres.md P-73 … P-75).

Rules:
- A producer (a backend that does not claim) notifies the schema's channel after a free
  task's add committed (P-73), in a transaction of its own committed without waiting for its
  WAL flush (``_pgclaims.notify``).
- At most one notification per ``NOTIFY_INTERVAL_S`` per backend: an add within the interval
  after a notification owes one, sent when the interval ends (a timer thread), so an idle
  worker hears of every add within that interval (P-74). ``close`` sends one still owed.
- A notification that fails is logged and dropped: the add it follows is committed, and idle
  workers look every ``poll_seconds`` anyway (P-27, P-75).

Why at most one per interval: every notifying transaction takes a database-wide lock and
writes a commit record, and a round trip per add made one producer 1.4x the plain-insert
floor. One notification wakes every listening worker, and a woken worker claims until no due
task is left, so what matters is that a notification follows the last add of a burst.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Final

from deferq.backends._pgschema import PostgresError

log = logging.getLogger("deferq.postgres")

NOTIFY_INTERVAL_S: Final = 0.025  # the longest an owed notification waits (P-74)


class Notifier:
    """Sends ``send()`` at most once per ``interval_s``, and once more for what came after."""

    def __init__(self, send: Callable[[], None], interval_s: float = NOTIFY_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._send = send
        self._interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._next_at = 0.0  # when the next notification may go out at once
        self._timer: threading.Timer | None = None  # set while a notification is owed
        self._closed = False
        self.sent = 0  # notifications sent (tests and benchmarks count them)

    def added(self) -> None:
        """A free task's add committed: notify now, or owe a notification at the interval's end."""
        with self._lock:
            if self._closed or self._timer is not None:
                return  # closed, or already owed: that one covers this add too
            now = self._clock()
            if now < self._next_at:
                timer = threading.Timer(self._next_at - now, self._owed)
                timer.daemon = True
                self._timer = timer
                timer.start()
                return
            self._next_at = now + self._interval_s
        self._notify()

    def _owed(self) -> None:
        with self._lock:
            if self._timer is None:
                return  # close sent it
            self._timer = None
            self._next_at = self._clock() + self._interval_s
        self._notify()

    def close(self) -> None:
        """No more notifications; one still owed is sent now (before the connection closes)."""
        with self._lock:
            self._closed = True
            timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
            self._notify()

    def _notify(self) -> None:
        try:
            self._send()
            with self._lock:
                self.sent += 1
        except PostgresError as exc:  # Implements P-75: a hint lost, never an add's error
            log.warning("%s; idle workers find the task within poll_seconds", exc)
