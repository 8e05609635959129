"""Mutant checks: is each deliberately broken engine caught, and does the real one pass?

A ``Mutant`` (the catalogue is ``deferq.crashtest.catalogue``: it ships with this kit so that
``deferq crash-test`` from an installed wheel checks every one; the library never uses it) is caught
by exploring its focused ``workloads`` with ``deferq.crashtest._explore.explore``, by a
targeted ``scenario`` (concurrency bugs need an interleaving) that checks its machine
with ``check_disk``, or by the generic exploration of interleaved threads and processes
(``threads`` random plans of ``deferq.crashtest._interleave``, M-18), which is written for
no mutant in particular. ``check_mutant`` runs the same checks on the real engine as well;
``load_catalogue`` imports a catalogue by path (for ``deferq crash-test``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from deferq._core.model import Crash as CrashKind
from deferq._core.model import StorageModel
from deferq.crashtest._crashengine import Engine
from deferq.crashtest._crashrecover import check_recovered, recover
from deferq.crashtest._crashrun import _Run
from deferq.crashtest._explore import CI_BOUND, ExploreBound, _quiet, explore, explore_models
from deferq.crashtest._interleave import explore_threads
from deferq.crashtest._simdisk import SimDisk
from deferq.crashtest._workloads import Workload

__all__ = [
    "Mutant",
    "MutantResult",
    "check_disk",
    "check_mutant",
    "load_catalogue",
]


@dataclass(frozen=True, slots=True)
class Mutant:
    """A deliberately broken engine (``deferq.crashtest.catalogue``; never plugged into the library).

    Caught either by the exploration of ``workloads`` or by a targeted ``scenario``
    (concurrency bugs need an interleaving): a callable that runs the engine it is given
    and returns violation messages (empty for a correct engine).
    """

    name: str
    breaks: str
    caught_by: str
    engine: Engine
    workloads: tuple[Workload, ...] = ()
    scenario: Callable[[Engine], list[str]] | None = None
    threads: int = 0  # random plans of the generic thread/process exploration (M-18)


@dataclass(slots=True)
class MutantResult:
    """Whether a mutant was caught, and whether the real engine passed the same checks."""

    name: str
    violations: list[str]
    real_violations: list[str]
    elapsed_s: float

    @property
    def caught(self) -> bool:
        return bool(self.violations)


def check_mutant(mutant: Mutant, *, seed: int = 0, bound: ExploreBound = CI_BOUND,
                 models: Sequence[str] = ("weakest", "ext4_ordered", "prefix"),
                 seconds: float | None = None) -> MutantResult:
    """Run a mutant's checks on the mutant and on the real engine."""
    start = time.monotonic()
    real = Engine()
    if mutant.threads:
        with _quiet():
            found_runs = explore_threads(mutant.engine, seed=seed, runs=mutant.threads,
                                         seconds=seconds, stop_after=1)
            # The real engine runs exactly the plans the mutant ran, up to the one that
            # caught it (all of them when none did).
            real_runs = explore_threads(real, seed=seed, runs=found_runs.runs)
        found = [f"seed {s}: {m}" for s, messages in found_runs.failures for m in messages]
        real_found = [f"seed {s}: {m}" for s, messages in real_runs.failures for m in messages]
    elif mutant.scenario is not None:
        with _quiet():
            found = _run_scenario(mutant.scenario, mutant.engine)
            real_found = _run_scenario(mutant.scenario, real)
    else:
        report = explore(mutant.engine, workload_list=mutant.workloads, seed=seed,
                         models=models, bound=bound, seconds=seconds,
                         stop_after_violations=1)
        found = [str(v) for v in report.violations]
        real_report = explore(real, workload_list=mutant.workloads, seed=seed, models=models,
                              bound=bound, seconds=seconds)
        real_found = [str(v) for v in real_report.violations]
    return MutantResult(mutant.name, found, real_found, time.monotonic() - start)


def _run_scenario(scenario: Callable[[Engine], list[str]], engine: Engine) -> list[str]:
    try:
        return scenario(engine)
    except Exception as exc:  # noqa: BLE001 - a scenario that cannot finish is a finding
        return [f"scenario {getattr(scenario, '__name__', '?')} raised "
                f"{type(exc).__name__}: {exc}"]


def check_disk(engine: Engine, disk: SimDisk, model: StorageModel, *,
               models: Sequence[str] = ("weakest",), bound: ExploreBound = CI_BOUND,
               seed: int = 0) -> list[str]:
    """Crash a scenario's machine now (every process dies) and check every recovery.

    For targeted scenarios: ``model`` must hold the scenario's operations with their
    outcomes. Checks the process kill and every power-loss state of ``models``.
    """
    for pid in disk.processes():
        disk.kill(pid)
    run = _Run.__new__(_Run)
    run.model = model
    run.handoffs = []
    run.anomalies = []
    out: list[str] = []
    image = disk.volatile_image()
    with _quiet():
        got = recover(engine, SimDisk(seed, image=image))
        out.extend(f"process kill: {m}"
                   for m in check_recovered(run, CrashKind.PROCESS_KILL, got))
        chosen = explore_models(models, tear_head_bytes=bound.tear_head_bytes,
                                tear_points_max=bound.tear_points_max)
        for name, persistence in chosen.items():
            for state in disk.crash_states(persistence, bound.bound):
                got = recover(engine, state.to_disk())
                out.extend(f"{state}: {m}"
                           for m in check_recovered(run, CrashKind.POWER_LOSS, got))
    return out


def load_catalogue(directory: str) -> tuple[Mutant, ...]:
    """The ``MUTANTS`` of ``DIRECTORY/catalogue.py`` (imported by path)."""
    import importlib.util  # noqa: PLC0415 - only the CLI needs it
    import sys  # noqa: PLC0415

    path = f"{directory.rstrip('/')}/catalogue.py"
    spec = importlib.util.spec_from_file_location("deferq_mutant_catalogue", path)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    mutants = getattr(module, "MUTANTS")  # noqa: B009
    if not isinstance(mutants, tuple) or not all(isinstance(m, Mutant) for m in mutants):
        raise TypeError(f"{path}: MUTANTS must be a tuple of deferq.crashtest.Mutant")
    return mutants
