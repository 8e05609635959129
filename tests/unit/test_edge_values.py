"""Edge values at the public API and the command line: each is refused at the call that is
wrong, with a message naming it, or works (issue: hardening, edge values).

Method: call with the extreme value and check the error's type and message, or that the
call works; through the real command for the CLI case.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from deferq import Backpressure
from deferq.backends import Disk


@pytest.mark.spec("Q-29")
@pytest.mark.parametrize("timeout", [1e308, 3600.5, -1, float("nan"), float("inf"), True])
def test_backpressure_refuses_a_timeout_it_could_not_wait_for(timeout: float) -> None:
    with pytest.raises(ValueError, match="timeout must be a finite number of seconds from 0 to 3600"):
        Backpressure(timeout=timeout)


@pytest.mark.spec("Q-29")
def test_backpressure_accepts_the_bounds_and_names_each_bad_field() -> None:
    assert Backpressure(timeout=3600).iterations == 72_000
    assert Backpressure(timeout=0).iterations == 0
    with pytest.raises(ValueError, match="high_water_mark"):
        Backpressure(high_water_mark=0)
    with pytest.raises(ValueError, match="low_water_mark"):
        Backpressure(high_water_mark=5, low_water_mark=6)


@pytest.mark.spec("C-7")
@pytest.mark.parametrize("ids", [b"abc", bytearray(b"abc"), memoryview(b"abc")])
def test_remove_dead_tasks_of_bytes_names_bytes(tmp_path: Path, ids: object) -> None:
    with Disk(path=tmp_path / "s") as disk:
        with pytest.raises(ValueError, match=f"not {type(ids).__name__}; decode it first"):
            disk.remove_dead_tasks(ids)  # type: ignore[arg-type]


@pytest.mark.spec("Q-28")
def test_dead_show_of_an_id_whose_seed_is_past_any_calendar_works(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with Disk(path=path) as disk:
        disk.add_dead_task("999999999999-order", b"{}", RuntimeError("x"), task_class="t",
                           attempts=1)
    result = subprocess.run([sys.executable, "-m", "deferq", "dead", "show", "999999999999-order",
                             "--path", str(path)], capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode == 0, result
    assert "enqueued at: 999999999999 (epoch seconds)" in result.stdout
