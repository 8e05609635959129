"""Bounded-exhaustive crash exploration of the storage engine (``Disk`` on a ``SimDisk``).

Theory of operation. ``explore`` takes every workload of ``max_ops`` steps
(``deferq.crashtest._workloads``), runs it once through a tracing ``Env``
(``deferq.crashtest._tracing``) and then, for every crash point of that trace, re-runs it
from scratch up to that point and crashes it there (``deferq.crashtest._crashrun``:
``sys:k``, ``torn:k:n``, ``eio:k`` and ``op:i``).

At the crash every process dies. Two crash kinds follow. *Process kill*: recovery reads
the volatile image (the page cache survives). *Power loss*, for each persistence model
(``explore_models``): every state of ``SimDisk.crash_states(model, bound)``, within an
``ExploreBound``. Each state is recovered by a fresh worker, probed, and judged by
``deferq._core.model.StorageModel`` plus the handoff rule D-13 (``deferq.crashtest._crashrun``).
Recoveries are cached by image digest, so a state reached from many crash points is
recovered once. With ``jobs > 1`` the workload list is sharded over processes and the
reports are merged in shard order.

Everything is deterministic given the seed: workloads are enumerated in a fixed order,
the simulated machine is seeded, and the random part of ``Bound`` uses the seed. Each
violation carries a replay token (``deferq crash-test --replay TOKEN``). This module
holds the explorer and its bounds; the report and the replay tokens are in
``_explorereport``, ``replay`` in ``_replay``, the mutant checks in ``_mutants``.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final

from deferq._core.model import Crash as CrashKind
from deferq.crashtest._crashengine import Engine
from deferq.crashtest._crashpoints import CrashPoint, crash_points
from deferq.crashtest._crashrecover import Recovered, check_recovered, recover
from deferq.crashtest._crashrun import _prepare, trace_workload
from deferq.crashtest._explorereport import (
    ExploreReport,
    ExploreViolation,
    ModelStats,
    decode_token,
    encode_token,
)
from deferq.crashtest._oplog import Image
from deferq.crashtest._persistence import (
    Bound,
    Ext4Ordered,
    PersistenceModel,
    Prefix,
    Weakest,
)
from deferq.crashtest._simdisk import SimDisk
from deferq.crashtest._tracing import Call
from deferq.crashtest._workloads import Workload, workloads

__all__ = [
    "BOUNDS",
    "CI_BOUND",
    "ExploreBound",
    "ExploreReport",
    "ExploreViolation",
    "FULL_BOUND",
    "ModelStats",
    "check_case",
    "decode_token",
    "encode_token",
    "explore",
    "explore_models",
]


# ---------------------------------------------------------------------------- models


def explore_models(names: Sequence[str], *, tear_head_bytes: int = 64,
                   tear_points_max: int = 128) -> dict[str, PersistenceModel]:
    """The persistence models by name; ``weakest`` has atomic renames (A-11)."""
    out: dict[str, PersistenceModel] = {}
    for name in names:
        if name == "weakest":
            out[name] = Weakest(atomic_rename=True, tear_head_bytes=tear_head_bytes,
                                tear_points_max=tear_points_max)
        elif name == "ext4_ordered":
            out[name] = Ext4Ordered()
        elif name == "prefix":
            out[name] = Prefix()
        else:
            raise ValueError(f"unknown model {name!r}; use weakest, ext4_ordered or prefix")
    return out


@dataclass(frozen=True, slots=True)
class ExploreBound:
    """The bound of one exploration: how crash states are enumerated, how writes tear."""

    name: str
    bound: Bound
    tear_head_bytes: int
    tear_points_max: int

    def describe(self) -> str:
        b = self.bound
        return (f"{self.name}: exhaustive_max={b.exhaustive_max} random_states={b.random_states}"
                f" weakest tears: first {self.tear_head_bytes} bytes + last byte + "
                f"{self.tear_points_max} sector points")


CI_BOUND: Final = ExploreBound("ci", Bound(exhaustive_max=256, random_states=4), 10, 2)
FULL_BOUND: Final = ExploreBound("full", Bound(exhaustive_max=4096, random_states=64), 64, 128)
BOUNDS: Final = {"ci": CI_BOUND, "full": FULL_BOUND}


# ---------------------------------------------------------------------------- the explorer


def check_case(engine: Engine, workload: Workload, point: CrashPoint, *, seed: int = 0,
               models: dict[str, PersistenceModel], bound: Bound,
               kill: bool = True, cache: dict[bytes, Recovered] | None = None,
               only: tuple[str, int] | None = None, trace: Sequence[Call] | None = None,
               on_state: Callable[[str, int, str, Recovered, list[str]], None] | None = None,
               ) -> tuple[dict[str, ModelStats], list[tuple[str, int, str, str]]]:
    """Run one crash point and check every crash state; return stats and (crash, i, state, msg).

    ``only`` restricts the check to one (crash, state index), for replays.
    """
    cache = {} if cache is None else cache
    if trace is None:
        trace = trace_workload(engine, workload, seed)
    run = _prepare(engine, workload, point, seed, trace)
    stats: dict[str, ModelStats] = {}
    found: list[tuple[str, int, str, str]] = []
    verdicts: dict[tuple[CrashKind, bytes], list[str]] = {}

    def judge(kind: CrashKind, crash: str, index: int, desc: str, image: Image,
              boot: Callable[[], SimDisk]) -> None:
        st = stats.setdefault(crash, ModelStats())
        st.states += 1
        key = image.key()
        got = cache.get(key)
        if got is None:
            got = recover(engine, boot())
            cache[key] = got
            st.recoveries += 1
        vkey = (kind, key)
        msgs = verdicts.get(vkey)
        if msgs is None:
            msgs = check_recovered(run, kind, got)
            verdicts[vkey] = msgs
        if on_state is not None:
            on_state(crash, index, desc, got, msgs)
        if msgs:
            st.violations += 1
            found.append((crash, index, desc, "; ".join(msgs)))

    if kill and (only is None or only[0] == "kill"):
        image = run.disk.volatile_image()
        judge(CrashKind.PROCESS_KILL, "kill", 0, "volatile image", image,
              lambda: SimDisk(seed, image=image))
    for name, model in models.items():
        if only is not None and only[0] != name:
            continue
        for state in run.disk.crash_states(model, bound):
            if only is not None and state.index != only[1]:
                continue
            judge(CrashKind.POWER_LOSS, name, state.index, state.description, state.image,
                  state.to_disk)
    return stats, found


def explore(engine: Engine | None = None, *, max_ops: int = 3, seed: int = 0,
            models: Sequence[str] = ("weakest", "ext4_ordered", "prefix"),
            bound: ExploreBound = CI_BOUND, seconds: float | None = None,
            workload_list: Sequence[Workload] | None = None,
            stop_after_violations: int | None = None,
            progress: Callable[[str], None] | None = None, jobs: int = 1) -> ExploreReport:
    """Explore every workload of ``max_ops`` steps at every crash point (module docstring).

    Args:
        engine: the engine under test (default: the real one).
        max_ops: the workload length N.
        seed: seeds the machine and the random part of the bound.
        models: persistence models for power loss (the process kill is always checked).
        bound: how crash states are enumerated (``CI_BOUND`` or ``FULL_BOUND``).
        seconds: a time budget; the report says when it stopped early.
        workload_list: explore these instead of ``workloads(max_ops)``.
        stop_after_violations: stop once this many violations were found.
        progress: called with a line now and then.
        jobs: worker processes (shards of the workload list, merged in shard order);
            the engine must be picklable (the real one is), else the run is serial.
    """
    engine = engine if engine is not None else Engine()
    if jobs > 1:
        return _explore_parallel(engine, jobs, max_ops=max_ops, seed=seed, models=models,
                                 bound=bound, seconds=seconds, workload_list=workload_list,
                                 stop_after_violations=stop_after_violations,
                                 progress=progress)
    chosen = explore_models(models, tear_head_bytes=bound.tear_head_bytes,
                            tear_points_max=bound.tear_points_max)
    state_bound = Bound(exhaustive_max=bound.bound.exhaustive_max,
                        random_states=bound.bound.random_states, seed=seed)
    todo = list(workload_list) if workload_list is not None else workloads(max_ops)
    if workload_list is not None:
        max_ops = max((len(w.steps) for w in todo), default=0)
    report = ExploreReport(engine.name, seed, max_ops, bound.describe(), tuple(models),
                           sequences=len(todo))
    report.per_model = {"kill": ModelStats(), **{m: ModelStats() for m in models}}
    start = time.monotonic()
    cache: dict[bytes, Recovered] = {}
    with _quiet():
        _explore_loop(engine, todo, report, chosen, state_bound, bound, seed, seconds,
                      stop_after_violations, progress, cache, start)
    report.elapsed_s = time.monotonic() - start
    return report


def _signature(point: CrashPoint, message: str) -> str:
    """A violation's kind: its crash-point kind and its message without ids and values."""
    return point.kind + ":" + re.sub(r"'[^']*'|\[.*?\]|\(.*?\)", "_", message)


def _shard(engine: Engine, todo: list[Workload], max_ops: int, seed: int,
           models: tuple[str, ...], bound: ExploreBound, seconds: float | None,
           stop_after_violations: int | None) -> ExploreReport:
    return explore(engine, max_ops=max_ops, seed=seed, models=models, bound=bound,
                   seconds=seconds, workload_list=todo,
                   stop_after_violations=stop_after_violations)


def _explore_parallel(engine: Engine, jobs: int, *, max_ops: int, seed: int,
                      models: Sequence[str], bound: ExploreBound, seconds: float | None,
                      workload_list: Sequence[Workload] | None,
                      stop_after_violations: int | None,
                      progress: Callable[[str], None] | None) -> ExploreReport:
    import multiprocessing  # noqa: PLC0415
    import pickle  # noqa: PLC0415
    from concurrent.futures import ProcessPoolExecutor  # noqa: PLC0415

    todo = list(workload_list) if workload_list is not None else workloads(max_ops)
    try:
        pickle.dumps(engine)
    except (pickle.PicklingError, AttributeError, TypeError):
        return explore(engine, max_ops=max_ops, seed=seed, models=models, bound=bound,
                       seconds=seconds, workload_list=todo,
                       stop_after_violations=stop_after_violations, progress=progress)
    start = time.monotonic()
    shards = [todo[i::jobs] for i in range(jobs)]
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        futures = [pool.submit(_shard, engine, shard, max_ops, seed, tuple(models), bound,
                               seconds, stop_after_violations) for shard in shards]
        parts = [f.result() for f in futures]
    merged = ExploreReport(engine.name, seed, max_ops, bound.describe(), tuple(models),
                           sequences=len(todo))
    merged.per_model = {"kill": ModelStats(), **{m: ModelStats() for m in models}}
    for part in parts:
        merged.add(part)
    merged.elapsed_s = time.monotonic() - start
    if progress is not None:
        progress(f"  {jobs} shards done in {merged.elapsed_s:.0f}s")
    return merged


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence the engine's corruption warnings: the explorer causes thousands on purpose."""
    logger = logging.getLogger("deferq")
    saved = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(saved)


def _explore_loop(engine: Engine, todo: Sequence[Workload], report: ExploreReport,
                  chosen: dict[str, PersistenceModel], state_bound: Bound, bound: ExploreBound,
                  seed: int, seconds: float | None, stop_after_violations: int | None,
                  progress: Callable[[str], None] | None, cache: dict[bytes, Recovered],
                  start: float) -> None:
    done = False
    shown: set[str] = set()  # kinds of violation already shown through ``progress``
    for number, workload in enumerate(todo):
        if seconds is not None and time.monotonic() - start > seconds:
            report.stopped_early = (f"time budget of {seconds:g}s ran out after {number} of "
                                    f"{len(todo)} workloads")
            break
        trace = trace_workload(engine, workload, seed)
        report.workloads += 1
        report.syscalls += len(trace)
        for point in crash_points(trace, workload):
            report.crash_points += 1
            stats, found = check_case(engine, workload, point, seed=seed, models=chosen,
                                      bound=state_bound, cache=cache, trace=trace)
            for name, st in stats.items():
                total = report.per_model.setdefault(name, ModelStats())
                total.states += st.states
                total.recoveries += st.recoveries
                total.violations += st.violations
                report.states += st.states
                report.recoveries += st.recoveries
            for crash, index, desc, message in found:
                token = encode_token(engine.name, workload, point, crash, index, seed, bound.name)
                violation = ExploreViolation(engine.name, str(workload), str(point), crash,
                                             index, desc, message, token)
                report.violations.append(violation)
                signature = _signature(point, message)
                if progress is not None and signature not in shown and len(shown) < 50:
                    shown.add(signature)
                    progress(f"VIOLATION {violation}")
            if stop_after_violations is not None and \
                    len(report.violations) >= stop_after_violations:
                report.stopped_early = f"stopped after {len(report.violations)} violation(s)"
                done = True
                break
        if progress is not None and (number + 1) % 25 == 0:
            progress(f"  {number + 1}/{len(todo)} workloads, {report.states} states, "
                     f"{len(report.violations)} violations, {time.monotonic() - start:.0f}s")
        if done:
            break
