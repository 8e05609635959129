"""Crash points: where in a traced workload a run is stopped and crashed.

Rules. From a workload's trace of seam-level calls (``_tracing.Call``), the points are:

- ``sys:k``: a ``Crash`` fault fires before the k-th file or namespace call (any process);
- ``torn:k:n``: the k-th call is a ``write``; it writes only its first n bytes
  (``ShortWrite``) and the process dies before its next call (a torn write in the cache),
  for n in 1, 9, half and all but one byte of the write;
- ``eio:k``: the k-th call is a file ``fsync``; it fails with Linux semantics
  (``FsyncEio``), the workload runs on, and the crash comes at the end;
- ``op:i``: the crash comes after the first i steps have returned (``op:n`` = the end).

``str(point)`` and ``CrashPoint.parse`` are inverses: replay tokens carry the text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from deferq.crashtest._tracing import Call
from deferq.crashtest._workloads import Workload

_TORN_KEEP: Final = (1, 9)  # plus len//2 and len-1 of each write


@dataclass(frozen=True, slots=True)
class CrashPoint:
    """Where a run stops (see the module docstring): ``sys``, ``torn``, ``eio`` or ``op``."""

    kind: str
    index: int
    keep: int = 0

    def __str__(self) -> str:
        if self.kind == "torn":
            return f"torn:{self.index}:{self.keep}"
        return f"{self.kind}:{self.index}"

    @staticmethod
    def parse(text: str) -> CrashPoint:
        parts = text.split(":")
        return CrashPoint(parts[0], int(parts[1]), int(parts[2]) if len(parts) > 2 else 0)


def crash_points(trace: Sequence[Call], workload: Workload) -> list[CrashPoint]:
    """Every crash point of a traced workload (see the module docstring)."""
    points = [CrashPoint("sys", k) for k in range(1, len(trace) + 1)]
    for k, call in enumerate(trace, start=1):
        if call.op == "write" and call.nbytes > 1:
            keeps = sorted({n for n in (*_TORN_KEEP, call.nbytes // 2, call.nbytes - 1)
                            if 0 < n < call.nbytes})
            points.extend(CrashPoint("torn", k, n) for n in keeps)
        if call.op == "fsync":
            points.append(CrashPoint("eio", k))
    points.extend(CrashPoint("op", i) for i in range(len(workload.steps) + 1))
    return points


def nth_of(trace: Sequence[Call], op: str, k: int) -> int:
    """Which call of ``op`` the k-th call overall is (1-based, from the traced run)."""
    return sum(1 for call in trace[:k] if call.op == op)


