"""A worker paused past its lease (SIGSTOP), its tasks taken over, then resumed (SIGCONT):
its late completions and give-ups must not undo the new holder's claims (spec/postgres.md
P-41, P-42).

Goal: issue 19's "a worker paused past its lease then resumed: no acknowledged task lost, no
task run twice except as the at-least-once contract allows". Method: two real worker
processes (``tests/postgres/worker.py``, lease 1 s, six tasks at a time) on one schema. A
producer adds six ``pg.Slow`` tasks (2 s each); half of them fail, with no retry, in the
first worker only. The first worker claims and starts all six and is SIGSTOPped; once every
lease has run out on the server's clock, the second worker starts and claims and starts all
six; the first is then SIGCONTed while the second still runs them. The first finishes its
stale runs at once: its removals and give-ups must leave the six rows, held by the second,
and no dead task. The second then completes all six: the table ends empty, no dead task,
every task ran to its end in the second worker, and the first worker's runs are the
at-least-once repeats P-23 allows (each task started at most once per worker).
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from deferq._runtime.serialize import JSON_CODEC, Context
from deferq.backends import Postgres
from tests.postgres.cluster import wait_until
from tests.postgres.conftest import PgSchema

ROOT = Path(__file__).resolve().parents[2]
TASKS = 6


def _worker(pg: PgSchema, ledger: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-m", "tests.postgres.worker", pg.dsn, pg.schema,
                             str(ledger), str(TASKS)], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _lines(ledger: Path, what: str, pid: int) -> set[str]:
    text = ledger.read_text() if ledger.exists() else ""
    return {key for kind, key, who in (line.split() for line in text.splitlines())
            if kind == what and int(who) == pid}


def _wait(what: str, check: Callable[[], bool]) -> None:
    wait_until(what, check, timeout=30, poll=0.02)


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.spec("P-41", "P-42", "P-23")
def test_a_worker_resumed_after_its_lease_ran_out_cannot_undo_the_new_holder(
        pg: PgSchema, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    keys = {f"k{i}" for i in range(TASKS)}
    with Postgres(dsn=pg.dsn, schema=pg.schema, create_schema=True) as producer:
        stalled = _worker(pg, ledger)
        taker: subprocess.Popen[str] | None = None
        try:
            for i, key in enumerate(sorted(keys)):
                fail_pid = stalled.pid if i % 2 else 0  # odd keys fail in the stalled worker
                producer.add_task(JSON_CODEC.encode(Context("pg.Slow", (key, fail_pid), {}, 0)))
            _wait("the first worker started all six", lambda: _lines(
                ledger, "start", stalled.pid) == keys)
            os.kill(stalled.pid, signal.SIGSTOP)
            _wait("every lease ran out", lambda: pg.sql(
                "SELECT count(*) FROM {s}.pending WHERE lease_until < now()") == [(TASKS,)])
            taker = second = _worker(pg, ledger)
            _wait("the second worker started all six", lambda: _lines(
                ledger, "start", second.pid) == keys)
            taker_owners = pg.sql("SELECT DISTINCT lease_owner FROM {s}.pending "
                                  "WHERE lease_until >= now()")
            assert len(taker_owners) == 1 and pg.sql(
                "SELECT count(*) FROM {s}.pending") == [(TASKS,)]
            os.kill(stalled.pid, signal.SIGCONT)
            ended = {k for i, k in enumerate(sorted(keys)) if i % 2 == 0}
            _wait("the first worker's stale runs ended", lambda: _lines(
                ledger, "end", stalled.pid) == ended)
            time.sleep(0.3)  # its removals and give-ups follow each end at once
            # P-41: the second worker still holds all six; nothing was dead-lettered.
            assert _lines(ledger, "end", taker.pid) == set(), "the check came too late"
            assert pg.sql("SELECT count(*), min(lease_owner), max(lease_owner) FROM "
                          "{s}.pending") == [(TASKS, taker_owners[0][0], taker_owners[0][0])]
            assert pg.sql("SELECT id FROM {s}.dead") == []
            _wait("the second worker ran all six to their end", lambda: _lines(
                ledger, "end", taker.pid) == keys)
            _wait("the table is empty", lambda: not pg.sql("SELECT 1 FROM {s}.pending"))
            assert pg.sql("SELECT id FROM {s}.dead") == []
        finally:
            for proc in (stalled, taker):
                if proc is not None and proc.poll() is None:
                    os.kill(proc.pid, signal.SIGCONT)
                    proc.send_signal(signal.SIGTERM)
            for proc in (stalled, taker):
                if proc is not None:
                    proc.communicate(timeout=30)
    starts: collections.Counter[str] = collections.Counter(
        line.split()[1] for line in ledger.read_text().splitlines() if line.startswith("start"))
    assert starts == {key: 2 for key in keys}  # once per worker: the repeat P-23 allows
