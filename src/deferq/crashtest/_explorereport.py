"""What an exploration reports: per-model numbers, violations, and their replay tokens.

Rules. An ``ExploreReport`` counts workloads, crash points, traced syscalls, distinct
crash states and recoveries (cache misses), per crash kind or persistence model
(``ModelStats``) and in total; reports of shards add up (``add``), in shard order.
Every ``ExploreViolation`` carries a replay token: the case (engine name, workload,
crash point, crash kind, state index, seed, bound name) as compact JSON in URL-safe
base64 without padding, which ``decode_token`` reads back for ``deferq crash-test
--replay``.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field

from deferq.crashtest._crashpoints import CrashPoint
from deferq.crashtest._workloads import Workload


@dataclass(slots=True)
class ModelStats:
    """Numbers of one crash kind / persistence model."""

    states: int = 0
    recoveries: int = 0
    violations: int = 0


@dataclass(frozen=True, slots=True)
class ExploreViolation:
    """One recovered state the guarantees forbid, with everything needed to replay it."""

    engine: str
    workload: str
    point: str
    crash: str  # "kill" or a model name
    state_index: int
    state: str
    message: str
    token: str

    @property
    def replay_command(self) -> str:
        return f"deferq crash-test --replay {self.token}"

    def __str__(self) -> str:
        return (f"{self.engine}: {self.workload} crash at {self.point} ({self.crash} state "
                f"#{self.state_index}: {self.state}): {self.message}\n  replay: "
                f"{self.replay_command}")


@dataclass(slots=True)
class ExploreReport:
    """The outcome of ``explore``."""

    engine: str
    seed: int
    max_ops: int
    bound: str
    models: tuple[str, ...]
    sequences: int = 0  # distinct workloads of exactly max_ops steps
    workloads: int = 0  # explored
    crash_points: int = 0
    syscalls: int = 0
    states: int = 0  # distinct crash states, summed over crash points and kinds
    recoveries: int = 0  # distinct images actually recovered (the cache misses)
    violations: list[ExploreViolation] = field(default_factory=list)
    per_model: dict[str, ModelStats] = field(default_factory=dict)
    elapsed_s: float = 0.0
    stopped_early: str = ""

    def summary(self) -> str:
        lines = [f"engine {self.engine}: seed={self.seed} max_ops={self.max_ops} bound {self.bound}",
                 f"  workloads explored {self.workloads}/{self.sequences}, crash points "
                 f"{self.crash_points} ({self.syscalls} traced syscalls), distinct states "
                 f"{self.states}, recoveries {self.recoveries}, {self.elapsed_s:.1f}s"]
        for name, stats in self.per_model.items():
            lines.append(f"  {name:<13} states={stats.states} violations={stats.violations}")
        if self.stopped_early:
            lines.append(f"  STOPPED EARLY: {self.stopped_early}")
        return "\n".join(lines)

    def add(self, part: ExploreReport) -> None:
        """Add the numbers and violations of a shard's report to this one."""
        self.workloads += part.workloads
        self.crash_points += part.crash_points
        self.syscalls += part.syscalls
        self.states += part.states
        self.recoveries += part.recoveries
        self.violations.extend(part.violations)
        for name, stats in part.per_model.items():
            total = self.per_model.setdefault(name, ModelStats())
            total.states += stats.states
            total.recoveries += stats.recoveries
            total.violations += stats.violations
        if part.stopped_early:
            self.stopped_early = "; ".join(filter(None, (self.stopped_early,
                                                         part.stopped_early)))


def encode_token(engine: str, workload: Workload, point: CrashPoint, crash: str, state: int,
                 seed: int, bound: str) -> str:
    """A replay token: the case as compact JSON in URL-safe base64."""
    data = {"e": engine, "w": workload.to_json(), "p": str(point), "c": crash, "i": state,
            "s": seed, "b": bound}
    raw = json.dumps(data, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_token(token: str) -> dict[str, object]:
    """The case a replay token names, as the JSON object ``encode_token`` wrote."""
    raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    data = json.loads(raw)
    assert isinstance(data, dict)
    return data
