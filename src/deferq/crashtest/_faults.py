"""Deterministic fault injection for the simulated disk.

Rules. A ``FaultRule`` names an operation (``"fsync"``, ``"write"``, ... or ``"*"`` for
every file and namespace operation), an optional path filter (an ``fnmatch`` pattern or
a predicate; for descriptor operations the path the descriptor was opened with; for
``rename`` either path), an optional pid, and which matching calls fault: the ``nth``
(1-based) and the ``times - 1`` after it (``times=0``: every one from the ``nth`` on).
Rules are checked in the order they were added; the first that fires wins, and every
rule counts its own matching calls, so a test is deterministic and can loop over
``nth`` to crash at every call.

The faults and what the simulated Env does with them:

- ``Crash(after=False)``: the process dies before the call takes effect (after it, with
  ``after=True``): its descriptors close, its flocks and timers go, the page cache
  survives, and ``SimulatedCrash`` is raised; every later call of that process raises
  it again and changes nothing. Follow with ``SimDisk.power_loss`` to lose the cache.
- ``Eio()``: the call fails with ``EIO`` and changes nothing (read EIO, write EIO, ...).
- ``Enospc()``: the call fails with ``ENOSPC`` and changes nothing.
- ``ShortWrite(bytes_max)``: ``write`` writes only the first ``bytes_max`` bytes (at
  least one) and returns that count (A-6).
- ``FsyncEio(keep_cache=True)``: Linux fsync error semantics (A-7, "fsyncgate"): the
  file's dirty data is marked clean and will never be written back (dropped from the
  log, so the next power loss loses it); with ``keep_cache`` reads still return the
  new data, otherwise the cache reverts to the durable bytes (holes read as zeros,
  the size is kept). The error is reported once to every open file description of
  the file: this call raises ``EIO``, other descriptions get ``EIO`` at their next
  fsync, and a retried fsync succeeds although the data is not durable.
- ``LyingFsync()``: fsync returns success and persists nothing (a lost write).

Damage at rest (A-9) is not a rule but a direct action on the disk (``_damage``): ``flip_bit`` and
``zero_sector`` change the durable bytes (and the cached ones, as if the cache were
re-read from the medium).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

IO_OPS: Final = frozenset({
    "open", "pread", "write", "fsync", "ftruncate", "allocate", "seek", "map", "fstat", "close",
    "flock_exclusive_nb", "flock_unlock", "rename", "unlink", "makedirs", "listdir", "fsync_dir",
})


class SimulatedCrash(BaseException):
    """The simulated process died (a ``Crash`` fault, ``SimDisk.kill`` or a power loss).

    A ``BaseException``, like ``KeyboardInterrupt``, so the engine's ``except OSError``
    and ``except Exception`` clauses do not swallow it: a dead process runs no more code
    that touches the disk.
    """


@dataclass(frozen=True, slots=True)
class Crash:
    """Kill the calling process before (or, with ``after``, just after) the call."""

    after: bool = False


@dataclass(frozen=True, slots=True)
class Eio:
    """Fail the call with EIO, changing nothing."""


@dataclass(frozen=True, slots=True)
class Enospc:
    """Fail the call with ENOSPC, changing nothing."""


@dataclass(frozen=True, slots=True)
class ShortWrite:
    """``write`` writes at most ``bytes_max`` bytes (at least 1) and returns the count."""

    bytes_max: int = 1

    def __post_init__(self) -> None:
        if self.bytes_max < 1:
            raise ValueError("a short write writes at least one byte (0 means no progress)")


@dataclass(frozen=True, slots=True)
class FsyncEio:
    """fsync fails with EIO, Linux-style; dirty data is dropped (see the module docstring)."""

    keep_cache: bool = True


@dataclass(frozen=True, slots=True)
class LyingFsync:
    """fsync reports success and persists nothing."""


Fault = Crash | Eio | Enospc | ShortWrite | FsyncEio | LyingFsync

_ALLOWED_OPS: Final[dict[type, frozenset[str]]] = {
    ShortWrite: frozenset({"write"}),
    FsyncEio: frozenset({"fsync"}),
    LyingFsync: frozenset({"fsync", "fsync_dir"}),
    Enospc: frozenset({"open", "write", "ftruncate", "allocate", "rename", "makedirs", "fsync",
                       "fsync_dir"}),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultRule:
    """Which calls fault and how (see the module docstring)."""

    op: str
    fault: Fault
    path: str | Callable[[str], bool] | None = None
    nth: int = 1
    times: int = 1
    pid: int | None = None

    def __post_init__(self) -> None:
        if self.op != "*" and self.op not in IO_OPS:
            raise ValueError(f"unknown operation {self.op!r}; use one of {sorted(IO_OPS)} or '*'")
        allowed = _ALLOWED_OPS.get(type(self.fault))
        if allowed is not None and self.op not in allowed:
            raise ValueError(f"{type(self.fault).__name__} applies only to {sorted(allowed)}")
        if self.nth < 1 or self.times < 0:
            raise ValueError("nth counts from 1 and times must not be negative")

    def matches(self, op: str, paths: tuple[str, ...], pid: int) -> bool:
        if self.op not in ("*", op) or (self.pid is not None and self.pid != pid):
            return False
        if self.path is None:
            return True
        if isinstance(self.path, str):
            pattern = self.path
            return any(fnmatch.fnmatchcase(p, pattern) for p in paths)
        return any(self.path(p) for p in paths)


@dataclass(frozen=True, slots=True)
class FiredFault:
    """A record of one injected fault, for reports and repros."""

    rule_index: int
    op: str
    paths: tuple[str, ...]
    pid: int
    call_number: int


@dataclass(slots=True)
class FaultInjector:
    """The rules of one machine and how many matching calls each has seen."""

    rules: list[FaultRule] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    fired: list[FiredFault] = field(default_factory=list)

    def add(self, rule: FaultRule) -> FaultRule:
        self.rules.append(rule)
        self.counts.append(0)
        return rule

    def clear(self) -> None:
        self.rules.clear()
        self.counts.clear()

    def check(self, op: str, paths: tuple[str, ...], pid: int) -> Fault | None:
        """Count this call against every matching rule; return the first fault that fires."""
        chosen: Fault | None = None
        for index, rule in enumerate(self.rules):
            if not rule.matches(op, paths, pid):
                continue
            self.counts[index] += 1
            n = self.counts[index]
            due = n >= rule.nth and (rule.times == 0 or n < rule.nth + rule.times)
            if due and chosen is None:
                chosen = rule.fault
                self.fired.append(FiredFault(index, op, paths, pid, n))
        return chosen
