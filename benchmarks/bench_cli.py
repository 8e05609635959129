"""The command line shared by bench_storage.py and bench_floors.py: sizes, repetitions,
scratch directory, JSON output, ``--only``, and the run's provenance (git, load)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

from bench_common import CONFIGS, FULL, Config, log

REPO = Path(__file__).resolve().parent.parent


def add_options(parser: argparse.ArgumentParser, names: Sequence[str], noun: str,
                json_out: Path, quick_help: str) -> None:
    """--quick | --smoke, --only NAME[,NAME] (one of ``names``), --json-out, --dir, --reps."""
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help=quick_help)
    size.add_argument("--smoke", action="store_true",
                      help="tiny sizes, 2 repetitions: checks the benchmark runs (seconds)")
    parser.add_argument("--only", action="append", default=[], metavar="NAME[,NAME]",
                        help=f"run only these {noun}s: {', '.join(names)} (repeatable)")
    parser.add_argument("--json-out", type=Path, default=json_out,
                        help="append one JSON line per run here (default: %(default)s)")
    parser.add_argument("--dir", default=None,
                        help="create the scratch directory under this one (default: /tmp)")
    parser.add_argument("--reps", type=int, default=None,
                        help="override the repetitions of every workload")


def config_and_names(parser: argparse.ArgumentParser, args: argparse.Namespace,
                     names: Sequence[str], noun: str) -> tuple[Config, list[str]]:
    """The sizes chosen and the ``--only`` names (all of ``names`` by default), in their order;
    a bad value is a usage error naming it."""
    cfg = CONFIGS["quick"] if args.quick else CONFIGS["smoke"] if args.smoke else FULL
    if args.reps is not None:
        if args.reps < 1:
            parser.error(f"--reps must be at least 1, got {args.reps}")
        cfg = dataclasses.replace(cfg, reps=args.reps, heavy_reps=args.reps)
    if args.dir is not None and not os.path.isdir(args.dir):
        parser.error(f"--dir {args.dir!r} is not an existing directory")
    chosen = [n.strip() for v in args.only for n in v.split(",") if n.strip()]
    unknown = sorted(set(chosen) - set(names))
    if unknown:
        parser.error(f"--only: unknown {noun} {', '.join(unknown)}; "
                     f"choose from {', '.join(names)}")
    return cfg, [n for n in names if n in chosen] if chosen else list(names)


def git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", "--no-optional-locks", *args], cwd=REPO, capture_output=True,
                              text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def loadavg() -> str:
    try:
        return "/".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def append_json_line(path: Path, record: dict[str, object]) -> None:
    """Append ``record`` as one JSON line to ``path`` (created with its directory if needed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as out:
        out.write(json.dumps(record, sort_keys=True) + "\n")
    log(f"appended results to {path}")
