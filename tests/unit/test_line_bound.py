"""D-24: no record a writer can produce is longer than ``LINE_BYTES_MAX``.

Goal: the largest WAL ``add`` and the largest dead-task record deferq accepts (every field at
its limit, the context as JSON-escaped text at its worst) are written through a real ``Disk``
and every line of the files is measured.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from deferq._core.limits import (
    CONTEXT_BYTES_MAX,
    EXCEPTION_MESSAGE_CHARS_MAX,
    LINE_BYTES_MAX,
    TASK_CLASS_BYTES_MAX,
    TASK_ID_BYTES_MAX,
)
from deferq.backends import Disk


class Huge(Exception):
    pass


@pytest.mark.spec("D-24", "F-8")
def test_the_largest_records_a_writer_accepts_fit_in_one_line(tmp_path: Path) -> None:
    context = bytes(range(256)) * (CONTEXT_BYTES_MAX // 256)  # every byte value, escaped at worst
    assert len(context) == CONTEXT_BYTES_MAX
    task_id = "x" * TASK_ID_BYTES_MAX
    error = Huge("\u2028" * EXCEPTION_MESSAGE_CHARS_MAX)  # escaped in JSON: 6 bytes each
    with Disk(path=tmp_path, fsync_frequency=0) as disk:
        disk.add_task(context, task_id=task_id, publish_at=99_999_999_999)
        disk.add_dead_task(task_id, context, error, task_class="T" * TASK_CLASS_BYTES_MAX,
                           attempts=2**63 - 1)
    longest = {p.name: max(len(line) for line in p.read_bytes().split(b"\n"))
               for p in tmp_path.iterdir() if p.stat().st_size}
    assert any(n > CONTEXT_BYTES_MAX for n in longest.values()), longest  # the big lines are there
    assert all(n <= LINE_BYTES_MAX for n in longest.values()), longest
