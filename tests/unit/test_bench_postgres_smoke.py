"""Smoke test of benchmarks/bench_postgres.py (issue #19's PostgreSQL benchmark rows).

Goal: the benchmark cannot rot: with ``--smoke`` (tiny sizes) it starts its own throwaway
cluster, runs every row against the current API and appends one JSON line whose rows carry
positive numbers and a ratio. Method: run it as a command; the numbers are not judged (speed
targets are the benchmark's own verdicts, not a unit test's).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.postgres.cluster import server_bin_dir

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "bench_postgres.py"
ROWS = {"throughput_p1", "throughput_p16", "claim_latency_p50", "claim_latency_p99",
        "dead_newest", "dead_find", "backlog"}


def positive(value: object) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


@pytest.mark.slow
@pytest.mark.multiprocess
def test_smoke_run_reports_every_row_with_positive_numbers(tmp_path: Path) -> None:
    if server_bin_dir() is None:
        pytest.fail("no PostgreSQL server binaries: scripts/setup.sh installs them")
    out = tmp_path / "pg.jsonl"
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--json-out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = out.read_text(encoding="utf-8").splitlines()
    record = json.loads(line)
    assert set(record["rows"]) == ROWS
    for key, row in record["rows"].items():
        assert all(positive(row[side]) for side in ("floor", "deferq", "ratio")), (key, row)
        assert key in done.stdout
    # The peers (the bench extra, installed here or not): each measured with a verdict, or
    # said why not with no verdict; never silent.
    for peer in ("pgqueuer", "procrastinate"):
        for key in ("throughput_p1", "throughput_p16"):
            if peer in record["rows"][key]:
                assert positive(record["rows"][key][peer]), (peer, key)
                assert f"(target: deferq ahead of {peer})" in done.stdout
            else:
                assert f"{peer}: " in done.stdout and "no verdict" in done.stdout
                assert peer in record["peers"]
