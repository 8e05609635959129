"""One cold measurement of bench_cold.py, run in a fresh interpreter.

Usage: python bench_cold_child.py SIDE OP STORE SQLITE_DIR ARG [--peak]

OPs ``offset-first`` and ``stats-first`` are ``offset`` and ``stats`` with deferq's index
cache removed first (untimed), so the call builds the index and writes the cache (S-72, S-86).

Imports happen first and are not timed (bench_import.py measures them); then the clock
starts before the store, file or connection is opened and stops after the first call
returns: what an operator command pays besides its start-up. Prints one JSON object:
{"s": seconds, "peak": tracemalloc peak bytes (with --peak, else 0), "answer": ...}.
"""

from __future__ import annotations

import json
import os
import sys
import time
import tracemalloc
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_reads as rd  # noqa: E402
import bench_sqlite as sq  # noqa: E402
from bench_common import PAGE, PREFIX  # noqa: E402
from deferq._cli.dead import DeadStoreView  # noqa: E402
from deferq._core.names import dead_cache_name, dead_data_name  # noqa: E402
from deferq._runtime.operator import Operator  # noqa: E402

CHUNK = 1 << 20


def raw_forward_page(data_path: str, limit: int, offset: int) -> list[str]:
    """The raw floor of a deep page read forward: count the lines in one pass (C-level
    ``count``), then read forward again to the page's first line and decode the page
    (no CRC, no deduplication)."""
    with open(data_path, "rb") as f:
        total = 0
        while chunk := f.read(CHUNK):
            total += chunk.count(b"\n")
        first = max(0, total - offset - limit)  # the page's oldest line, counted from 0
        stop = total - offset
        f.seek(0)
        line_no, carry, out = 0, b"", []
        while line_no < stop and (chunk := f.read(CHUNK)):
            buf = carry + chunk
            count = buf.count(b"\n")
            if line_no + count <= first:
                line_no += count
                carry = buf[buf.rfind(b"\n") + 1:]
                continue
            lines = buf.split(b"\n")
            carry = lines.pop()
            for line in lines:
                if first <= line_no < stop:
                    _, _, tid, body = line.split(b":", 3)
                    json.loads(body)
                    out.append(tid.decode("utf-8"))
                line_no += 1
        out.reverse()
        return out


def raw_stats(data_path: str) -> int:
    """The raw floor of stats: every line's JSON decoded, counted by class (no CRC)."""
    by_class: Counter[str] = Counter()
    by_exception: Counter[str] = Counter()
    with open(data_path, "rb") as f:
        carry = b""
        while chunk := f.read(CHUNK):
            lines = (carry + chunk).split(b"\n")
            carry = lines.pop()
            for line in lines:
                body = json.loads(line.split(b":", 3)[3])
                by_class[body["task_class"]] += 1
                by_exception[body["exception_class"]] += 1
    return sum(by_class.values())


def run(side: str, op: str, store: str, sqlite_dir: str, arg: str) -> object:
    data_path = os.path.join(store, dead_data_name(PREFIX))
    if side == "deferq":
        view = DeadStoreView(store, PREFIX, read_only=True)  # as stats, dead list, dead show
        try:
            operator = Operator(view)
            if op == "newest":
                return [t.id for t in operator.list_dead(limit=PAGE)]
            if op in ("offset", "offset-first"):
                return [t.id for t in operator.list_dead(limit=PAGE, offset=int(arg))]
            if op == "find":
                task = operator.find_dead(arg)
                return None if task is None else task.id
            if op in ("stats", "stats-first"):
                return operator.dead_stats()["dead_tasks"]
        finally:
            view.close()
    if side == "raw":
        if op == "newest":
            return [i for i, _ in rd.raw_list(data_path, PAGE, 0)]
        if op in ("offset", "offset-first"):
            return raw_forward_page(data_path, PAGE, int(arg))
        if op == "find":
            found = rd.raw_find(data_path, arg)
            return None if found is None else found[0]
        if op in ("stats", "stats-first"):
            return raw_stats(data_path)
    if side == "sqlite":
        conn = sq.connect(sqlite_dir, "NORMAL")
        try:
            if op == "newest":
                return [i for i, _ in sq.list_dead(conn, PAGE, 0)]
            if op in ("offset", "offset-first"):
                return [i for i, _ in sq.list_dead(conn, PAGE, int(arg))]
            if op == "find":
                found = sq.find_dead(conn, arg)
                return None if found is None else found[0]
            if op in ("stats", "stats-first"):
                rows = conn.execute(
                    "SELECT json_extract(body, '$.task_class'), count(*) FROM dead GROUP BY 1"
                ).fetchall()
                conn.execute("SELECT json_extract(body, '$.exception_class'), count(*)"
                             " FROM dead GROUP BY 1").fetchall()
                return sum(n for _, n in rows)
        finally:
            conn.close()
    raise SystemExit(f"unknown side/op {side}/{op}")


def main(argv: list[str]) -> int:
    side, op, store, sqlite_dir, arg = argv[:5]
    peak = "--peak" in argv[5:]
    if side == "deferq" and op.endswith("-first"):  # no index cache yet: this call builds it
        cache = os.path.join(store, dead_cache_name(PREFIX))
        if os.path.exists(cache):
            os.unlink(cache)
    if peak:
        tracemalloc.start()
    start = time.perf_counter()
    answer = run(side, op, store, sqlite_dir, arg)
    seconds = time.perf_counter() - start
    print(json.dumps({"s": seconds, "peak": tracemalloc.get_traced_memory()[1] if peak else 0,
                      "answer": answer}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
