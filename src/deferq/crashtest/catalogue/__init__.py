"""The mutant catalogue: deliberately broken storage engines the crash suites must catch.

Goal: prove that the crash exploration (``deferq.crashtest._explore``) and the targeted
interleaving scenarios below have teeth: each mutant breaks exactly one rule of
spec/wal.md or spec/dead-tasks.md, and some check must report a violation for it while
the real engine passes the same check. Method: each mutant is a subclass of
``TasksWal`` or ``DeadTaskStore`` plugged into a ``Disk`` subclass through ``_wal_class``
/ ``_dead_class`` (or, for the handoff order, an ``Engine`` whose ``handoff`` swaps the
two calls). Nothing here is a flag in the product: the catalogue ships with the crash-testing
kit so that ``deferq crash-test`` from an installed wheel checks every mutant, and the library
never imports it (tests/unit/test_layering.py). ``MUTANTS`` is the registry read by ``deferq
crash-test`` and by ``tests/mutants/test_mutants_are_caught.py``: each entry names what it
breaks and what catches it.

Mutants that change the order of the dead-task store's two locks (``locks``) have no
scenario: the generic exploration of interleaved threads and processes (M-18) catches them.

Concurrency mutants (process-local exclusion, flock on the data file, a cached data
descriptor, a blocking lock) are caught by small deterministic scenarios: two threads
or two simulated processes on one ``SimDisk``, where a hook on one thread's seam call
parks it and runs the other one until that one finishes or sleeps in its lock retry.
"""

from __future__ import annotations

from deferq.crashtest._mutants import Mutant
from deferq.crashtest.catalogue import dead, locks, wal

MUTANTS: tuple[Mutant, ...] = dead.MUTANTS + wal.MUTANTS + locks.MUTANTS

__all__ = ["MUTANTS"]
