#!/usr/bin/env python3
"""Benchmark deferq's storage engine against plain-syscall baselines, in one run.

Usage::

    .venv/bin/python benchmarks/bench_storage.py [--quick] [--json-out FILE] [--dir DIR] [--reps N]

Every workload runs deferq and its baseline alternately, repetition by
repetition (deferq first on even repetitions, the baseline first on odd ones),
so both sides see the same machine state. Shared machines are noisy: compare
ratios from one run, never absolute numbers across runs. A ratio is the median
of the per-repetition ratios deferq time / baseline time, so 2.0 means deferq
takes twice as long (half the rate) and 0.5 means it is twice as fast.

Peak memory is measured in separate, untimed passes under ``tracemalloc``
(which slows code down), one pass per side.

Results: a table on stdout, progress on stderr, and one JSON line per run
appended to ``--json-out`` (default ``benchmarks/results.jsonl``; do not commit it).
See docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import fcntl
import gc
import json
import os
import platform
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

from deferq._format import (
    dead_data_name,
    encode_add,
    encode_dead,
    encode_rem,
    wal_file_name,
)
from deferq._types import DeadTask
from deferq.backends import Disk, exception_backtrace, exception_class_name

PREFIX = "deferred-"  # Disk's default prefix
SEED0 = 1_796_169_600  # 2026-12-02T00:00:00Z: the leading "seed" second of the ids we write
FAKE_PID = 4242
TASK_CLASS = "billing.jobs.ChargeCard"
ATTEMPTS = 21
DEAD_CONTEXT_BYTES = 200
WAL_CONTEXT_BYTES = 120
PAGE = 50
SLOW_CALL_S = 0.25  # a read op slower than this runs heavy_reps times instead of reps
REPO = Path(__file__).resolve().parent.parent
DEFAULT_JSON_OUT = Path(__file__).resolve().parent / "results.jsonl"

Sample = Callable[[], float]


# ----------------------------------------------------------------------------- configuration


@dataclasses.dataclass(frozen=True)
class Config:
    mode: str
    reps: int  # repetitions of the cheap workloads (adds, list/find)
    heavy_reps: int  # repetitions of remove, replay and read ops slower than SLOW_CALL_S
    dead_adds: int
    wal_tasks: int  # WAL adds with the default fsync cadence (no fsync per op)
    wal_sync_tasks: int  # WAL adds with fsync_frequency=0
    store_entries: int
    list_offset: int
    remove_many: int
    replay_adds: int
    replay_live: int
    sample_target_s: float  # fast read ops are repeated until a sample lasts about this long

    @property
    def replay_records(self) -> int:
        return 2 * self.replay_adds - self.replay_live


FULL = Config(mode="full", reps=5, heavy_reps=3, dead_adds=2_000, wal_tasks=20_000,
              wal_sync_tasks=2_000, store_entries=100_000, list_offset=90_000, remove_many=1_000,
              replay_adds=500_000, replay_live=100_000, sample_target_s=0.05)
QUICK = Config(mode="quick", reps=3, heavy_reps=3, dead_adds=300, wal_tasks=3_000,
               wal_sync_tasks=300, store_entries=10_000, list_offset=9_000, remove_many=1_000,
               replay_adds=50_000, replay_live=10_000, sample_target_s=0.02)


# ----------------------------------------------------------------------------- results


@dataclasses.dataclass
class Row:
    """One workload: per-repetition seconds (per op, or per call) for both sides."""

    key: str
    label: str
    per: str  # "op", "task" or "call"
    deferq: list[float] = dataclasses.field(default_factory=list)
    baseline: list[float] = dataclasses.field(default_factory=list)
    calls_per_sample: tuple[int, int] = (1, 1)

    @property
    def ratios(self) -> list[float]:
        return [d / b for d, b in zip(self.deferq, self.baseline, strict=True) if b > 0]

    def to_json(self) -> dict[str, object]:
        return {
            "key": self.key,
            "label": self.label,
            "per": self.per,
            "reps": len(self.deferq),
            "deferq_median_s": statistics.median(self.deferq),
            "baseline_median_s": statistics.median(self.baseline),
            "ratio_median": statistics.median(self.ratios),
            # Rates (per second) for the throughput rows: 1 / median seconds per op or task.
            "deferq_rate_per_s": None if self.per == "call" else 1 / statistics.median(self.deferq),
            "baseline_rate_per_s": (None if self.per == "call"
                                    else 1 / statistics.median(self.baseline)),
            "deferq_s": self.deferq,
            "baseline_s": self.baseline,
            "ratios": self.ratios,
            "calls_per_sample": list(self.calls_per_sample),
        }


@dataclasses.dataclass
class MemRow:
    key: str
    label: str
    deferq_bytes: int
    baseline_bytes: int

    def to_json(self) -> dict[str, object]:
        return {"key": self.key, "label": self.label, "deferq_peak_bytes": self.deferq_bytes,
                "baseline_peak_bytes": self.baseline_bytes,
                "ratio": self.deferq_bytes / self.baseline_bytes if self.baseline_bytes else None}


@dataclasses.dataclass
class Results:
    rows: list[Row] = dataclasses.field(default_factory=list)
    memory: list[MemRow] = dataclasses.field(default_factory=list)
    info: dict[str, float] = dataclasses.field(default_factory=dict)  # sizes and setup times


# ----------------------------------------------------------------------------- helpers


_T0 = time.perf_counter()


def log(message: str) -> None:
    print(f"[{time.perf_counter() - _T0:6.1f}s] {message}", file=sys.stderr, flush=True)


class Scratch:
    """Fresh directory names under one temporary root, removed at the end."""

    def __init__(self, parent: str | None) -> None:
        self.root = tempfile.mkdtemp(prefix="deferq-bench-", dir=parent or "/tmp")
        self._count = 0

    def new(self, tag: str) -> str:
        self._count += 1
        return os.path.join(self.root, f"{tag}-{self._count}")

    def fresh_dir(self, tag: str) -> str:
        path = self.new(tag)
        os.makedirs(path)
        return path

    @staticmethod
    def remove(path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def cleanup(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def copy_durably(src: str, dst: str) -> None:
    """Copy and fsync, so no dirty pages of the setup are flushed during a timed section."""
    shutil.copyfile(src, dst)
    fd = os.open(dst, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(os.path.dirname(dst))


def run_pair(row: Row, reps: int, deferq: Sample, baseline: Sample) -> Row:
    """Run both sides ``reps`` times, alternating which goes first."""
    for rep in range(reps):
        sides: list[tuple[list[float], Sample]] = [(row.deferq, deferq), (row.baseline, baseline)]
        if rep % 2:
            sides.reverse()
        for out, fn in sides:
            gc.collect()
            out.append(fn())
        log(f"  {row.label}: rep {rep + 1}/{reps} deferq {fmt_s(row.deferq[-1])} "
            f"baseline {fmt_s(row.baseline[-1])}")
    return row


def repeat_call(fn: Callable[[], object], number: int) -> float:
    """Mean seconds per call over ``number`` back-to-back calls."""
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - start) / number


def repeated(fn: Callable[[], object], number: int) -> Sample:
    """A sample: mean seconds per call over ``number`` calls of ``fn``."""
    return lambda: repeat_call(fn, number)


def bind(op: Callable[[Disk], object], disk: Disk) -> Callable[[], object]:
    return lambda: op(disk)


def calls_for(fn: Callable[[], object], target_s: float) -> tuple[int, float]:
    """Warm ``fn`` up with one call; return how many calls make a sample of about
    ``target_s``, and how long that one call took."""
    once = repeat_call(fn, 1)
    return max(1, min(500, int(target_s / max(once, 1e-7)))), once


def peak_bytes(fn: Callable[[], object]) -> int:
    """Peak bytes allocated by Python while ``fn`` runs (its result included)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        result = fn()
        peak = tracemalloc.get_traced_memory()[1]
        del result
    finally:
        tracemalloc.stop()
    return peak - before


def fmt_s(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1.0:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def fmt_bytes(count: int) -> str:
    if count < 1024 * 1024:
        return f"{count / 1024:.1f} KiB"
    return f"{count / (1024 * 1024):.1f} MiB"


def make_exception() -> BaseException:
    """A real exception with a five-frame traceback, as a failing task would raise."""

    def level(depth: int) -> None:
        if depth == 0:
            raise RuntimeError("card declined: insufficient funds (order 4242, gateway 402)")
        level(depth - 1)

    try:
        level(4)
    except RuntimeError as exc:
        return exc
    raise AssertionError("unreachable")


@dataclasses.dataclass(frozen=True)
class Failure:
    """What ``Disk.add_dead_task`` extracts from an exception, extracted once."""

    exception_class: str
    message: str
    backtrace: tuple[str, ...]

    @classmethod
    def of(cls, exc: BaseException) -> Failure:
        return cls(exception_class_name(exc), str(exc), exception_backtrace(exc))


def dead_task(task_id: str, failure: Failure, context: bytes, message: str | None = None,
              failed_at: int | None = None) -> DeadTask:
    """The DeadTask ``Disk.add_dead_task`` would build for these arguments."""
    seed = int(task_id.split("-", 1)[0])
    return DeadTask(
        id=task_id,
        task_class=TASK_CLASS,
        attempts=ATTEMPTS,
        enqueued_at=seed,
        failed_at=int(time.time()) if failed_at is None else failed_at,
        exception_class=failure.exception_class,
        exception_message=failure.message if message is None else message,
        backtrace=failure.backtrace,
        context=context,
    )


def generated_id(counter: int) -> str:
    """An id the size of the ones deferq generates: ``{seed}-{pid}-{n}``."""
    return f"{int(time.time())}-{os.getpid()}-{counter}"


# ----------------------------------------------------------------------------- 1. dead-task adds


def bench_dead_add(cfg: Config, scratch: Scratch, res: Results) -> None:
    n = cfg.dead_adds
    exc = make_exception()
    context = random.Random(1).randbytes(DEAD_CONTEXT_BYTES)
    ids = [f"{SEED0 + i}-{FAKE_PID}-{i}" for i in range(n)]
    failure = Failure.of(exc)
    lines = [encode_dead(dead_task(tid, failure, context)) for tid in ids]
    res.info["dead_add_line_bytes"] = len(lines[0])

    def deferq() -> float:
        path = scratch.new("dead-add-deferq")
        disk = Disk(path=path, fsync_frequency=0)  # the WAL stays empty; 0 means no ticker thread
        try:
            start = time.perf_counter()
            for tid in ids:
                disk.add_dead_task(tid, context, exc, task_class=TASK_CLASS, attempts=ATTEMPTS)
            elapsed = time.perf_counter() - start
        finally:
            disk.close()
            scratch.remove(path)
        return elapsed / n

    def baseline() -> float:
        path = scratch.fresh_dir("dead-add-raw")
        lock_fd = os.open(os.path.join(path, "raw.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        fd = os.open(os.path.join(path, "raw.data"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        fsync_dir(path)
        try:
            start = time.perf_counter()
            for line in lines:
                fcntl.flock(lock_fd, fcntl.LOCK_EX)
                os.write(fd, line)
                os.fsync(fd)
                fcntl.flock(lock_fd, fcntl.LOCK_UN)
            elapsed = time.perf_counter() - start
        finally:
            os.close(fd)
            os.close(lock_fd)
            scratch.remove(path)
        return elapsed / n

    res.rows.append(run_pair(
        Row("dead_add", f"dead add, fsync each ({n})", "op"), cfg.reps, deferq, baseline))


# ----------------------------------------------------------------------------- 2. WAL adds


def bench_wal(cfg: Config, scratch: Scratch, res: Results) -> None:
    context = random.Random(2).randbytes(WAL_CONTEXT_BYTES)

    def raw_lines(n: int) -> tuple[list[bytes], list[bytes]]:
        ids = [generated_id(i + 1) for i in range(n)]
        return [encode_add(t, None, context) for t in ids], [encode_rem(t) for t in ids]

    def raw_file(tag: str) -> tuple[str, int]:
        path = scratch.fresh_dir(tag)
        fd = os.open(os.path.join(path, "raw.wal"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        fsync_dir(path)
        return path, fd

    def wal_deferq(n: int, fsync_frequency: float, remove: bool) -> Sample:
        def sample() -> float:
            path = scratch.new("wal-deferq")
            disk = Disk(path=path, fsync_frequency=fsync_frequency)
            try:
                start = time.perf_counter()
                if remove:
                    for _ in range(n):
                        disk.remove_task(disk.add_task(context))
                else:
                    for _ in range(n):
                        disk.add_task(context)
                elapsed = time.perf_counter() - start
            finally:
                disk.close()
                scratch.remove(path)
            return elapsed / n
        return sample

    def wal_raw(n: int, fsync: bool, remove: bool) -> Sample:
        adds, rems = raw_lines(n)

        def sample() -> float:
            path, fd = raw_file("wal-raw")
            try:
                start = time.perf_counter()
                if remove:
                    for add, rem in zip(adds, rems, strict=True):
                        os.write(fd, add)
                        os.write(fd, rem)
                elif fsync:
                    for add in adds:
                        os.write(fd, add)
                        os.fsync(fd)
                else:
                    for add in adds:
                        os.write(fd, add)
                elapsed = time.perf_counter() - start
            finally:
                os.close(fd)
                scratch.remove(path)
            return elapsed / n
        return sample

    res.info["wal_add_line_bytes"] = len(encode_add(generated_id(1), None, context))
    n, n_sync = cfg.wal_tasks, cfg.wal_sync_tasks
    res.rows.append(run_pair(
        Row("wal_add_default", f"WAL add, fsync 0.5 s ({n})", "op"),
        cfg.reps, wal_deferq(n, 0.5, False), wal_raw(n, False, False)))
    res.rows.append(run_pair(
        Row("wal_add_remove_default", f"WAL add+remove, fsync 0.5 s ({n})", "task"),
        cfg.reps, wal_deferq(n, 0.5, True), wal_raw(n, False, True)))
    res.rows.append(run_pair(
        Row("wal_add_fsync0", f"WAL add, fsync each ({n_sync})", "op"),
        cfg.reps, wal_deferq(n_sync, 0, False), wal_raw(n_sync, True, False)))


# ----------------------------------------------------------------------------- 3. dead-task store reads and removes


def build_dead_store(directory: str, entries: int) -> list[str]:
    """Write a dead-task data file of ``entries`` records directly with the codec."""
    failure = Failure.of(make_exception())
    context = random.Random(3).randbytes(DEAD_CONTEXT_BYTES)
    ids = [f"{SEED0 + i // 50}-{FAKE_PID}-{i + 1}" for i in range(entries)]
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, dead_data_name(PREFIX)), "wb") as out:
        for start in range(0, entries, 10_000):
            out.write(b"".join(
                encode_dead(dead_task(tid, failure, context,
                                      message=f"card declined for order {start + k}: insufficient funds",
                                      failed_at=SEED0 + 86_400))
                for k, tid in enumerate(ids[start:start + 10_000])))
        out.flush()
        os.fsync(out.fileno())
    return ids


def raw_read_lines(data_path: str) -> list[bytes]:
    with open(data_path, "rb") as f:
        data = f.read()
    return data.split(b"\n")


def raw_list(data_path: str, limit: int, offset: int) -> list[object]:
    """Baseline list: read the whole file, split it, decode the page's JSON (no dedup, no CRC)."""
    lines = raw_read_lines(data_path)
    if lines and not lines[-1]:
        lines.pop()
    end = max(0, len(lines) - offset)
    page = lines[max(0, end - limit):end]
    page.reverse()
    out: list[object] = []
    for line in page:
        obj: object = json.loads(line.split(b":", 3)[3])
        out.append(obj)
    return out


def raw_find(data_path: str, task_id: str) -> object:
    """Baseline find: read the whole file, split it, scan newest first by id, decode the match."""
    needle = b"dead_task:" + task_id.encode("utf-8") + b":"
    for line in reversed(raw_read_lines(data_path)):
        if line.startswith(needle, 9):
            obj: object = json.loads(line[9 + len(needle):])
            return obj
    return None


def raw_remove(directory: str, ids: set[bytes]) -> int:
    """Baseline remove: read all, drop the ids, write tmp, fsync, rename, fsync the directory."""
    data_path = os.path.join(directory, dead_data_name(PREFIX))
    tmp_path = data_path + ".tmp"
    lines = raw_read_lines(data_path)
    keep = [line for line in lines if line and line[19:line.find(b":", 19)] not in ids]
    fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        if keep:
            keep.append(b"")
            write_all(fd, b"\n".join(keep))
            keep.pop()
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp_path, data_path)
    fsync_dir(directory)
    return sum(1 for line in lines if line) - len(keep)


def bench_dead_store(cfg: Config, scratch: Scratch, res: Results) -> None:
    n = cfg.store_entries
    master = scratch.new("dead-store")
    log(f"building a {n:,}-entry dead-task store ...")
    start = time.perf_counter()
    ids = build_dead_store(master, n)
    data_path = os.path.join(master, dead_data_name(PREFIX))
    res.info["dead_store_build_s"] = time.perf_counter() - start
    res.info["dead_store_bytes"] = os.path.getsize(data_path)
    log(f"  built in {res.info['dead_store_build_s']:.2f} s, "
        f"{fmt_bytes(os.path.getsize(data_path))}")

    recent, oldest, missing = ids[-10], ids[0], f"{SEED0}-{FAKE_PID}-no-such-task"
    off = cfg.list_offset
    reads: list[tuple[str, str, Callable[[Disk], object], Callable[[], object]]] = [
        ("list_newest", f"list newest {PAGE}",
         lambda d: d.list_dead_tasks(limit=PAGE), lambda: raw_list(data_path, PAGE, 0)),
        ("list_offset", f"list {PAGE} at offset {off:,}",
         lambda d: d.list_dead_tasks(limit=PAGE, offset=off),
         lambda: raw_list(data_path, PAGE, off)),
        ("find_recent", "find recent id (10th newest)",
         lambda d: d.find_dead_task(recent), lambda: raw_find(data_path, recent)),
        ("find_oldest", "find oldest id",
         lambda d: d.find_dead_task(oldest), lambda: raw_find(data_path, oldest)),
        ("find_missing", "find missing id",
         lambda d: d.find_dead_task(missing), lambda: raw_find(data_path, missing)),
    ]

    disk = Disk(path=master, fsync_frequency=0)
    try:
        # Both sides must answer the same question before anything is timed.
        newest = disk.list_dead_tasks(limit=PAGE)
        assert [t.id for t in newest] == ids[::-1][:PAGE], "list newest disagrees"
        page = disk.list_dead_tasks(limit=PAGE, offset=off)
        assert [t.id for t in page] == ids[::-1][off:off + PAGE], "list at offset disagrees"
        for task_id in (recent, oldest):
            found = disk.find_dead_task(task_id)
            assert found is not None and found.id == task_id
            raw = raw_find(data_path, task_id)
            assert isinstance(raw, dict) and raw.get("id") == task_id
        assert disk.find_dead_task(missing) is None and raw_find(data_path, missing) is None

        for key, label, op, raw_op in reads:
            bound = bind(op, disk)
            calls_d, once_d = calls_for(bound, cfg.sample_target_s)
            calls_b, once_b = calls_for(raw_op, cfg.sample_target_s)
            # Whole-file scans by deferq are slow: fewer repetitions keep the run short.
            reps = cfg.heavy_reps if max(once_d, once_b) >= SLOW_CALL_S else cfg.reps
            row = Row(f"dead_{key}", f"{label} of {n // 1000}k", "call",
                      calls_per_sample=(calls_d, calls_b))
            res.rows.append(run_pair(row, reps, repeated(bound, calls_d),
                                     repeated(raw_op, calls_b)))

        log("measuring peak memory of list/find (tracemalloc) ...")
        for key, label, op, raw_op in reads:
            res.memory.append(MemRow(f"dead_{key}", f"{label} of {n // 1000}k",
                                     peak_bytes(bind(op, disk)), peak_bytes(raw_op)))
    finally:
        disk.close()

    bench_dead_remove(cfg, scratch, res, data_path, ids)
    scratch.remove(master)


def bench_dead_remove(cfg: Config, scratch: Scratch, res: Results, master_data: str,
                      ids: list[str]) -> None:
    n = len(ids)
    step = max(1, n // cfg.remove_many)
    cases = [("dead_remove_1", "remove 1 id", [ids[n // 2]]),
             (f"dead_remove_{cfg.remove_many}", f"remove {cfg.remove_many:,} ids",
              ids[step // 2::step][:cfg.remove_many])]

    def fresh_copy(tag: str) -> str:
        path = scratch.fresh_dir(tag)
        copy_durably(master_data, os.path.join(path, dead_data_name(PREFIX)))
        return path

    for key, label, victims in cases:
        wanted = set(victims)
        raw_wanted = {v.encode("utf-8") for v in victims}

        def deferq(wanted: set[str] = wanted) -> float:
            path = fresh_copy("remove-deferq")
            disk = Disk(path=path, fsync_frequency=0)
            try:
                start = time.perf_counter()
                found = disk.remove_dead_tasks(wanted)
                elapsed = time.perf_counter() - start
            finally:
                disk.close()
                scratch.remove(path)
            assert found == len(wanted), (found, len(wanted))
            return elapsed

        def baseline(wanted: set[bytes] = raw_wanted) -> float:
            path = fresh_copy("remove-raw")
            try:
                start = time.perf_counter()
                found = raw_remove(path, wanted)
                elapsed = time.perf_counter() - start
            finally:
                scratch.remove(path)
            assert found == len(wanted), (found, len(wanted))
            return elapsed

        res.rows.append(run_pair(Row(key, f"{label} of {n // 1000}k", "call"),
                                 cfg.heavy_reps, deferq, baseline))


# ----------------------------------------------------------------------------- 4. replay at start


def build_orphan_wal(path: str, adds: int, live: int) -> None:
    """Write ``adds`` add records and ``adds - live`` removes (oldest first): FIFO traffic."""
    context = random.Random(4).randbytes(WAL_CONTEXT_BYTES)

    def tid(i: int) -> str:
        return f"{SEED0 + i // 1000}-{FAKE_PID}-{i + 1}"

    def records() -> Iterator[bytes]:
        for i in range(adds):
            yield encode_add(tid(i), SEED0 + 3_600 if i % 10 == 0 else None, context)
            if i >= live:
                yield encode_rem(tid(i - live))

    with open(path, "wb") as out:
        batch: list[bytes] = []
        for line in records():
            batch.append(line)
            if len(batch) >= 20_000:
                out.write(b"".join(batch))
                batch.clear()
        out.write(b"".join(batch))
        out.flush()
        os.fsync(out.fileno())


def raw_replay(path: str) -> dict[bytes, bytes]:
    """Baseline replay: read the file, split lines, keep a dict id -> add line, apply removes."""
    with open(path, "rb") as f:
        data = f.read()
    live: dict[bytes, bytes] = {}
    for line in data.split(b"\n"):
        if not line:
            continue
        if line[9:12] == b"add":
            live[line[13:line.index(b":", 13)]] = line
        else:
            live.pop(line[13:], None)
    return live


def bench_replay(cfg: Config, scratch: Scratch, res: Results) -> None:
    directory = scratch.fresh_dir("replay")
    wal = os.path.join(directory, wal_file_name(PREFIX, "20261201", FAKE_PID, 0xBE7C4))
    log(f"building an orphan WAL of {cfg.replay_records:,} records, {cfg.replay_live:,} live ...")
    start = time.perf_counter()
    build_orphan_wal(wal, cfg.replay_adds, cfg.replay_live)
    fsync_dir(directory)
    size = os.path.getsize(wal)
    res.info["replay_build_s"] = time.perf_counter() - start
    res.info["replay_wal_bytes"] = size
    res.info["replay_records"] = cfg.replay_records
    res.info["replay_live"] = cfg.replay_live
    log(f"  built in {res.info['replay_build_s']:.2f} s, {fmt_bytes(size)}")

    # The directory holds one orphan WAL and nothing else: Disk claims it, adopts it as its
    # main file (no copy) and replays it. Opening writes nothing to it, so it is reused.
    def open_disk() -> Disk:
        return Disk(path=directory, fsync_frequency=0)

    assert len(raw_replay(wal)) == cfg.replay_live

    def deferq() -> float:
        start = time.perf_counter()
        disk = open_disk()
        elapsed = time.perf_counter() - start
        try:
            if "pending_tasks_after_replay_s" not in res.info:
                # Once, untimed for the row: check the replay and time pending_tasks() on its own.
                start = time.perf_counter()
                pending = disk.pending_tasks()
                res.info["pending_tasks_after_replay_s"] = time.perf_counter() - start
                assert len(pending) == cfg.replay_live, len(pending)
                del pending
        finally:
            disk.close()
        assert os.path.getsize(wal) == size, "opening the Disk changed the WAL"
        return elapsed

    def baseline() -> float:
        start = time.perf_counter()
        live = raw_replay(wal)
        elapsed = time.perf_counter() - start
        del live
        return elapsed

    label = (f"replay {cfg.replay_records // 1000}k records, "
             f"{cfg.replay_live // 1000}k live")
    res.rows.append(run_pair(Row("replay", label, "call"), cfg.heavy_reps, deferq, baseline))

    log("measuring peak memory of replay (tracemalloc) ...")

    def traced_open() -> None:
        open_disk().close()

    res.memory.append(MemRow("replay", label, peak_bytes(traced_open),
                             peak_bytes(lambda: raw_replay(wal))))
    scratch.remove(directory)


# ----------------------------------------------------------------------------- report


def table(headers: list[str], body: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [headers, *body]) for i in range(len(headers))]
    lines = [" | ".join(h.ljust(w) if i == 0 else h.rjust(w)
                        for i, (h, w) in enumerate(zip(headers, widths, strict=True)))]
    lines.append("-|-".join("-" * w for w in widths))
    for r in body:
        lines.append(" | ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                for i, (c, w) in enumerate(zip(r, widths, strict=True))))
    return "\n".join(lines)


def report(res: Results, cfg: Config, runtime_s: float, meta: dict[str, object]) -> str:
    body = []
    for row in res.rows:
        suffix = "" if row.per == "call" else f"/{row.per}"
        body.append([row.label, fmt_s(statistics.median(row.deferq)) + suffix,
                     fmt_s(statistics.median(row.baseline)) + suffix,
                     f"{statistics.median(row.ratios):.2f}", str(len(row.deferq))])
    info = res.info
    mem = [[m.label, fmt_bytes(m.deferq_bytes), fmt_bytes(m.baseline_bytes),
            f"{m.deferq_bytes / m.baseline_bytes:.2f}" if m.baseline_bytes else "-"]
           for m in res.memory]
    out = [
        f"deferq storage benchmark ({cfg.mode}) - {meta['timestamp']} - commit "
        f"{meta['git_commit']}{' (src dirty)' if meta['git_src_dirty'] else ''}",
        f"host {meta['host']}, {meta['cpu_count']} CPUs, Python {platform.python_version()}, "
        f"load {meta['loadavg_start']} -> {meta['loadavg_end']}",
        "ratio = median over repetitions of (deferq time / baseline time); > 1 means deferq is slower",
        "",
        table(["workload", "deferq median", "baseline median", "ratio", "reps"], body),
        "",
        "peak memory (tracemalloc, one untimed pass each side)",
        table(["workload", "deferq peak", "baseline peak", "ratio"], mem),
        "",
        "rates (1 / median):",
        *(f"  {row.label}: deferq {1 / statistics.median(row.deferq):,.0f}/s, "
          f"baseline {1 / statistics.median(row.baseline):,.0f}/s"
          for row in res.rows if row.per != "call"),
        f"dead store file {fmt_bytes(int(info['dead_store_bytes']))}, built in "
        f"{info['dead_store_build_s']:.2f} s; orphan WAL "
        f"{fmt_bytes(int(info['replay_wal_bytes']))}, built in "
        f"{info['replay_build_s']:.2f} s; pending_tasks() after replay "
        f"{fmt_s(info['pending_tasks_after_replay_s'])} (once, not in the table)",
        f"total runtime {runtime_s:.1f} s",
    ]
    return "\n".join(out)


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


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true",
                        help="smaller sizes and fewer repetitions (under 30 s)")
    parser.add_argument("--json-out", type=Path, default=DEFAULT_JSON_OUT,
                        help="append one JSON line per run here (default: %(default)s)")
    parser.add_argument("--dir", default=None,
                        help="create the scratch directory under this one (default: /tmp)")
    parser.add_argument("--reps", type=int, default=None,
                        help="override the repetitions of every workload")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    if args.reps is not None:
        if args.reps < 1:
            parser.error("--reps must be at least 1")
        cfg = dataclasses.replace(cfg, reps=args.reps, heavy_reps=args.reps)

    started = time.perf_counter()
    meta: dict[str, object] = {
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git("rev-parse", "HEAD"),
        "git_src_dirty": bool(git("status", "--porcelain", "--untracked-files=no", "--", "src")),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "python": sys.version,
        "loadavg_start": loadavg(),
    }
    scratch = Scratch(args.dir)
    log(f"scratch directory {scratch.root}")
    res = Results()
    try:
        bench_dead_add(cfg, scratch, res)
        bench_wal(cfg, scratch, res)
        bench_dead_store(cfg, scratch, res)
        bench_replay(cfg, scratch, res)
    finally:
        scratch.cleanup()
    runtime = time.perf_counter() - started
    meta["loadavg_end"] = loadavg()
    print(report(res, cfg, runtime, meta), flush=True)

    record: dict[str, object] = {
        **meta,
        "mode": cfg.mode,
        "config": dataclasses.asdict(cfg),
        "runtime_s": runtime,
        "rows": [row.to_json() for row in res.rows],
        "memory": [m.to_json() for m in res.memory],
        "info": res.info,
    }
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    with args.json_out.open("a", encoding="utf-8") as out:
        out.write(json.dumps(record, sort_keys=True) + "\n")
    log(f"appended results to {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
