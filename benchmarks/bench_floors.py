#!/usr/bin/env python3
"""The Python floor of the workloads whose issue #6 target deferq misses, in one run.

Usage::

    .venv/bin/python benchmarks/bench_floors.py [--quick | --smoke] [--reps N] [--dir DIR]
        [--json-out FILE]

A target of issue #6 is a ratio against a baseline that does less than deferq must: the raw
baselines append precomputed lines and parse without checking anything. This command asks
whether a target can be met by any pure-Python code that does the work deferq's format and
guarantees require, and nothing more. For each workload it runs three sides, interleaved
repetition by repetition (the order rotates), as the main benchmark does:

- ``deferq``: the same sample as bench_storage.py's row;
- the row's baseline (``raw`` or ``sqlite``): the same sample as bench_storage.py's;
- ``floor``: the least Python that produces or reads deferq's records with the checks the
  spec requires (a CRC-32 frame per line, the JSON and base64 of the payload, one task run
  per enqueue), written plainly, with no validation, locking or bookkeeping beyond that.
  Before timing, each floor's output is checked with deferq's own decoder, so it cannot
  cheat by doing less.

It prints, per workload, the medians and the medians of the per-repetition ratios deferq /
baseline, floor / baseline and deferq / floor, and says "below the floor" when floor /
baseline already exceeds the target. One JSON line per run goes to ``--json-out`` (default
``benchmarks/floors.jsonl``; do not commit it). See docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import binascii
import dataclasses
import datetime as dt
import fcntl
import gc
import json
import os
import statistics
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import bench_reads as rd
import bench_sqlite as sq
import bench_writes as wr
from bench_cli import add_options, append_json_line, config_and_names, git, loadavg
from bench_common import (
    ATTEMPTS,
    FAKE_PID,
    PAGE,
    PREFIX,
    TASK_CLASS,
    Config,
    Sample,
    Scratch,
    fmt_s,
    log,
    repeated,
)
from bench_workloads import DEFAULT_FSYNC_S
from deferq._core.deadcodec import decode_dead_line, decode_dead_payload
from deferq._core.frame import BadLine
from deferq._core.names import dead_data_name, wal_file_name
from deferq._core.walcodec import WalAdd, WalRem, decode_wal_line
from deferq._runtime.serialize import decode_context
from deferq.backends import Disk

DEFAULT_JSON_OUT = Path(__file__).resolve().parent / "floors.jsonl"
FLOOR_SIDES = ("deferq", "baseline", "floor")


@dataclasses.dataclass
class Study:
    """One workload: deferq, its target's baseline and the Python floor, per repetition."""

    key: str
    label: str
    baseline: str  # "raw" or "sqlite": the side the target is set against
    limit: float  # the target: deferq / baseline at most this
    samples: dict[str, list[float]] = dataclasses.field(
        default_factory=lambda: {side: [] for side in FLOOR_SIDES})

    def ratio(self, top: str, bottom: str) -> float:
        return statistics.median(t / b for t, b in zip(self.samples[top], self.samples[bottom],
                                                       strict=True))

    def verdict(self) -> str:
        if self.ratio("deferq", "baseline") <= self.limit:
            return "meets"
        return "below the floor" if self.ratio("floor", "baseline") > self.limit else "misses"

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"key": self.key, "label": self.label, "baseline": self.baseline,
                                  "limit": self.limit, "verdict": self.verdict()}
        for side in FLOOR_SIDES:
            out[f"{side}_s"] = self.samples[side]
            out[f"{side}_median_s"] = statistics.median(self.samples[side])
        for top, bottom in (("deferq", "baseline"), ("floor", "baseline"), ("deferq", "floor")):
            out[f"{top}_vs_{bottom}"] = self.ratio(top, bottom)
        return out


def run_study(study: Study, reps: int, sides: dict[str, Sample]) -> Study:
    order = list(FLOOR_SIDES)
    for rep in range(reps):
        shift = rep % len(order)
        for side in order[shift:] + order[:shift]:
            gc.collect()
            seconds = sides[side]()
            if not seconds > 0:
                raise RuntimeError(f"{study.key}: {side} measured {seconds!r} s")
            study.samples[side].append(seconds)
        d, b, f = (study.samples[s][-1] for s in FLOOR_SIDES)
        log(f"  {study.label}: rep {rep + 1}/{reps} deferq {fmt_s(d)} {study.baseline} {fmt_s(b)}"
            f" floor {fmt_s(f)} | deferq/{study.baseline} {d / b:.2f}, floor/{study.baseline}"
            f" {f / b:.2f}, deferq/floor {d / f:.2f}")
    return study


# ----------------------------------------------------------------------------- the floors


def frame_line(body: bytes) -> bytes:
    """A CRC-32 framed line, as F-2 wants it."""
    return b"%08x:%b\n" % (zlib.crc32(body), body)


def line_ok(line: bytes) -> bool:
    """The frame check every reader must make (F-3): the CRC of the body matches."""
    return len(line) > 9 and b"%08x" % zlib.crc32(line[9:]) == line[:8]


# One compact encoder, built once (json.dumps with separators builds one per call).
_encode_json = json.JSONEncoder(separators=(",", ":")).encode


class Noop:
    task_name = "bench.noop"  # the name deferq's row registers (bench_writes.Noop)
    done = 0

    def perform(self, number: int) -> None:
        Noop.done += 1


async def _queue_floor_run(fd: int, n: int) -> float:
    """Enqueue n tasks (a JSON context, a framed ``add`` record), run each on the loop in
    batches, then write its framed ``rem`` record: a queue with nothing else."""
    loop = asyncio.get_running_loop()
    seed, pid = str(int(time.time())), str(os.getpid())
    pending: list[tuple[bytes, type[Noop], tuple[int, ...]]] = []
    scheduled = False
    counter = 0
    idle = loop.create_future()

    def run_batch() -> None:
        nonlocal scheduled
        scheduled = False
        batch = pending[:]
        pending.clear()
        for task_id, cls, args in batch:
            cls().perform(*args)
            os.write(fd, frame_line(b"rem:" + task_id))
        if not pending and not idle.done():
            idle.set_result(None)

    async def aenqueue(cls: type[Noop], *args: int) -> None:
        nonlocal scheduled, counter
        counter += 1
        task_id = f"{seed}-{pid}-{counter}".encode()
        # The context record a queue reads back: its version, the task, its
        # arguments, the attempts and the second it was enqueued.
        context = _encode_json({"v": 1, "task": cls.task_name, "args": args, "kwargs": {},
                                "attempts": 0, "enqueued_at": int(time.time())}).encode()
        os.write(fd, frame_line(b"add:" + task_id + b":0:"
                                + binascii.b2a_base64(context, newline=False)))
        pending.append((task_id, cls, args))
        if not scheduled:
            scheduled = True
            loop.call_soon(run_batch)

    start = time.perf_counter()
    for number in range(n):
        await aenqueue(Noop, number)
    await idle
    return time.perf_counter() - start


def _check_wal_records(path: str, n: int) -> None:
    """The floor wrote n add and n rem records that deferq's WAL decoder accepts."""
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")[:-1]
    records = [decode_wal_line(line) for line in lines]
    # Each add's context is one deferq's queue would run (so the floor cannot write less).
    contexts = [decode_context(r.context) for r in records if isinstance(r, WalAdd)]
    if sorted(tuple(c.args) for c in contexts) != [(i,) for i in range(n)] or any(
            c.task != Noop.task_name or c.enqueued_at is None for c in contexts):
        raise AssertionError(f"queue floor: contexts are not the tasks enqueued: {contexts[:3]}")
    adds = sum(isinstance(r, WalAdd) for r in records)
    rems = sum(isinstance(r, WalRem) for r in records)
    if adds != n or rems != n or len(records) != 2 * n:
        raise AssertionError(f"queue floor: {adds} adds, {rems} rems of {n}; "
                             f"{[r for r in records if isinstance(r, BadLine)][:3]}")


def queue_floor(scratch: Scratch, n: int) -> Sample:
    def sample() -> float:
        path = scratch.fresh_dir("floor-queue")
        log_path = os.path.join(path, "floor.log")
        fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        Noop.done = 0
        try:
            elapsed = asyncio.run(_queue_floor_run(fd, n))
        finally:
            os.close(fd)
        if Noop.done != n:
            raise AssertionError(f"queue floor: {Noop.done} of {n} tasks ran")
        _check_wal_records(log_path, n)
        scratch.remove(path)
        return elapsed / n
    return sample


def dead_floor_line(task_id: str, context: bytes, exc: BaseException) -> bytes:
    """The F-10 line of a dead task, built from the exception as any store must (its
    backtrace walked, its message taken), in plain Python and stdlib C."""
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        frames.append(f"{code.co_filename}:{tb.tb_lineno}:in {code.co_name}")
        tb = tb.tb_next
    payload = json.dumps({
        "id": task_id, "task_class": TASK_CLASS, "attempts": ATTEMPTS,
        "enqueued_at": int(task_id.split("-", 1)[0]), "failed_at": int(time.time()),
        "exception_class": type(exc).__qualname__, "exception_message": str(exc),
        "backtrace": frames,
        "context": binascii.b2a_base64(context, newline=False).decode("ascii"),
    }, separators=(",", ":"))
    return frame_line(b"dead_task:" + task_id.encode() + b":" + payload.encode())


def dead_add_floor(scratch: Scratch, work: wr.DeadWork) -> Sample:
    """The raw flock baseline, with each record built at add time instead of before."""
    probe = dead_floor_line(work.ids[0], work.context, work.exc)[:-1]
    framed = decode_dead_line(probe)
    if isinstance(framed, BadLine) or isinstance(decode_dead_payload(framed), BadLine):
        raise AssertionError("dead add floor: deferq cannot read the floor's record")

    def sample() -> float:
        path = scratch.fresh_dir("floor-dead")
        lock_fd = os.open(os.path.join(path, "raw.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        fd = os.open(os.path.join(path, "raw.data"), os.O_WRONLY | os.O_APPEND | os.O_CREAT,
                     0o600)
        try:
            start = time.perf_counter()
            for task_id in work.ids:
                line = dead_floor_line(task_id, work.context, work.exc)
                fcntl.flock(lock_fd, fcntl.LOCK_EX)
                try:
                    os.write(fd, line)
                    os.fsync(fd)
                finally:
                    fcntl.flock(lock_fd, fcntl.LOCK_UN)
            elapsed = time.perf_counter() - start
        finally:
            os.close(fd)
            os.close(lock_fd)
            scratch.remove(path)
        return elapsed / len(work.ids)
    return sample


def list_floor(data_path: str, limit: int) -> list[tuple[str, object]]:
    """The newest ``limit`` records, each frame checked (CRC) and each id once, JSON decoded:
    the raw reader plus the checks S-6 and S-10 require of any reader."""
    out: list[tuple[str, object]] = []
    seen: set[bytes] = set()
    for region in rd.regions_newest_first(data_path):
        lines = region[:-1].split(b"\n")
        lines.reverse()
        for line in lines:
            if not line_ok(line):
                continue
            _, _, task_id, body = line.split(b":", 3)
            if task_id in seen:
                continue
            seen.add(task_id)
            out.append((task_id.decode(), json.loads(body)))
            if len(out) == limit:
                return out
    return out


def replay_floor(path: str) -> dict[bytes, bytes]:
    """The raw replay plus the one check every WAL reader must make: each line's CRC.

    A copy of ``bench_reads.raw_replay``'s loop with the check added, on purpose: a shared
    loop with a flag would slow the raw baseline, and a filter stage would slow the floor.
    """
    with open(path, "rb") as f:
        data = f.read()
    live: dict[bytes, bytes] = {}
    crc32 = zlib.crc32
    for line in data.split(b"\n"):
        if not line or b"%08x" % crc32(line[9:]) != line[:8]:
            continue
        if line[9:12] == b"add":
            live[line[13:line.index(b":", 13)]] = line
        else:
            live.pop(line[13:], None)
    return live


# ----------------------------------------------------------------------------- the studies


def study_queue(cfg: Config, scratch: Scratch) -> Study:
    n = cfg.enq_queue
    study = Study("enq_crash_queue", f"enqueue+complete crash-safe, Queue ({n:,})", "raw", 2.0)
    return run_study(study, cfg.reps, {
        "deferq": wr.queue_enqueue(scratch, n, DEFAULT_FSYNC_S, 1),
        "baseline": wr.raw_enqueue(scratch, n, False, 1),
        "floor": queue_floor(scratch, n)})


def study_dead_add(cfg: Config, scratch: Scratch) -> Study:
    work = wr.DeadWork(cfg.dead_adds)
    study = Study("dead_add_1p", f"dead add, durable, 1 process ({cfg.dead_adds:,})", "raw",
                  1 / 0.9)
    return run_study(study, cfg.reps, {
        "deferq": wr.dead_add(scratch, "deferq", work),
        "baseline": wr.dead_add(scratch, "raw", work),
        "floor": dead_add_floor(scratch, work)})


def study_list(cfg: Config, scratch: Scratch) -> Study:
    n = cfg.store_entries
    master, sqlite_dir = scratch.new("floor-store"), scratch.new("floor-store-sqlite")
    ids = rd.build_dead_store(master, sqlite_dir, n)
    data_path = os.path.join(master, dead_data_name(PREFIX))
    disk = Disk(path=master, fsync_frequency=0)
    conn = sq.connect(sqlite_dir, "NORMAL")
    try:
        want = rd.expected_page(ids, PAGE, 0)
        got = ([t.id for t in disk.list_dead_tasks(limit=PAGE)],
               [i for i, _ in sq.list_dead(conn, PAGE, 0)], [i for i, _ in list_floor(data_path, PAGE)])
        if any(g != want for g in got):
            raise AssertionError("list floor: the sides disagree on the newest page")
        # As in the main benchmark, deferq's per-process index is warm: a list of everything
        # builds it (S-11).
        if len(disk.list_dead_tasks()) != n:
            raise AssertionError("list floor: deferq does not list every entry")
        study = Study("dead_list_newest", f"list newest {PAGE} of {n:,}", "sqlite", 1.5)
        return run_study(study, cfg.reps, {
            "deferq": repeated(lambda: disk.list_dead_tasks(limit=PAGE), cfg.sample_target_s),
            "baseline": repeated(lambda: sq.list_dead(conn, PAGE, 0), cfg.sample_target_s),
            "floor": repeated(lambda: list_floor(data_path, PAGE), cfg.sample_target_s)})
    finally:
        conn.close()
        disk.close()
        scratch.remove(master)
        scratch.remove(sqlite_dir)


def study_replay(cfg: Config, scratch: Scratch) -> Study:
    directory, sqlite_dir = scratch.fresh_dir("floor-replay"), scratch.fresh_dir("floor-replay-sq")
    wal = os.path.join(directory, wal_file_name(PREFIX, "20261201", FAKE_PID, 0xBE7C4))
    live = cfg.replay_live
    rd.build_orphan_wal(wal, sqlite_dir, cfg.replay_adds, live)
    scratch.remove(sqlite_dir)

    def deferq() -> float:
        return rd.timed_disk_open(scratch, [wal], live, "replay")  # bench_storage's sample

    def timed(replay: Callable[[str], dict[bytes, bytes]], name: str) -> Sample:
        def sample() -> float:
            start = time.perf_counter()
            count = len(replay(wal))
            elapsed = time.perf_counter() - start
            if count != live:
                raise AssertionError(f"{name}: {count} live of {live}")
            return elapsed
        return sample

    study = Study("replay", f"replay {cfg.replay_records:,} records, {live:,} live", "raw", 1.5)
    try:
        return run_study(study, cfg.heavy_reps, {
            "deferq": deferq, "baseline": timed(rd.raw_replay, "raw replay"),
            "floor": timed(replay_floor, "replay floor")})
    finally:
        scratch.remove(directory)


STUDIES: dict[str, Callable[[Config, Scratch], Study]] = {
    "enqueue": study_queue, "dead_add": study_dead_add, "dead_list": study_list,
    "replay": study_replay,
}


def report(studies: list[Study], cfg: Config, runtime_s: float, meta: dict[str, object]) -> str:
    headers = ["workload", "deferq", "baseline", "floor", "deferq/base", "floor/base",
               "deferq/floor", "target", "verdict"]
    body = [[s.label, fmt_s(statistics.median(s.samples["deferq"])),
             f"{s.baseline} {fmt_s(statistics.median(s.samples['baseline']))}",
             fmt_s(statistics.median(s.samples["floor"])),
             f"{s.ratio('deferq', 'baseline'):.2f}", f"{s.ratio('floor', 'baseline'):.2f}",
             f"{s.ratio('deferq', 'floor'):.2f}", f"<= {s.limit:.2f}x {s.baseline}", s.verdict()]
            for s in studies]
    widths = [max(len(r[i]) for r in [headers, *body]) for i in range(len(headers))]

    def fmt(cells: list[str]) -> str:
        return " | ".join(c.ljust(w) if i in (0, 2, 7, 8) else c.rjust(w)
                          for i, (c, w) in enumerate(zip(cells, widths, strict=True)))
    return "\n".join([
        f"deferq floor study ({cfg.mode}) - {meta['timestamp']} - commit {meta['git_commit']}",
        f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}, load {meta['loadavg_start']}",
        "ratio = median over repetitions of the per-repetition ratio; floor = the least "
        "pure-Python code doing the work deferq's records require",
        "",
        fmt(headers), "-|-".join("-" * w for w in widths), *map(fmt, body),
        "",
        "verdict 'below the floor': floor/base already exceeds the target: the plain code doing "
        "only the work the format requires misses it on this machine",
        f"total runtime {runtime_s:.1f} s",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    add_options(parser, list(STUDIES), "study", DEFAULT_JSON_OUT, "smaller sizes, 3 repetitions")
    args = parser.parse_args(argv)
    cfg, names = config_and_names(parser, args, list(STUDIES), "study")
    meta: dict[str, object] = {
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git("rev-parse", "HEAD"), "loadavg_start": loadavg(),
    }
    started = time.perf_counter()
    scratch = Scratch(args.dir)
    studies: list[Study] = []
    try:
        for name in names:
            log(f"== {name}")
            studies.append(STUDIES[name](cfg, scratch))
    finally:
        scratch.cleanup()
    runtime = time.perf_counter() - started
    print(report(studies, cfg, runtime, meta), flush=True)
    record = {**meta, "kind": "floors", "mode": cfg.mode, "runtime_s": runtime,
              "config": dataclasses.asdict(cfg), "studies": [s.to_json() for s in studies]}
    append_json_line(args.json_out, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
