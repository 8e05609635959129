"""Run the power test with queue workers whose dead-letter write returns before it is done
(``python tests/power/queue_mutant_run.py CYCLES``, as root, in a private mount namespace).

Goal: prove the queue-level checks are not vacuous. Method: the queue's backend
(``ReportingQueueDisk.add_dead_task``) is replaced, before the workers are forked,
by one that starts the dead-task write in a thread and returns at once, so the
queue removes a task that gave up from its WAL while its dead-task record is not
yet written (D-13 broken); the harness must report violations. Prints the
harness's summary line last.
"""

from __future__ import annotations

import logging
import sys
import threading

from deferq.powertest import PowerConfig, run_power_test
from deferq.powertest._workers import ReportingQueueDisk

_real_add_dead = ReportingQueueDisk.add_dead_task


def _early_add_dead(self: ReportingQueueDisk, task_id: str, context: bytes,
                    exception: BaseException, *, task_class: str, attempts: int,
                    enqueued_at: int | None = None) -> str:
    """BROKEN on purpose: returns before the dead-task record is written."""
    threading.Thread(target=_real_add_dead, args=(self, task_id, context, exception),
                     kwargs={"task_class": task_class, "attempts": attempts,
                             "enqueued_at": enqueued_at}).start()
    return task_id


def main() -> int:
    logging.getLogger("deferq").setLevel(logging.CRITICAL)
    setattr(ReportingQueueDisk, "add_dead_task", _early_add_dead)
    cycles = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    summary = run_power_test(PowerConfig(cycles=cycles, seed=7, workers="queue"))
    for violation in summary.violations[:3]:
        print("VIOLATION", violation.splitlines()[0][:300])
    print(f"power-test: image {summary.workdir} (removed)")
    print(summary.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
