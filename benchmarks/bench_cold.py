"""Cold operator reads: every sample is a fresh process (issue #17 item 8).

An operator command is a new interpreter each time, so nothing a process keeps (an index,
the caches of a warm ``Disk``) helps it. Each sample here starts ``bench_cold_child.py`` in a
new interpreter for each side (deferq through the CLI's own view and operator, the raw
floor, SQLite), which imports, then times opening the store and its first call; the last
row times a whole ``deferq dead list`` process against whole processes of its peers: the
same read as a plain-Python command (``FLOOR_CLI``, its target's baseline) and SQLite's
page from ``python -c``. Whole processes run with their bytecode caches, as installed.
Peak memory is a separate run of each child under ``tracemalloc``. Rows, baselines and
targets are in docs/benchmarks.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable

import bench_reads as rd
import bench_sqlite as sq
from bench_common import (
    FAKE_PID,
    PAGE,
    PREFIX,
    SEED0,
    Check,
    Config,
    MemRow,
    Results,
    Row,
    Sample,
    Scratch,
    Target,
    fmt_bytes,
    log,
    run_trio,
)

HERE = os.path.dirname(os.path.abspath(__file__))
CHILD = os.path.join(HERE, "bench_cold_child.py")


def child(side: str, op: str, store: str, sqlite_dir: str, arg: str,
          peak: bool = False) -> dict[str, object]:
    done = subprocess.run([sys.executable, CHILD, side, op, store, sqlite_dir, arg,
                           *(["--peak"] if peak else [])],
                          capture_output=True, text=True, check=False, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{side} {op} failed: {done.stderr[-2000:]}")
    out: dict[str, object] = json.loads(done.stdout)
    return out


def _child_sample(side: str, op: str, store: str, sqlite_dir: str, arg: str) -> Sample:
    def sample() -> float:
        seconds = child(side, op, store, sqlite_dir, arg)["s"]
        assert isinstance(seconds, float)
        return seconds
    return sample


# The floor of the whole-process row: the same read as `deferq dead list --limit 50`, as the
# smallest plain-Python command would do it. It parses the same options with argparse, takes
# the dead-task lock file's flock, reads the newest 64 KiB, checks each line's CRC-32, keeps
# each id once, decodes 50 payloads and prints the same table (times in UTC ISO-8601). It
# skips what deferq does besides: the snapshot checks of S-28, the damage accounting, the
# id rules, the strict payload decoder. (A page that does not fit in the chunk is out of
# its scope: the benchmark's records do.)
FLOOR_CLI = """
import argparse, datetime, fcntl, json, os, sys, zlib
p = argparse.ArgumentParser(prog="floor", description="the newest dead tasks")
p.add_argument("--path", required=True, help="storage directory")
p.add_argument("--prefix", default="deferred-", help="file name prefix")
p.add_argument("--limit", type=int, default=50, help="show at most N tasks")
a = p.parse_args()
lock = os.open(os.path.join(a.path, a.prefix + "dead_tasks.lock"), os.O_RDONLY)
fcntl.flock(lock, fcntl.LOCK_EX)
try:
    with open(os.path.join(a.path, a.prefix + "dead_tasks-0"), "rb") as f:
        end = f.seek(0, os.SEEK_END)
        f.seek(max(0, end - 65536))
        data = f.read()
finally:
    fcntl.flock(lock, fcntl.LOCK_UN)
    os.close(lock)
rows, seen = [], set()
for line in reversed(data.split(bytes([10]))[1:-1]):
    crc, _, body = line.partition(b":")
    if b"%08x" % zlib.crc32(body) != crc:
        continue
    _, tid, payload = body.split(b":", 2)
    if tid in seen:
        continue
    seen.add(tid)
    d = json.loads(payload)
    at = datetime.datetime.fromtimestamp(d["failed_at"], datetime.timezone.utc)
    rows.append((tid.decode(), d["task_class"], str(d["attempts"]),
                 at.strftime("%Y-%m-%dT%H:%M:%SZ"),
                 d["exception_class"] + ": " + d["exception_message"].splitlines()[0]))
    if len(rows) == a.limit:
        break
head = ("ID", "TASK CLASS", "ATTEMPTS", "FAILED AT", "EXCEPTION")
widths = [max(len(r[i]) for r in [head, *rows]) for i in range(4)]
for r in [head, *rows]:
    print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[4])
print(f"{len(rows)} dead task(s)")
"""
SQLITE_CLI = """
import sqlite3, sys, json
conn = sqlite3.connect(sys.argv[1])
for tid, body in conn.execute("SELECT id, body FROM dead ORDER BY seq DESC LIMIT 50"):
    json.loads(body)
    print(tid)
"""
# A command runs as an installed package runs: with its bytecode caches (an untimed first
# run of each writes them, even where PYTHONDONTWRITEBYTECODE is set, as bench_import.py).
PROCESS_ENV = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "PYTHONSTARTUP", "PYTHONDONTWRITEBYTECODE")}


def _first_column(out: bytes) -> list[str]:
    """The ids a whole-process side printed: the first word of each line that names one."""
    words = [line.split()[0] for line in out.decode().splitlines() if line.strip()]
    return [w for w in words if "-" in w]


def _process_run(argv: list[str]) -> bytes:
    done = subprocess.run(argv, capture_output=True, check=False, timeout=600, env=PROCESS_ENV)
    if done.returncode != 0:
        raise RuntimeError(f"{argv[:4]} failed: {done.stderr[-2000:]!r}")
    return done.stdout


def _process_sample(argv: list[str]) -> Sample:
    def sample() -> float:
        start = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, check=False, timeout=600,
                              env=PROCESS_ENV)
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            raise RuntimeError(f"{argv[:4]} failed: {done.stderr[-2000:]!r}")
        return seconds
    return sample


def bench_cold(cfg: Config, scratch: Scratch, res: Results) -> None:
    n, off = cfg.store_entries, cfg.list_offset
    size = f"{n // 1000}k" if n >= 1000 else str(n)
    store, sqlite_dir = scratch.new("cold-store"), scratch.new("cold-store-sqlite")
    log(f"building a {n:,}-entry dead-task store for the cold rows ...")
    ids = rd.build_dead_store(store, sqlite_dir, n)
    # A store a worker wrote has its lock file; a reading command refuses one without it (S-32).
    os.close(os.open(os.path.join(store, f"{PREFIX}dead_tasks.lock"), os.O_CREAT | os.O_WRONLY, 0o600))
    recent, missing = ids[-10], f"{SEED0}-{FAKE_PID}-no-such-task"
    rows: list[tuple[str, str, str, str, Target]] = [
        ("cold_list_newest", f"list newest {PAGE} of {size}, cold (fresh process)", "newest", "",
         Target("<= 2x SQLite (cold)", (Check("sqlite", 2.0),))),
        ("cold_list_offset_first",
         f"list {PAGE} at offset {off:,} of {size}, cold, no index cache (fresh process)",
         "offset-first", str(off),
         Target("<= 3x raw forward scan (cold)", (Check("raw", 3.0),))),
        ("cold_list_offset", f"list {PAGE} at offset {off:,} of {size}, cold (fresh process)",
         "offset", str(off), Target("<= 3x raw forward scan (cold)", (Check("raw", 3.0),))),
        ("cold_find_recent", f"find recent id of {size}, cold (fresh process)", "find", recent,
         Target("<= 2x SQLite (cold)", (Check("sqlite", 2.0),))),
        ("cold_find_missing", f"find missing id of {size}, cold (fresh process)", "find",
         missing, Target("<= 1.2x raw scan (cold)", (Check("raw", 1.2),))),
        ("cold_stats_first", f"stats of {size}, cold, no index cache (fresh process)",
         "stats-first", "", Target("<= 3x raw decode of every line (cold)", (Check("raw", 3.0),))),
        ("cold_stats", f"stats of {size}, cold (fresh process)", "stats", "",
         Target("<= 3x raw decode of every line (cold)", (Check("raw", 3.0),))),
    ]
    try:
        log("checking the answers and measuring peak memory (tracemalloc, in each child) ...")
        for key, label, op, arg, _ in rows:  # every side must give the same answer first
            runs = {side: child(side, op, store, sqlite_dir, arg, peak=True)
                    for side in ("deferq", "raw", "sqlite")}
            answers = [run["answer"] for run in runs.values()]
            if answers[0] != answers[1] or answers[0] != answers[2]:
                raise AssertionError(f"{key} disagrees: {[str(a)[:80] for a in answers]}")
            peaks = {side: int(str(run["peak"])) for side, run in runs.items()}
            res.memory.append(MemRow(key, label, peaks))
            log(f"  {label}: " + ", ".join(f"{s} {fmt_bytes(v)}" for s, v in peaks.items()))
        reps = 1 if cfg.mode == "smoke" else cfg.reps  # each sample is three processes
        for key, label, op, arg, target in rows:
            res.rows.append(run_trio(
                Row(key, label, "call", target), reps,
                *(_child_sample(side, op, store, sqlite_dir, arg)
                  for side in ("deferq", "raw", "sqlite"))))
        data_path = os.path.join(store, f"{PREFIX}dead_tasks-0")
        db = os.path.join(sqlite_dir, sq.SQLITE_FILE)
        argvs = [[sys.executable, "-m", "deferq", "dead", "list", "--path", store,
                  "--limit", str(PAGE)],
                 [sys.executable, "-c", FLOOR_CLI, "--path", store, "--limit", str(PAGE)],
                 [sys.executable, "-c", SQLITE_CLI, db]]
        printed = [_first_column(_process_run(argv)) for argv in argvs]  # also the warm-up
        if not printed[0] or printed[0] != printed[1] or printed[0] != printed[2]:
            raise AssertionError(f"cold_cli_list disagrees: {[p[:3] for p in printed]}")
        res.rows.append(run_trio(
            Row("cold_cli_list", f"`deferq dead list --limit {PAGE}` of {size}, whole process",
                "call", Target("<= 2x plain-Python floor process",
                               (Check("raw", 2.0),))),
            reps, *(_process_sample(argv) for argv in argvs)))
        res.info["cold_store_bytes"] = os.path.getsize(data_path)
    finally:
        scratch.remove(store)
        scratch.remove(sqlite_dir)


COLD_ROW_KEYS: tuple[str, ...] = ("cold_list_newest", "cold_list_offset_first",
                                  "cold_list_offset", "cold_find_recent",
                                  "cold_find_missing", "cold_stats_first", "cold_stats",
                                  "cold_cli_list")
COLD: dict[str, Callable[[Config, Scratch, Results], None]] = {"cold": bench_cold}
