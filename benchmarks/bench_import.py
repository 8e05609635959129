#!/usr/bin/env python3
"""Import time of deferq and of an operator command, in fresh processes, against bare Python.

Usage::

    .venv/bin/python benchmarks/bench_import.py [--smoke] [--runs N] [--json-out FILE]

Each command runs in a new interpreter (the same one as this script) from a scratch
directory, so neither the checkout nor a warm interpreter helps it: ``python -c pass`` (the
baseline: interpreter start-up and site), ``python -c "import deferq"``, ``python -c "import
deferq._cli"`` and a whole ``python -m deferq stats --path P`` on a small store. After one
untimed warm-up of each (it writes the bytecode caches, even under PYTHONDONTWRITEBYTECODE, as
an installed wheel has them; and warms the page cache), the commands run in rotation N times and
each is reported as the median wall time, the difference from the baseline, and the ratio to
it. One more untimed run of each under ``-X importtime`` lists the deferq modules it loads;
none may be a harness module (deferq.crashtest, deferq.powertest, deferq._demos): the exit
status is 1 if one is. See docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HARNESS = ("deferq.crashtest", "deferq.powertest", "deferq._demos")


@dataclasses.dataclass(frozen=True)
class Row:
    command: str
    args: list[str]
    samples_s: list[float]
    median_s: float
    extra_s: float  # median - the baseline's median
    ratio: float  # median / the baseline's median
    deferq_modules: list[str]
    harness_modules: list[str]


def commands(store: str) -> list[tuple[str, list[str]]]:
    """(label, interpreter arguments) of each command, the baseline first."""
    return [
        ('python -c "pass"', ["-c", "pass"]),
        ('python -c "import deferq"', ["-c", "import deferq"]),
        ('python -c "import deferq._cli"', ["-c", "import deferq._cli"]),
        ("python -m deferq stats --path P", ["-m", "deferq", "stats", "--path", store]),
    ]


def make_store(path: str) -> None:
    """A small store: a few pending tasks and dead tasks (stats reads both)."""
    from deferq.backends import Disk

    with Disk(path=path) as disk:
        ids = [disk.add_task(b'{"n": %d}' % n) for n in range(20)]
        for task_id in ids[:5]:
            disk.add_dead_task(task_id, b"{}", RuntimeError("gave up"), task_class="Bench",
                               attempts=3)
            disk.remove_task(task_id)


def run_once(args: list[str], cwd: str, env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, *args], cwd=cwd, env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def deferq_modules(args: list[str], cwd: str, env: dict[str, str]) -> list[str]:
    """The deferq modules the command imports, from ``-X importtime`` (one line per import)."""
    done = subprocess.run([sys.executable, "-X", "importtime", *args], cwd=cwd, env=env,
                          check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True)
    names = set()
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and line.count("|") == 2:
            name = line.rsplit("|", 1)[1].strip()
            if name == "deferq" or name.startswith("deferq."):
                names.add(name)
    if args[:2] == ["-m", "deferq"]:
        names.add("deferq.__main__")  # run by runpy, not imported: importtime does not list it
    return sorted(names)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--smoke", action="store_true",
                        help="3 runs of each command: checks the benchmark runs (seconds)")
    parser.add_argument("--runs", type=int, default=None,
                        help="timed runs of each command (default 21; --smoke: 3)")
    parser.add_argument("--json-out", type=Path, default=None,
                        help="also append one JSON line with the figures to this file")
    args = parser.parse_args(argv)
    runs = args.runs if args.runs is not None else 3 if args.smoke else 21
    if runs < 1:
        parser.error(f"--runs must be at least 1, got {runs}")

    # Without PYTHONDONTWRITEBYTECODE, so the warm-up writes the bytecode caches an installed
    # wheel has (pip compiles at install): otherwise every run compiles deferq from source.
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONSTARTUP", "PYTHONDONTWRITEBYTECODE")}
    with tempfile.TemporaryDirectory(prefix="deferq-bench-import-") as scratch:
        make_store(os.path.join(scratch, "store"))
        cases = commands("store")
        load_start = os.getloadavg()
        for _, case in cases:  # warm-up, untimed
            run_once(case, scratch, env)
        samples: list[list[float]] = [[] for _ in cases]
        for n in range(runs):  # rotate the order so no command always follows another
            for i in range(len(cases)):
                k = (i + n) % len(cases)
                samples[k].append(run_once(cases[k][1], scratch, env))
        modules = [deferq_modules(case, scratch, env) for _, case in cases]
        load_end = os.getloadavg()

    base = statistics.median(samples[0])
    rows = []
    for (label, case), times, loaded in zip(cases, samples, modules, strict=True):
        median = statistics.median(times)
        harness = [m for m in loaded if any(m == h or m.startswith(h + ".") for h in HARNESS)]
        rows.append(Row(label, case, times, median, median - base, median / base, loaded,
                        harness))

    width = max(len(r.command) for r in rows)
    print(f"deferq import time: median of {runs} fresh processes each, Python "
          f"{platform.python_version()}, {os.cpu_count()} CPUs, load "
          f"{'/'.join(f'{x:.2f}' for x in load_start)} -> "
          f"{'/'.join(f'{x:.2f}' for x in load_end)}")
    print(f"{'command':<{width}} | median ms | extra ms | vs baseline | deferq modules | harness")
    for r in rows:
        print(f"{r.command:<{width}} | {r.median_s * 1e3:9.1f} | {r.extra_s * 1e3:8.1f} | "
              f"{r.ratio:10.2f}x | {len(r.deferq_modules):14d} | "
              f"{', '.join(r.harness_modules) or 'none'}")
    if args.json_out is not None:
        record = {"kind": "import", "mode": "smoke" if args.smoke else "full", "runs": runs,
                  "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                  "python": sys.version, "rows": [dataclasses.asdict(r) for r in rows]}
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        with args.json_out.open("a", encoding="utf-8") as out:
            out.write(json.dumps(record, sort_keys=True) + "\n")
    bad = [r.command for r in rows if r.harness_modules]
    if bad:
        print(f"FAILURE: harness modules loaded by {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
