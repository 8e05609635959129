"""``Disk.remove_tasks``: several removals in one append (spec/wal.md W-79, spec/api.md C-37).

Goal: the batch call is exactly ``remove_task`` of each id, in bytes and in effect, checks
every argument before it writes, and a failed write leaves none of its records. Method: the
same ids removed one by one and in one call on two directories give the same WAL bytes;
``RecordingEnv`` counts the writes; ``FaultyEnv`` fails or shortens the one write.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from deferq._core.errors import StorageClosedError
from deferq._core.walcodec import encode_rem, encode_rems
from deferq.backends import Disk
from deferq.backends.protocol import BatchRemover
from tests.fsenv import FaultyEnv, RecordingEnv, snapshot, wal_bytes

PREFIX = "deferred-"
IDS = ["a", "b", "c", "d"]


def open_disk(path: Path, env: RecordingEnv | FaultyEnv | None = None, f: float = 0) -> Disk:
    return Disk(path=path, prefix=PREFIX, fsync_frequency=f, env=env)


def the_wal(path: Path) -> Path:
    (name,) = [n for n in os.listdir(path) if n.startswith(PREFIX + "0-")]
    return path / name


def filled(path: Path, env: RecordingEnv | FaultyEnv | None = None, f: float = 0) -> Disk:
    disk = open_disk(path, env, f)
    for task_id in IDS:
        disk.add_task(task_id.encode(), task_id=task_id)
    return disk


@pytest.mark.spec("W-79", "C-37")
@pytest.mark.parametrize("f", [0, 0.5], ids=["f=0 (write)", "f=0.5 (mapped window)"])
def test_one_call_writes_the_bytes_of_one_remove_per_pending_id(tmp_path: Path, f: float) -> None:
    batch = ["c", "zz-never-added", "a", "c"]  # not pending, and a repeat: no record each
    with filled(tmp_path / "one-by-one", f=f) as disk:
        for task_id in batch:
            disk.remove_task(task_id)
        expected_pending = disk.pending_tasks()
    env = RecordingEnv()
    with filled(tmp_path / "batch", env, f=f) as disk:
        env.clear()
        assert disk.remove_tasks(iter(batch)) == 2  # any iterable; 2 were pending
        writes = [c for c in env.calls if c.op == "write"]
        assert len(writes) <= 1  # one append (or a store into the mapped window, W-26)
        assert disk.pending_tasks() == expected_pending
        assert [t.task_id for t in expected_pending] == ["b", "d"]
    assert (wal_bytes(the_wal(tmp_path / "batch"))
            == wal_bytes(the_wal(tmp_path / "one-by-one")))
    with open_disk(tmp_path / "batch") as disk:  # and a replay agrees
        assert [t.task_id for t in disk.pending_tasks()] == ["b", "d"]


@pytest.mark.spec("W-79")
def test_nothing_pending_writes_nothing(tmp_path: Path) -> None:
    env = RecordingEnv()
    with filled(tmp_path, env) as disk:
        before = snapshot(tmp_path)
        env.clear()
        assert disk.remove_tasks([]) == 0
        assert disk.remove_tasks(["x", "y"]) == 0
        assert env.calls == []
        assert snapshot(tmp_path) == before


@pytest.mark.spec("C-37")
@pytest.mark.parametrize("args, kwargs, named", [
    (("a",), {}, "task_ids"),
    ((b"ab",), {}, "task_ids"),
    ((7,), {}, "task_ids"),
    ((["a", 7],), {}, "task_id"),
    ((["a", "bad:id"],), {}, "task_id"),
    ((["a", ""],), {}, "task_id"),
    ((["a"],), {"sync": 1}, "sync"),
])
def test_bad_arguments_are_refused_before_anything_is_written(
        tmp_path: Path, args: tuple[object, ...], kwargs: dict[str, object], named: str) -> None:
    with filled(tmp_path) as disk:
        before = snapshot(tmp_path)
        with pytest.raises(ValueError, match=named):
            disk.remove_tasks(*args, **kwargs)  # type: ignore[arg-type]
        assert snapshot(tmp_path) == before
        assert [t.task_id for t in disk.pending_tasks()] == IDS


@pytest.mark.spec("W-79", "W-13")
@pytest.mark.parametrize("short_bytes, error", [(None, errno.ENOSPC), (15, errno.EIO)],
                         ids=["ENOSPC", "short write then EIO"])
def test_a_failed_write_leaves_none_of_the_records(
        tmp_path: Path, short_bytes: int | None, error: int) -> None:
    env = FaultyEnv()
    with filled(tmp_path, env) as disk:
        wal = the_wal(tmp_path)
        before = wal_bytes(wal)
        env.inject("write", path=str(wal), short_bytes=short_bytes,
                   error=0 if short_bytes is not None else error)
        if short_bytes is not None:
            env.inject("write", path=str(wal), nth=2, error=error)
        with pytest.raises(OSError):
            disk.remove_tasks(["a", "b", "c"])
        assert wal_bytes(wal) == before
        assert [t.task_id for t in disk.pending_tasks()] == IDS
        assert disk.remove_tasks(["b"]) == 1  # the WAL stays usable
    with open_disk(tmp_path) as disk:
        assert [t.task_id for t in disk.pending_tasks()] == ["a", "c", "d"]


@pytest.mark.spec("W-79")
def test_the_batch_encoding_is_the_lines_one_at_a_time() -> None:
    ids = ["1-2-3", "x", "a" * 200]
    assert encode_rems(ids) == b"".join(encode_rem(t) for t in ids)
    assert encode_rems([]) == b""


@pytest.mark.spec("C-38")
def test_only_disk_offers_the_batch_removal(tmp_path: Path) -> None:
    from deferq.backends import Memory, Nil

    with open_disk(tmp_path) as disk:
        assert isinstance(disk, BatchRemover)
    assert not isinstance(Memory(), BatchRemover)
    assert not isinstance(Nil(), BatchRemover)


@pytest.mark.spec("C-37")
def test_an_iterable_that_fails_writes_nothing_and_a_closed_disk_refuses(tmp_path: Path) -> None:
    def ids_then_boom() -> Iterator[str]:
        yield "a"
        raise KeyError("the caller's iterable broke")

    disk = filled(tmp_path)
    before = snapshot(tmp_path)
    with pytest.raises(KeyError):
        disk.remove_tasks(ids_then_boom())
    assert snapshot(tmp_path) == before
    assert [t.task_id for t in disk.pending_tasks()] == IDS
    disk.close()
    with pytest.raises(StorageClosedError):
        disk.remove_tasks(["a"])
    with open_disk(tmp_path) as reopened:
        assert [t.task_id for t in reopened.pending_tasks()] == IDS
