"""What a power test is asked to do (``PowerConfig``) and what it reports (``Summary``).

Rules: both are plain values. ``PowerConfig`` is the public knob set of
``run_power_test``; ``Summary`` is its public result: counters the harness keeps
current after every cycle, the violations found, in the order found, and two ways to
print them (``line`` for one line, ``details`` for the counters that explain it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import IO

from deferq.powertest._qcheck import QueueStats
from deferq.powertest._workers import Role


@dataclass(frozen=True, slots=True)
class PowerConfig:
    cycles: int = 100
    seed: int = 0
    fs: str = "ext4"
    work_s: tuple[float, float] | None = None  # default: WORK_S of the worker mode
    kill_one_rate: float = 0.5  # chance per cycle of one mid-cycle SIGKILL + restart
    power_cut_rate: float = 0.6  # chance that a cycle ends in a power cut, not a SIGKILL of all
    workers: str = "mixed"  # a key of ROLE_SETS
    roles: tuple[Role, ...] | None = None  # overrides ``workers``
    log_path: str | None = None  # every event as a JSON line, outside the image
    evidence_dir: str | None = None  # where the files of a failing cycle are copied
    progress: IO[str] | None = None


@dataclass(slots=True)
class Summary:
    cycles: int = 0
    kills: int = 0
    power_cuts: int = 0
    acknowledged: int = 0
    synced: int = 0
    violations: list[str] = field(default_factory=list)
    seconds: float = 0.0
    torn_tails: int = 0  # files with a torn tail right after a crash (allowed, R-@F)
    damaged_lines: int = 0  # damaged complete lines seen right after a crash
    damaged_after_add: int = 0  # ... and still there after recovery + one add
    duplicates: int = 0  # ids pending in two WALs at once (allowed: at-least-once)
    stale_merges: int = 0  # ... whose merge kept an older add's bytes
    failures: dict[str, int] = field(default_factory=dict)
    self_exits: int = 0
    workdir: str = ""  # where the image was (deleted at the end)
    late_acks: int = 0  # returned after a power cut began: counted as in flight
    hit: dict[str, int] = field(default_factory=dict)  # ops in flight at a crash, by kind
    reordered: int = 0  # overlapping dead-store writes of one id resolved in the other order
    queue: QueueStats | None = None  # what the queue roles did (None without queue roles)

    def line(self) -> str:
        return (f"power-test: cycles={self.cycles} kills={self.kills} "
                f"power_cuts={self.power_cuts} acknowledged={self.acknowledged} "
                f"violations={len(self.violations)}")

    def details(self) -> str:
        failures = ", ".join(f"{k}={v}" for k, v in sorted(self.failures.items())) or "none"
        hit = ", ".join(f"{k}={v}" for k, v in sorted(self.hit.items())) or "none"
        return (f"  {self.seconds:.1f} s; synced acks={self.synced}; crash points="
                f"{self.kills + self.power_cuts}; torn tails after crash={self.torn_tails}; "
                f"damaged lines after crash={self.damaged_lines} (after recovery+add: "
                f"{self.damaged_after_add}); cross-WAL duplicates={self.duplicates} "
                f"(stale merges={self.stale_merges}); acks returned during a power cut="
                f"{self.late_acks}; overlapping dead-store writes taken in the other order="
                f"{self.reordered}; failed ops={failures}; in flight at a crash: {hit}"
                + ("" if self.queue is None else "\n" + queue_details(self.queue)))


def queue_details(q: QueueStats) -> str:
    logged = ", ".join(f"{k}={v}" for k, v in sorted(q.storage_log_errors.items())) or "none"
    return (f"  queue: starts={q.starts} (tasks replayed={q.replayed}); executions={q.runs} "
            f"(ok={q.ok_runs}); dead-letter writes={q.gave_up}; WAL removals judged="
            f"{q.removals_judged}; durable enqueues={q.durable_enqueues} (accounted for after "
            f"the drain={q.accounted}, not judged={q.foreign}: touched by storage roles or retried "
            f"during a cut); storage errors "
            f"logged by the queue={logged}")
