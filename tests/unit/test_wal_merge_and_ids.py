"""Id uniqueness within a process and across workers, and merge order of shared ids.

Goal: check the W-28 additions (one id source per process, ids carry the pid)
and the merge-order rule W-15 on the real filesystem. Method: open backends
on tmp directories; build orphan WAL files with the codec where a test needs a
particular on-disk state.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from deferq._core.names import wal_file_name
from deferq._core.walcodec import encode_add, encode_rem
from deferq._engine.osenv import OS_ENV
from deferq.backends import Disk
from tests.fsenv import ManualClock, RecordingEnv


@pytest.mark.spec("W-68")
def test_two_default_disks_of_one_process_never_issue_the_same_id(storage: Path) -> None:
    with Disk(path=storage, fsync_frequency=0) as one, Disk(path=storage, fsync_frequency=0) as two:
        ids = [disk.add_task(b"") for _ in range(50) for disk in (one, two)]
    assert len(set(ids)) == len(ids)


@pytest.mark.spec("W-68")
def test_disks_sharing_one_env_share_one_id_source(storage: Path) -> None:
    env = RecordingEnv(ManualClock())
    with Disk(path=storage, env=env, fsync_frequency=0) as one, \
            Disk(path=storage, env=env, fsync_frequency=0) as two:
        first, second = one.add_task(b""), two.add_task(b"")
    assert first != second
    assert first.rsplit("-", 1)[0] == second.rsplit("-", 1)[0]  # same seed and pid


@pytest.mark.spec("A-10", "W-28")
def test_generated_ids_and_file_names_carry_the_pid(storage: Path) -> None:
    with Disk(path=storage, fsync_frequency=0) as disk:
        task_id = disk.add_task(b"")
    pid = OS_ENV.getpid()
    assert task_id.split("-")[1] == str(pid)
    names = [p.name for p in storage.iterdir() if p.name.startswith("deferred-0-")]
    assert [n.split("-")[3] for n in names] == [str(pid)]


def _orphan(storage: Path, name: str, lines: list[bytes]) -> None:
    storage.mkdir(parents=True, exist_ok=True)
    (storage / name).write_bytes(b"".join(lines))


@pytest.mark.spec("W-15", "W-4")
def test_a_shared_id_resolves_in_file_name_order_not_time_order(storage: Path) -> None:
    # File "a" (first in name order, so the main file) was written LAST in time: it re-adds x.
    # File "b" holds an older add and the removal of x. Name order applies b after a.
    first = wal_file_name("deferred-", "20260101", 100, 1)
    second = wal_file_name("deferred-", "20260102", 200, 1)
    assert first < second
    _orphan(storage, first, [encode_add("x", None, b"newest")])
    _orphan(storage, second, [encode_add("x", None, b"older"), encode_rem("x")])
    with Disk(path=storage, fsync_frequency=0) as disk:
        assert disk.pending_tasks() == []  # the removal in the later-named file wins


@pytest.mark.spec("W-15")
def test_a_shared_id_readded_in_a_later_named_file_wins(storage: Path) -> None:
    first = wal_file_name("deferred-", "20260101", 100, 1)
    second = wal_file_name("deferred-", "20260102", 200, 1)
    _orphan(storage, first, [encode_add("x", None, b"a"), encode_rem("x")])
    _orphan(storage, second, [encode_add("x", 5, b"b")])
    with Disk(path=storage, fsync_frequency=0) as disk:
        [task] = disk.pending_tasks()
    assert (task.task_id, task.context, task.publish_at) == ("x", b"b", 5)

