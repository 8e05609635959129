"""A producer's notifications of new work (spec/postgres.md P-73 … P-75).

Goal: notifications never slow the adds they follow (no notifying insert, at most one
notification per interval), yet every add is followed by one within the interval, and a
failed one is only a warning. Method: ``Notifier`` alone with a counting ``send`` and real
timer threads; then a real producer on a real server, heard by a plain psycopg connection
that LISTENs on the schema's channel.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest

from deferq.backends import Postgres, PostgresError
from deferq.backends._pgnotify import NOTIFY_INTERVAL_S, Notifier
from tests.postgres.conftest import PgSchema

INTERVAL = 0.05


class Counting:
    def __init__(self) -> None:
        self.at: list[float] = []
        self.lock = threading.Lock()

    def __call__(self) -> None:
        with self.lock:
            self.at.append(time.monotonic())


def _until(condition: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


@pytest.mark.spec("P-74")
def test_a_burst_sends_one_notification_at_once_and_one_trailing_within_the_interval() -> None:
    sent = Counting()
    notifier = Notifier(sent, INTERVAL)
    first = time.monotonic()
    notifier.added()
    assert len(sent.at) == 1  # the first add of a quiet spell: at once
    for _ in range(100):
        notifier.added()  # within the interval: owed, sent once when it ends
    assert len(sent.at) == 1
    _until(lambda: len(sent.at) == 2)
    assert INTERVAL * 0.9 <= sent.at[1] - first <= INTERVAL + 1.0
    time.sleep(INTERVAL * 3)
    assert len(sent.at) == 2  # nothing more was owed
    time.sleep(INTERVAL)
    notifier.added()  # a quiet interval passed: at once again
    assert len(sent.at) == 3
    notifier.close()
    assert notifier.sent == 3


@pytest.mark.spec("P-74")
def test_close_sends_the_owed_notification_once() -> None:
    sent = Counting()
    notifier = Notifier(sent, 10.0)  # a long interval: only close can send the owed one
    notifier.added()
    notifier.added()
    assert len(sent.at) == 1
    notifier.close()
    assert len(sent.at) == 2
    notifier.added()  # closed: nothing
    time.sleep(0.05)
    assert len(sent.at) == 2


@pytest.mark.spec("P-75")
def test_a_failed_notification_is_a_warning_never_an_error(
        caplog: pytest.LogCaptureFixture) -> None:
    def refuse() -> None:
        raise PostgresError("PostgreSQL (test): notify the workers: it failed: boom")

    notifier = Notifier(refuse, INTERVAL)
    with caplog.at_level(logging.WARNING, logger="deferq.postgres"):
        notifier.added()
    assert "notify the workers: it failed: boom" in caplog.text
    assert "poll_seconds" in caplog.text
    assert notifier.sent == 0
    notifier.close()


@pytest.mark.spec("P-73", "P-74")
def test_a_producers_burst_is_heard_promptly_and_its_tasks_are_committed_first(
        pg: PgSchema) -> None:
    import psycopg

    with Postgres(dsn=pg.dsn, schema=pg.schema, create_schema=True) as producer, \
            psycopg.connect(pg.dsn, autocommit=True) as listener:
        listener.execute(f'LISTEN "deferq_{pg.schema}"')
        first = producer.add_task(b"first")
        heard = list(listener.notifies(timeout=5, stop_after=1))
        assert len(heard) == 1  # the first add of a quiet spell is announced at once
        # Announced after its commit: another connection sees the task.
        assert listener.execute(f'SELECT count(*) FROM "{pg.schema}".pending WHERE id = %s',
                                (first,)).fetchone() == (1,)
        started = time.monotonic()
        for n in range(200):
            producer.add_task(b"%d" % n)
        burst = time.monotonic() - started
        last_add = time.monotonic()
        notifier = producer._notifier
        _until(lambda: not notifier.owed)  # the trailing notification went out
        assert time.monotonic() - last_add < NOTIFY_INTERVAL_S + 2.0
        heard = list(listener.notifies(timeout=1.0))
        assert len(heard) == notifier.sent - 1 >= 1, (len(heard), notifier.sent)
        # At most one per interval while the burst ran, plus the trailing one.
        assert len(heard) <= burst / NOTIFY_INTERVAL_S + 2, (len(heard), burst)
        count = listener.execute(f'SELECT count(*) FROM "{pg.schema}".pending').fetchone()
        assert count == (201,)
