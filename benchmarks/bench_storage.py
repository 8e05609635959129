#!/usr/bin/env python3
"""Benchmark deferq's storage engine against the physical floor and SQLite, in one run.

Usage::

    .venv/bin/python benchmarks/bench_storage.py [--quick | --smoke] [--only NAME[,NAME]]
        [--reps N] [--dir DIR] [--json-out FILE]

Every workload of issue #6 runs three sides in one process tree: deferq (through its public
``Disk`` and ``Queue`` API), a raw baseline (plain ``os.write``/``fsync``/``flock`` on a log
file: the physical floor) and stdlib ``sqlite3`` in WAL mode. The sides alternate repetition by
repetition (the order rotates), so they see the same machine state. A ratio is the median of
the per-repetition ratios deferq time / baseline time: 2.0 means deferq takes twice as long
(half the rate), 0.5 that it is twice as fast. Shared machines are noisy: compare ratios from
one run, never absolute numbers across runs.

Peak memory is measured in separate, untimed passes under ``tracemalloc`` (which slows code
down), one pass per side. Results: a table on stdout, progress on stderr, and one JSON line per
run appended to ``--json-out`` (default ``benchmarks/results.jsonl``; do not commit it).
See docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import math
import os
import platform
import socket
import sys
import time
from pathlib import Path

from bench_cli import add_options, append_json_line, config_and_names, git, loadavg
from bench_common import SIDES, Config, Results, Row, Scratch, fmt_bytes, fmt_s, log
from bench_workloads import GROUPS, ROW_KEYS, bench_dead_reads

DEFAULT_JSON_OUT = Path(__file__).resolve().parent / "results.jsonl"


def table(headers: list[str], body: list[list[str]], left: tuple[int, ...] = (0,)) -> str:
    """A plain-text table; columns in ``left`` are left-aligned, the others right-aligned."""
    widths = [max(len(r[i]) for r in [headers, *body]) for i in range(len(headers))]

    def fmt(cells: list[str]) -> str:
        return " | ".join(c.ljust(w) if i in left else c.rjust(w)
                          for i, (c, w) in enumerate(zip(cells, widths, strict=True)))
    return "\n".join([fmt(headers), "-|-".join("-" * w for w in widths), *map(fmt, body)])


def ratio_text(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}"


def row_cells(row: Row) -> list[str]:
    suffix = "" if row.per == "call" else f"/{row.per}"
    return [row.label, *(fmt_s(row.median(side)) + suffix for side in SIDES),
            ratio_text(row.ratio_median("raw")), ratio_text(row.ratio_median("sqlite")),
            row.target.text, row.target.verdict(row)]


def report(res: Results, cfg: Config, runtime_s: float, meta: dict[str, object]) -> str:
    mem = [[m.label, *(fmt_bytes(m.peak_bytes[side]) for side in SIDES)] for m in res.memory]
    rates = [f"  {row.label}: " + ", ".join(f"{side} {1 / row.median(side):,.0f}/s"
                                            for side in SIDES)
             for row in res.rows if row.per != "call"]
    info = [f"  {key} = {value:,.4g}" for key, value in sorted(res.info.items())]
    return "\n".join([
        f"deferq storage benchmark ({cfg.mode}) - {meta['timestamp']} - commit "
        f"{meta['git_commit']}{' (src dirty)' if meta['git_src_dirty'] else ''}",
        f"host {meta['host']}, {meta['cpu_count']} CPUs, Python {platform.python_version()}, "
        f"SQLite {meta['sqlite']}, load {meta['loadavg_start']} -> {meta['loadavg_end']}",
        "ratio = median over repetitions of (deferq time / baseline time); > 1: deferq is slower",
        "",
        table(["workload", "deferq median", "raw median", "sqlite median", "vs raw",
               "vs sqlite", "target", "verdict"], [row_cells(r) for r in res.rows], (0, 6)),
        "",
        "peak memory (tracemalloc: Python allocations only, not SQLite's C heap; untimed)",
        table(["workload", "deferq peak", "raw peak", "sqlite peak"], mem) if mem else "  (none)",
        "",
        "rates (1 / median):", *rates,
        "setup and derived figures:", *info,
        f"total runtime {runtime_s:.1f} s",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    add_options(parser, list(GROUPS), "workload", DEFAULT_JSON_OUT,
                "smaller sizes and 3 repetitions (about a minute)")
    args = parser.parse_args(argv)
    cfg, groups = config_and_names(parser, args, list(GROUPS), "workload")

    import sqlite3
    started = time.perf_counter()
    meta: dict[str, object] = {
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git("rev-parse", "HEAD"),
        "git_src_dirty": bool(git("status", "--porcelain", "--untracked-files=no", "--", "src")),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "python": sys.version,
        "sqlite": sqlite3.sqlite_version,
        "loadavg_start": loadavg(),
    }
    scratch = Scratch(args.dir)
    log(f"scratch directory {scratch.root}; workloads {', '.join(groups)}")
    res = Results()
    try:
        for group in groups:
            if group == "dead_remove" and "dead_read" in groups:
                continue  # done with dead_read, on the same store
            log(f"== {group}")
            if group == "dead_read" and "dead_remove" in groups:
                bench_dead_reads(cfg, scratch, res, True, True)
            else:
                GROUPS[group](cfg, scratch, res)
    finally:
        scratch.cleanup()
    runtime = time.perf_counter() - started
    meta["loadavg_end"] = loadavg()
    print(report(res, cfg, runtime, meta), flush=True)

    record: dict[str, object] = {
        **meta,
        "mode": cfg.mode,
        "workloads": groups,
        "expected_rows": [key for g in groups for key in ROW_KEYS[g]],
        "config": dataclasses.asdict(cfg),
        "runtime_s": runtime,
        "rows": [row.to_json() for row in res.rows],
        "memory": [m.to_json() for m in res.memory],
        "info": res.info,
    }
    append_json_line(args.json_out, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
