"""The engine under test and its seam to a crash run: ``Engine``, the handoff, the values.

Rules. An ``Engine`` is a ``Disk`` class (possibly a mutant from the catalogue) plus the
order of a give-up handoff (``Handoff``): ``standard_handoff`` is the queue's (D-13),
the dead record first and the WAL removal only after; a mutant may change it. Every
run of a workload stores the same values for the same task name (``pending_value``,
``dead_value``), so the model and the recovered state can be compared by value. Every
workload's storage lives at ``PATH`` with file prefix ``PREFIX``.

Theory of operation: ``HandoffOps`` hands a handoff the two calls it may make, each of
which does its model bookkeeping in the run (``_crashrun._Run``) that created it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from deferq._core.model import Dead, Pending
from deferq.backends import Disk

if TYPE_CHECKING:
    # Type-only: a run creates every HandoffOps, so _crashrun imports this module.
    from deferq.crashtest._crashrun import _Run

PATH: Final = "/s"
PREFIX: Final = "deferred-"
DELAY_S: Final = 2_000_000_000


class HandoffOps:
    """The two calls of a give-up handoff, each with its model bookkeeping."""

    def __init__(self, run: _Run, worker: int) -> None:
        self._run = run
        self._worker = worker

    def add_dead(self, task_id: str) -> None:
        """``add_dead_task`` of this task (the dead record the model expects)."""
        self._run.add_dead(self._worker, task_id)

    def remove_task(self, task_id: str) -> None:
        """``remove_task`` of this task on its worker."""
        self._run.remove_task(self._worker, task_id)


Handoff = Callable[[HandoffOps, str], None]


def standard_handoff(ops: HandoffOps, task_id: str) -> None:
    """The queue's give-up order (D-13): the dead record first, the WAL removal only after."""
    ops.add_dead(task_id)
    ops.remove_task(task_id)


@dataclass(frozen=True, slots=True)
class Engine:
    """The engine under test: the ``Disk`` class (possibly a mutant) and the handoff order."""

    name: str = "deferq"
    disk_class: type[Disk] = Disk
    handoff: Handoff = standard_handoff


def pending_value(task: str, delayed: bool) -> Pending:
    return Pending(f"ctx-{task}".encode(), DELAY_S if delayed else None)


def dead_value(task: str) -> Dead:
    return Dead(f"dead-{task}".encode(), "job.Task", 3, f"gave up {task}")


