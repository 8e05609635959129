"""A WAL `add` whose context is over the writers' limit (spec/wal.md W-39, format.md F-8).

Goal: F-8 bounds what ``add_task`` accepts, not what a reader applies: a record written by
another writer with a context of ``CONTEXT_BYTES_MAX`` + 1 bytes is replayed, and adoption
copies it into the fresh file unchanged, so a second adoption still has it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from deferq._core.errors import LimitExceededError
from deferq._core.limits import CONTEXT_BYTES_MAX
from deferq._core.names import wal_file_name
from deferq._core.walcodec import encode_add
from deferq.backends import Disk

BIG = bytes(range(256)) * (CONTEXT_BYTES_MAX // 256) + b"+"  # one byte over F-8's limit


@pytest.mark.spec("W-39", "F-8", "W-3")
def test_an_add_over_the_context_limit_is_replayed_and_copied(tmp_path: Path) -> None:
    assert len(BIG) == CONTEXT_BYTES_MAX + 1
    (tmp_path / wal_file_name("deferred-", "20260807", 4242, 1)).write_bytes(
        encode_add("big", 2000000000, BIG) + encode_add("small", None, b"s"))
    for _ in range(2):  # the second open adopts the first one's fresh copy
        with Disk(path=tmp_path, fsync_frequency=0) as disk:
            assert [(t.task_id, t.context, t.publish_at) for t in disk.pending_tasks()] == [
                ("big", BIG, 2000000000), ("small", b"s", None)]
            with pytest.raises(LimitExceededError):
                disk.add_task(BIG)  # the writer's limit still holds
