"""A zero-filled hole longer than a line may be, in front of a record (spec/recovery.md R-@K).

Goal: the record written after a hole of more than ``LINE_BYTES_MAX`` zero bytes survives
in both stores, through every reader: WAL replay at open, the dead-task listing (scan and
index), ``find_dead_task`` (needle scan and index) and a compaction (D-5, D-7). Before R-@K
was checked ahead of R-@E, the hole and the record made one over-long line and the record
was lost. Method: real 8 MiB files on a tmp directory, opened by ``Disk``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from deferq._core.deadcodec import encode_dead
from deferq._core.limits import LINE_BYTES_MAX
from deferq._core.names import dead_data_name, wal_file_name
from deferq._core.types import DeadTask
from deferq._core.walcodec import encode_add
from deferq.backends import Disk

HOLE = b"\0" * (LINE_BYTES_MAX + 100)


def dead(task_id: str) -> DeadTask:
    return DeadTask(id=task_id, task_class="T", attempts=1, enqueued_at=0, failed_at=1,
                    exception_class="E", exception_message="m", backtrace=(), context=b"c")


@pytest.mark.spec("R-@K", "R-@E", "D-5", "W-16", "D-23")
def test_a_wal_record_after_a_hole_over_the_line_limit_is_replayed(tmp_path: Path) -> None:
    (tmp_path / wal_file_name("deferred-", "20260807", 4242, 1)).write_bytes(
        encode_add("a", None, b"1") + HOLE + encode_add("kept", None, b"2"))
    with Disk(path=tmp_path, fsync_frequency=0) as disk:
        assert [(t.task_id, t.context) for t in disk.pending_tasks()] == [("a", b"1"), ("kept", b"2")]


@pytest.mark.spec("R-@K", "R-@E", "D-7", "S-6", "S-11", "S-13", "D-23")
def test_a_dead_task_after_a_hole_over_the_line_limit_is_listed_found_and_kept(
        tmp_path: Path) -> None:
    (tmp_path / dead_data_name("deferred-")).write_bytes(
        encode_dead(dead("a")) + HOLE + encode_dead(dead("kept")))
    with Disk(path=tmp_path, fsync_frequency=0) as disk:
        assert disk.find_dead_task("kept") == dead("kept")  # before any index: a needle scan
        assert [t.id for t in disk.list_dead_tasks()] == ["kept", "a"]
        assert disk.find_dead_task("kept") == dead("kept")  # through the index
        assert disk.remove_dead_tasks("a") == 1  # a compaction copies the record, not the hole
        assert [t.id for t in disk.list_dead_tasks()] == ["kept"]
    assert (tmp_path / dead_data_name("deferred-")).read_bytes() == encode_dead(dead("kept"))
