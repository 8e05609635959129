"""Run the power-test harness against a deliberately broken engine (``python tests/power/mutant_run.py``).

Goal: prove the harness is not vacuous. Method: ``Disk._wal_class`` is replaced,
before the workers are forked, by a WAL whose fsync does nothing (it acknowledges
adds that are only in the page cache); run as root inside a private mount
namespace, the harness must report violations after power cuts. Prints the
harness's summary line last.
"""

from __future__ import annotations

import logging
import sys

from deferq.powertest import PowerConfig, run_power_test
from deferq._engine.wal import TasksWal
from deferq.backends import Disk


class NoFsyncWal(TasksWal):
    """BROKEN on purpose: marks the WAL synced without calling fsync."""

    def _sync_locked(self) -> None:
        self._dirty = False


def main() -> int:
    logging.getLogger("deferq").setLevel(logging.CRITICAL)
    Disk._wal_class = NoFsyncWal
    cycles = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    summary = run_power_test(PowerConfig(cycles=cycles, seed=5, power_cut_rate=0.9,
                                         workers="storage"))
    for violation in summary.violations[:3]:
        print("VIOLATION", violation.splitlines()[0][:300])
    print(f"power-test: image {summary.workdir} (removed)")
    print(summary.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
