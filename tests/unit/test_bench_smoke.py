"""Smoke tests of the benchmarks (bench_storage.py of issue #6, bench_floors.py, bench_import.py).

Goal: a benchmark cannot rot: it still runs every workload against the current API and
reports every row with positive numbers. Method: run it as a command with ``--smoke`` (tiny
sizes, a few seconds) into a temporary JSON file and scratch directory, then check the one
JSON line it appended: every row of the issue is there, each with positive per-repetition
times for deferq and both baselines, positive ratios and a verdict; the memory rows have
positive peaks. The import benchmark's rows (bare python, two imports, an operator
command) each have positive times and list the deferq modules loaded, none a harness.
The numbers themselves are not judged (tiny sizes on a busy machine).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "bench_storage.py"
SIDES = ("deferq", "raw", "sqlite")
# One row per line of the table in issue #6 (find and enqueue rows have several variants).
EXPECTED_ROWS = {
    "enq_crash_disk", "enq_crash_queue", "enq_power_disk", "enq_power_queue",
    "enq_power_queue_16", "dead_add_1p", "dead_add_2p", "dead_list_newest", "dead_list_offset",
    "dead_find_recent", "dead_find_oldest", "dead_find_missing", "dead_find_recent_cold",
    "dead_find_oldest_cold", "dead_find_missing_cold", "dead_remove_1", "dead_remove_many",
    "replay", "replay_rotated",
    # Issue #17 item 8: cold operator reads, each sample a fresh process.
    "cold_list_newest", "cold_list_offset_first", "cold_list_offset", "cold_find_recent",
    "cold_find_missing", "cold_stats_first", "cold_stats", "cold_cli_list",
}
EXPECTED_MEMORY = {"dead_list_newest", "dead_list_offset", "dead_find_recent",
                   "dead_find_oldest", "dead_find_missing", "replay",
                   "cold_list_newest", "cold_list_offset_first", "cold_list_offset",
                   "cold_find_recent",
                   "cold_find_missing", "cold_stats_first", "cold_stats"}


def run_bench(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--dir", str(tmp_path),
         "--json-out", str(tmp_path / "results.jsonl"), *args],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False)


def positive(value: object) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


@pytest.mark.slow
@pytest.mark.multiprocess
def test_smoke_run_reports_every_row_with_positive_numbers(tmp_path: Path) -> None:
    done = run_bench(tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = (tmp_path / "results.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    assert record["mode"] == "smoke"
    rows = {row["key"]: row for row in record["rows"]}
    assert set(rows) == EXPECTED_ROWS
    assert len(record["rows"]) == len(EXPECTED_ROWS)
    for key, row in rows.items():
        reps = row["reps"]
        assert reps >= 1, key
        for side in SIDES:
            assert len(row[f"{side}_s"]) == reps, (key, side)
            assert all(positive(s) for s in row[f"{side}_s"]), (key, side, row[f"{side}_s"])
            assert positive(row[f"{side}_median_s"]), (key, side)
        for side in ("raw", "sqlite"):
            assert len(row[f"ratios_vs_{side}"]) == reps, (key, side)
            assert positive(row[f"ratio_vs_{side}"]), (key, side)
        assert row["target"], key
        assert row["verdict"] in ("meets", "misses"), (key, row["verdict"])
        assert row["label"] in done.stdout, key  # the table shows every row
    memory = {m["key"]: m for m in record["memory"]}
    assert set(memory) == EXPECTED_MEMORY
    for key, mem in memory.items():
        assert all(positive(mem[f"{side}_peak_bytes"]) for side in SIDES), (key, mem)
    assert not list(tmp_path.glob("deferq-bench-*")), "the scratch directory was left behind"


@pytest.mark.slow
def test_only_selects_workloads_and_rejects_unknown_names(tmp_path: Path) -> None:
    done = run_bench(tmp_path, "--only", "replay")
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((tmp_path / "results.jsonl").read_text(encoding="utf-8"))
    assert [row["key"] for row in record["rows"]] == ["replay", "replay_rotated"]
    bad = run_bench(tmp_path, "--only", "replay,nosuch")
    assert bad.returncode == 2
    assert "unknown workload nosuch" in bad.stderr


FLOORS = REPO / "benchmarks" / "bench_floors.py"
FLOOR_STUDIES = ["enq_crash_queue", "dead_add_1p", "dead_list_newest", "replay"]


@pytest.mark.slow
def test_floor_study_reports_every_missed_row_with_its_floor(tmp_path: Path) -> None:
    """bench_floors.py --smoke: the four studies, each with positive times for deferq, its
    target's baseline and the floor, the three ratios, and a verdict; the floors' records
    were checked against deferq's decoders (the command fails otherwise)."""
    done = subprocess.run(
        [sys.executable, str(FLOORS), "--smoke", "--dir", str(tmp_path),
         "--json-out", str(tmp_path / "floors.jsonl")],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((tmp_path / "floors.jsonl").read_text(encoding="utf-8"))
    assert record["kind"] == "floors" and record["mode"] == "smoke"
    studies = record["studies"]
    assert [s["key"] for s in studies] == FLOOR_STUDIES
    for study in studies:
        for side in ("deferq", "baseline", "floor"):
            assert study[f"{side}_s"] and all(positive(x) for x in study[f"{side}_s"]), study
        for ratio in ("deferq_vs_baseline", "floor_vs_baseline", "deferq_vs_floor"):
            assert positive(study[ratio]), (study["key"], ratio)
        assert study["verdict"] in ("meets", "misses", "below the floor"), study["verdict"]
        assert study["label"] in done.stdout
    assert not list(tmp_path.glob("deferq-bench-*")), "the scratch directory was left behind"


IMPORTS = REPO / "benchmarks" / "bench_import.py"
IMPORT_COMMANDS = ['python -c "pass"', 'python -c "import deferq"',
                   'python -c "import deferq._cli"', "python -m deferq stats --path P"]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_import_benchmark_times_each_command_against_bare_python(tmp_path: Path) -> None:
    """bench_import.py --smoke: the baseline and the three deferq commands, each with its
    samples, a positive median and ratio, the deferq modules it loaded (none for the baseline,
    the package for the others) and no harness module."""
    done = subprocess.run(
        [sys.executable, str(IMPORTS), "--smoke", "--json-out", str(tmp_path / "import.jsonl")],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((tmp_path / "import.jsonl").read_text(encoding="utf-8"))
    assert record["kind"] == "import" and record["mode"] == "smoke" and record["runs"] == 3
    rows = record["rows"]
    assert [row["command"] for row in rows] == IMPORT_COMMANDS
    for row in rows:
        assert len(row["samples_s"]) == 3 and all(positive(s) for s in row["samples_s"]), row
        assert positive(row["median_s"]) and positive(row["ratio"]), row
        assert row["harness_modules"] == [], row
        assert row["command"] in done.stdout
    assert rows[0]["deferq_modules"] == [] and rows[0]["ratio"] == 1.0
    for row in rows[1:]:
        assert "deferq" in row["deferq_modules"], row
    assert "deferq._cli.ops" in rows[3]["deferq_modules"]


def test_import_benchmark_sees_a_harness_module_when_one_is_loaded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Its module list must be able to show a harness module: load one on purpose.
    spec = importlib.util.spec_from_file_location("bench_import", IMPORTS)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_import", bench)  # its dataclass looks itself up
    spec.loader.exec_module(bench)
    loaded = bench.deferq_modules(["-c", "import deferq.crashtest"], str(tmp_path),
                                  dict(os.environ))
    assert "deferq.crashtest" in loaded
