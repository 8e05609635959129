"""Every mutant of the catalogue is caught, and the real engine passes the same checks.

Goal: show that the crash exploration and the interleaving scenarios detect each kind of
storage bug they are meant to (a crash suite that passes a broken engine proves
nothing). Method: for each entry of ``src/deferq/crashtest/catalogue.py`` run
``deferq.crashtest._mutants.check_mutant``: the mutant's focused workloads through the
bounded-exhaustive exploration (every crash point, process kill and every crash state
of the three persistence models, CI bound), its targeted two-thread / two-process
scenario, or the generic exploration of random plans of threads and processes
interleaved at syscalls and locks (``_interleave``, M-18: the lock-order mutants have
no scenario of their own); it must report at least one violation, and the real engine, run on exactly
the same workloads or scenario, none.
"""

from __future__ import annotations

import pytest

from deferq.crashtest._explore import CI_BOUND
from deferq.crashtest._mutants import check_mutant
from deferq.crashtest.catalogue import MUTANTS

SPEC = {
    "no-dead-tail-repair": ("D-12", "D-5"),
    "in-place-remove": ("D-9",),
    "rename-unsynced-tmp": ("D-9",),
    "no-dir-fsync-after-rename": ("D-6", "D-9"),
    "no-dir-fsync-after-create": ("D-6", "D-7"),
    "flock-data-file": ("D-11",),
    "cached-data-fd": ("D-11",),
    "no-local-mutex": ("D-11",),
    "blocking-lock": ("D-8",),
    "swapped-handoff": ("D-13",),
    "retry-failed-fsync": ("D-10",),
    "adopt-in-place": ("D-2", "D-3"),
    "unlink-before-synced-copy": ("D-3",),
    "group-commit-late-target": ("D-15",),
    "index-trusts-size": ("S-10", "D-11"),
    "sweep-unlinks-before-sync": ("D-21", "W-32"),
    "mutex-released-before-flock": ("L-8", "D-11"),
    "flock-before-mutex": ("L-7", "D-11"),
}


def test_the_catalogue_has_every_required_mutant_and_each_says_what_catches_it() -> None:
    names = [m.name for m in MUTANTS]
    assert len(names) == len(set(names))
    assert set(names) == set(SPEC)
    for mutant in MUTANTS:
        assert mutant.breaks and mutant.caught_by
        kinds = [bool(mutant.workloads), mutant.scenario is not None, mutant.threads > 0]
        assert kinds.count(True) == 1, mutant.name


@pytest.mark.slow
@pytest.mark.spec("D-2", "D-3", "D-5", "D-6", "D-7", "D-8", "D-9", "D-10", "D-11", "D-12", "D-13",
                  "D-21", "L-7", "L-8", "M-18")
@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_mutant_is_caught_and_the_real_engine_passes(mutant: object) -> None:
    from deferq.crashtest import Mutant

    assert isinstance(mutant, Mutant)
    result = check_mutant(mutant, bound=CI_BOUND)
    assert result.caught, f"{mutant.name} was not caught by: {mutant.caught_by}"
    assert not result.real_violations, result.real_violations[:3]
    print(f"{mutant.name}: {len(result.violations)} violation(s), e.g. "
          f"{result.violations[0].splitlines()[0]}")
