"""The PostgreSQL backend's notifications of new work: at most one per interval, the last one
never dropped (spec/postgres.md P-73 … P-75).

Rules:
- A producer (a backend that does not claim) notifies the schema's channel after a free
  task's add committed (P-73), in a transaction of its own committed without waiting for its
  WAL flush (``_pgclaims.notify``).
- At most one notification per ``NOTIFY_INTERVAL_S`` per backend: an add within the interval
  after a notification owes one, sent when the interval ends (by the notifier's thread), so an
  idle worker hears of every add within that interval (P-74). ``close`` sends one still owed.
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
    """Sends ``send()`` at most once per ``interval_s``, and once more for what came after.

    An owed notification is sent by one thread per notifier, started on the first owed one
    and kept until ``close`` (a thread per owed notification cost a producer more than the
    notifications saved, measured with 16 producers).
    """

    def __init__(self, send: Callable[[], None], interval_s: float = NOTIFY_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._send = send
        self._interval_s = interval_s
        self._clock = clock
        self._cond = threading.Condition(threading.Lock())
        self._next_at = 0.0  # when the next notification may go out at once
        self._owed = False
        self._thread: threading.Thread | None = None
        self._closed = False
        self.sent = 0  # notifications sent (tests and benchmarks count them)

    def added(self) -> None:
        """A free task's add committed: notify now, or owe a notification at the interval's end."""
        with self._cond:
            if self._closed or self._owed:
                return  # closed, or already owed: that one covers this add too
            now = self._clock()
            if now < self._next_at:
                self._owed = True
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, daemon=True,
                                                    name="deferq-pg-notify")
                    self._thread.start()
                else:
                    self._cond.notify()
                return
            self._next_at = now + self._interval_s
        self._notify()

    @property
    def owed(self) -> bool:
        """Whether a notification is owed (sent when the interval ends, or at ``close``)."""
        with self._cond:
            return self._owed

    def _run(self) -> None:
        """The thread that sends owed notifications when their interval ends."""
        while True:
            with self._cond:
                while not self._closed and not self._owed:
                    self._cond.wait()
                if self._closed:
                    return
                delay = self._next_at - self._clock()
                if delay > 0:
                    self._cond.wait(delay)
                    continue  # closed meanwhile, or the interval ended: look again
                self._owed = False
                self._next_at = self._clock() + self._interval_s
            self._notify()

    def close(self) -> None:
        """No more notifications; one still owed is sent now (before the connection closes)."""
        with self._cond:
            self._closed = True
            owed, self._owed = self._owed, False
            thread, self._thread = self._thread, None
            self._cond.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        if owed:
            self._notify()

    def _notify(self) -> None:
        try:
            self._send()
            with self._cond:
                self.sent += 1
        except PostgresError as exc:  # Implements P-75: a hint lost, never an add's error
            log.warning("%s; idle workers find the task within poll_seconds", exc)
