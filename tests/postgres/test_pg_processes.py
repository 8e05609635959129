"""Worker processes sharing one database: one is SIGKILLed mid-work, the other finishes
everything (spec/postgres.md P-23, spec/queue.md Q-75).

Goal: at-least-once across real processes: no task is lost when a worker dies holding claims,
and a task runs twice only if the dead worker had already run it (killed before its removal
committed). Method: a producer adds 60 free tasks; a ``tests/postgres/worker.py`` process
(lease 1 s) claims them all, each execution appending ``KEY PID`` to a shared ledger, and is
SIGKILLed once ten have run; a second worker started then must take over the dead one's claims
when their leases expire and run the rest; it is then stopped with SIGTERM.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from deferq._runtime.serialize import JSON_CODEC, Context
from deferq.backends import Postgres
from tests.postgres.cluster import wait_until
from tests.postgres.conftest import PgSchema

ROOT = Path(__file__).resolve().parents[2]
TASKS = 60


def _worker(pg: PgSchema, ledger: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-m", "tests.postgres.worker", pg.dsn, pg.schema,
                             str(ledger)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _runs(ledger: Path) -> list[tuple[str, int]]:
    text = ledger.read_text() if ledger.exists() else ""
    return [(key, int(pid)) for key, pid in (line.split() for line in text.splitlines())]


def _wait(what: str, check: Callable[[], bool]) -> None:
    wait_until(what, check, timeout=40, poll=0.05)


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.spec("P-23", "Q-227")
def test_a_killed_workers_tasks_are_run_by_the_survivor_at_least_once(
        pg: PgSchema, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    with Postgres(dsn=pg.dsn, schema=pg.schema, create_schema=True) as producer:
        keys = [f"k{i}" for i in range(TASKS)]
        victim = _worker(pg, ledger)
        survivor: subprocess.Popen[str] | None = None
        try:
            for key in keys:
                producer.add_task(JSON_CODEC.encode(Context("pg.Ledgered", (key,), {}, 0)))
            _wait("ten tasks ran", lambda: len(_runs(ledger)) >= 10)
            # The victim claimed them all (one batch of 64); it dies holding the rest.
            assert pg.sql("SELECT count(DISTINCT lease_owner) FROM {s}.pending") == [(1,)]
            os.kill(victim.pid, signal.SIGKILL)
            victim.wait(20)
            survivor = _worker(pg, ledger)
            _wait("every task ran", lambda: {k for k, _ in _runs(ledger)} == set(keys))
            _wait("the table is empty", lambda: not pg.sql("SELECT 1 FROM {s}.pending"))
        finally:
            for proc in (victim, survivor):
                if proc is not None and proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            victim.wait(30)
            out = survivor.communicate(timeout=30)[0] if survivor is not None else ""
        assert survivor is not None
        assert survivor.returncode == 0 and out.strip().endswith("stopped")
    runs = _runs(ledger)
    by_key: dict[str, list[int]] = collections.defaultdict(list)
    for key, pid in runs:
        by_key[key].append(pid)
    assert set(by_key) == set(keys)
    for key, pids in by_key.items():
        if len(pids) > 1:  # only a task the victim had run before it died may run again
            assert victim.pid in pids and len(pids) == 2, (key, pids)
    assert {pid for pids in by_key.values() for pid in pids} == {victim.pid, survivor.pid}
