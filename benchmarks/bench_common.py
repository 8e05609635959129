"""Shared pieces of the storage benchmark: sizes, result rows, targets, timing helpers.

See bench_storage.py (the entry point) and docs/benchmarks.md.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable

from deferq._core.types import DeadTask
from deferq.backends._deadtask import exception_backtrace, exception_class_name

PREFIX = "deferred-"  # Disk's default prefix
SEED0 = 1_796_169_600  # 2026-12-02T00:00:00Z: the leading "seed" second of the ids we write
FAKE_PID = 4242
TASK_CLASS = "billing.jobs.ChargeCard"
ATTEMPTS = 21
DEAD_CONTEXT_BYTES = 200
PAGE = 50
PRODUCERS = 16  # concurrent producers of the group-commit row
SIDES = ("deferq", "raw", "sqlite")

Sample = Callable[[], float]


# ----------------------------------------------------------------------------- configuration


@dataclasses.dataclass(frozen=True)
class Config:
    mode: str
    reps: int  # repetitions of every workload
    heavy_reps: int  # repetitions of remove, replay and cold scans
    enq_storage: int  # enqueue+complete, crash-safe, Disk level
    enq_queue: int  # enqueue+complete, crash-safe, Queue level
    enq_power: int  # enqueue+complete, power-safe (per side, per repetition)
    dead_adds: int  # dead-task adds per repetition (split over the processes of the 2-process row)
    store_entries: int
    list_offset: int
    remove_many: int
    replay_adds: int
    replay_live: int
    sample_target_s: float  # fast read ops are repeated until a sample lasts about this long

    @property
    def replay_records(self) -> int:
        return 2 * self.replay_adds - self.replay_live


FULL = Config(mode="full", reps=5, heavy_reps=3, enq_storage=50_000, enq_queue=20_000,
              enq_power=800, dead_adds=1_000, store_entries=100_000, list_offset=90_000,
              remove_many=1_000, replay_adds=500_000, replay_live=100_000, sample_target_s=0.05)
QUICK = Config(mode="quick", reps=3, heavy_reps=3, enq_storage=20_000, enq_queue=5_000,
               enq_power=200, dead_adds=300, store_entries=20_000, list_offset=18_000,
               remove_many=1_000, replay_adds=100_000, replay_live=20_000, sample_target_s=0.02)
SMOKE = Config(mode="smoke", reps=2, heavy_reps=2, enq_storage=300, enq_queue=200,
               enq_power=16, dead_adds=16, store_entries=600, list_offset=500,
               remove_many=50, replay_adds=1_000, replay_live=200, sample_target_s=0.002)
CONFIGS = {c.mode: c for c in (FULL, QUICK, SMOKE)}


# ----------------------------------------------------------------------------- targets and rows


@dataclasses.dataclass(frozen=True)
class Check:
    """One measurable condition: the median ratio vs ``side`` (or deferq's median seconds,
    side "abs") must be at most ``limit``."""

    side: str  # "raw", "sqlite" or "abs"
    limit: float

    def holds(self, row: Row) -> bool:
        value = row.median("deferq") if self.side == "abs" else row.ratio_median(self.side)
        return value <= self.limit


@dataclasses.dataclass(frozen=True)
class Target:
    text: str
    checks: tuple[Check, ...] = ()

    def verdict(self, row: Row) -> str:
        if not self.checks:
            return "-"
        return "meets" if all(c.holds(row) for c in self.checks) else "misses"


@dataclasses.dataclass
class Row:
    """One workload: per-repetition seconds (per op, task or call) of the three sides."""

    key: str
    label: str
    per: str  # "op", "task" or "call"
    target: Target
    samples: dict[str, list[float]] = dataclasses.field(
        default_factory=lambda: {side: [] for side in SIDES})
    note: str = ""

    def median(self, side: str) -> float:
        return statistics.median(self.samples[side])

    def ratios(self, side: str) -> list[float]:
        return [d / b for d, b in zip(self.samples["deferq"], self.samples[side], strict=True)
                if b > 0]

    def ratio_median(self, side: str) -> float:
        ratios = self.ratios(side)
        return statistics.median(ratios) if ratios else float("nan")

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "key": self.key, "label": self.label, "per": self.per, "reps": len(self.samples["deferq"]),
            "target": self.target.text, "verdict": self.target.verdict(self), "note": self.note,
        }
        for side in SIDES:
            out[f"{side}_s"] = self.samples[side]
            out[f"{side}_median_s"] = self.median(side)
            if self.per != "call":
                out[f"{side}_rate_per_s"] = 1 / self.median(side)
        for side in ("raw", "sqlite"):
            out[f"ratios_vs_{side}"] = self.ratios(side)
            out[f"ratio_vs_{side}"] = self.ratio_median(side)
        return out


@dataclasses.dataclass
class MemRow:
    key: str
    label: str
    peak_bytes: dict[str, int]

    def to_json(self) -> dict[str, object]:
        return {"key": self.key, "label": self.label,
                **{f"{side}_peak_bytes": self.peak_bytes[side] for side in SIDES}}


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
        fsync_dir(self.root)
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


def fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
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
    fsync_file(dst)
    fsync_dir(os.path.dirname(dst))


def run_trio(row: Row, reps: int, deferq: Sample, raw: Sample, sqlite: Sample) -> Row:
    """Run the three sides ``reps`` times; the order rotates every repetition."""
    sides: list[tuple[str, Sample]] = [("deferq", deferq), ("raw", raw), ("sqlite", sqlite)]
    for rep in range(reps):
        shift = rep % len(sides)
        for side, fn in sides[shift:] + sides[:shift]:
            gc.collect()
            seconds = fn()
            if not seconds > 0:
                raise RuntimeError(f"{row.key}: {side} measured {seconds!r} s")
            row.samples[side].append(seconds)
        last = {side: row.samples[side][-1] for side in SIDES}
        log(f"  {row.label}: rep {rep + 1}/{reps} "
            + " ".join(f"{side} {fmt_s(last[side])}" for side in SIDES)
            + f" | ratio vs raw {last['deferq'] / last['raw']:.2f}, "
              f"vs sqlite {last['deferq'] / last['sqlite']:.2f}")
    return row


def repeat_call(fn: Callable[[], object], number: int) -> float:
    """Mean seconds per call over ``number`` back-to-back calls."""
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - start) / number


def repeated(fn: Callable[[], object], target_s: float) -> Sample:
    """A sample: mean seconds per call of ``fn`` over about ``target_s`` seconds of calls
    (the count is set by one untimed warm-up call)."""
    once = repeat_call(fn, 1)
    number = max(1, min(500, int(target_s / max(once, 1e-7))))
    return lambda: repeat_call(fn, number)


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


def dead_json(line: bytes) -> bytes:
    """The JSON body of an encoded ``{crc}:dead_task:{id}:{json}`` line (newline stripped)."""
    return line.rstrip(b"\n").split(b":", 3)[3]
