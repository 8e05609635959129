"""The format version in file names, and the seed marker that bridges versions (spec/format.md F-20, F-21).

Goal: files of another format version are recognised by their names alone and never
touched, and a WAL file holding only a seed marker raises the adopting worker's seeds, which
is what a later format's writer relies on to keep W-28 across versions. Method: a real
``Disk`` and the real ``deferq verify`` on a directory that also holds version-1 files.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from deferq._cli import main
from deferq._core.names import wal_file_name
from deferq._core.taskid import id_seed
from deferq._core.walcodec import encode_add, encode_rem
from deferq.backends import Disk
from tests.fsenv import ManualClock, RecordingEnv

FAR = 9_000_000_000  # a seed far ahead of any clock


@pytest.mark.spec("F-20", "F-15", "F-58")
def test_files_of_a_later_format_version_are_never_claimed_read_or_changed(
        storage: Path, capsys: pytest.CaptureFixture[str]) -> None:
    storage.mkdir(parents=True)
    later_wal = storage / "deferred-1-20260807-4242-1"
    later_dead = storage / "deferred-dead_tasks-1"
    later_wal.write_bytes(b"\x01 a record of format 1 that format 0 cannot parse\n"
                          + encode_add("1-1-1", None, b"v1"))
    later_dead.write_bytes(b"anything\n")
    before = {p: p.read_bytes() for p in (later_wal, later_dead)}
    with Disk(path=storage) as disk:
        assert disk.pending_tasks() == []
        disk.add_dead_task("a", b"", RuntimeError("x"), task_class="T", attempts=1)
        assert [t.id for t in disk.list_dead_tasks()] == ["a"]
    assert main(["verify", "--path", str(storage)]) == 0  # no damage counted
    out = capsys.readouterr().out
    assert "deferred-1-" not in out and "dead_tasks-1" not in out
    assert {p: p.read_bytes() for p in before} == before


@pytest.mark.spec("F-21", "W-28", "F-59")
def test_a_file_holding_only_a_seed_marker_raises_the_next_seeds_above_it(storage: Path) -> None:
    storage.mkdir(parents=True)
    marker = storage / wal_file_name("deferred-", "20260807", 777, 1)
    marker.write_bytes(encode_rem(f"{FAR}-777-0"))
    with Disk(path=storage, env=RecordingEnv(ManualClock()), fsync_frequency=0) as disk:
        task_id = disk.add_task(b"")
    assert id_seed(task_id) > FAR
    assert not marker.exists()  # adopted (W-3, W-4): its seed lives on in the fresh file
    with Disk(path=storage, env=RecordingEnv(ManualClock()), fsync_frequency=0) as disk:
        assert id_seed(disk.add_task(b"")) > id_seed(task_id)
