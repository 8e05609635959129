"""The PostgreSQL demo (``python -m deferq._demos.postgres``, run by scripts/demo.sh) end to end.

Goal: the demo keeps showing what issue 19 asks of it: two worker processes sharing one
throwaway database split the tasks, a task is retried, one is given up into the dead-task store
and ``deferq --dsn ... dead list`` lists it. Method: run the demo as a command and read its output.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.spec("Q-227")
def test_the_demo_splits_tasks_across_two_workers_retries_and_dead_letters() -> None:
    done = subprocess.run([sys.executable, "-m", "deferq._demos.postgres"], cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    out = done.stdout
    assert "skipped" not in out, out
    split = re.search(r"tasks split across the workers: \{'worker-1': (\d+), 'worker-2': (\d+)\}",
                      out)
    assert split is not None, out
    one, two = int(split.group(1)), int(split.group(2))
    assert one >= 1 and two >= 1 and one + two == 12 + 1, out  # 12 Greets and Flaky's retry
    assert out.count("ran Greet(") == 12 and "ran Flaky on its retry" in out, out
    assert out.count("Doomed(order-17) failed") == 2, out
    listing = out.split("dead list", 1)[1]
    assert re.search(r"demo\.Doomed\s+2\s+.*ValueError: order-17 has no address", listing), out
    assert "1 dead task(s)" in listing, out
