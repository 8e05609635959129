"""The tasks WAL of ``Disk`` on the real filesystem (spec/wal.md, W-1..W-14, and C-7..C-11).

Goal: every statement of spec/wal.md holds on a real directory: what is written,
in which order it is made durable, how files are adopted, merged and rotated,
and what happens when the disk fails. Method: each test opens ``Disk`` in its
own ``tmp_path`` through ``tests.fsenv``: ``RecordingEnv`` records the system
calls so orderings ("fsync before unlink") can be asserted, ``FaultyEnv``
makes a chosen call fail with EIO/ENOSPC or write short, and ``ManualClock``
replaces time, so nothing here sleeps. File bytes are compared before and after
to show that nothing else changed.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from deferq._engine.env import Env, OpenFlag
from deferq._core.errors import LimitExceededError, StorageBrokenError, StorageClosedError
from deferq._core.frame import BadLine
from deferq._core.names import is_wal_file_name
from deferq._core.walcodec import WalAdd, WalRem, decode_wal_line, encode_add, encode_rem
from deferq._engine.io import records_end
from deferq._core.limits import (
    CONTEXT_BYTES_MAX,
    READ_CHUNK_BYTES,
    WAL_RESERVE_BYTES,
    WAL_SIZE_LIMIT_BYTES,
)
from deferq._engine.osenv import OsEnv
from deferq._core.types import PendingTask
from deferq.backends import Disk
from tests.fsenv import (
    FaultyEnv,
    ManualClock,
    RecordingEnv,
    append_to_wal,
    snapshot,
    wal_bytes,
    wal_size,
)

PREFIX = "deferred-"
PID = os.getpid()
WALL = 1_700_000_000.25  # int() -> 1_700_000_000, so the first seed is 1_700_000_001
FAR_FUTURE = 2_000_000_000


def open_disk(storage: Path, env: Env | None = None, f: float = 0) -> Disk:
    return Disk(path=storage, prefix=PREFIX, fsync_frequency=f, env=env)


def wal_files(storage: Path) -> list[Path]:
    if not storage.exists():
        return []
    return sorted(p for p in storage.iterdir() if is_wal_file_name(PREFIX, p.name))


def only_wal(storage: Path) -> Path:
    files = wal_files(storage)
    assert len(files) == 1, files
    return files[0]


def ids(disk: Disk) -> list[str]:
    return [t.task_id for t in disk.pending_tasks()]


def corruption_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "corrupted" in r.getMessage()]


def wal_lines_are_all_valid(path: Path) -> bool:
    data = wal_bytes(path)
    if data and not data.endswith(b"\n"):
        return False
    return all(not isinstance(decode_wal_line(line), BadLine) for line in data.split(b"\n")[:-1])


# ----------------------------------------------------------------------------- add/remove/pending


@pytest.mark.spec("W-6", "W-7")
def test_add_returns_the_callers_id_verbatim_and_pending_lists_the_task(storage: Path) -> None:
    with open_disk(storage) as disk:
        assert disk.add_task(b"ctx", task_id="caller-Id_1") == "caller-Id_1"
        assert disk.add_task(b"", publish_at=FAR_FUTURE, task_id="later") == "later"
        assert disk.pending_tasks() == [PendingTask("caller-Id_1", b"ctx", None),
                                        PendingTask("later", b"", FAR_FUTURE)]
    with open_disk(storage) as disk:
        assert disk.pending_tasks() == [PendingTask("caller-Id_1", b"ctx", None),
                                        PendingTask("later", b"", FAR_FUTURE)]


@pytest.mark.spec("W-7", "R-@J")
def test_readding_an_id_replaces_the_task_and_keeps_its_position(storage: Path) -> None:
    with open_disk(storage) as disk:
        for name in ("a", "b", "c"):
            disk.add_task(name.encode(), task_id=name)
        disk.add_task(b"b2", publish_at=FAR_FUTURE, task_id="b")
        expected = [PendingTask("a", b"a", None), PendingTask("b", b"b2", FAR_FUTURE),
                    PendingTask("c", b"c", None)]
        assert disk.pending_tasks() == expected
    with open_disk(storage) as disk:  # Replay applies the same rule (R-@J).
        assert disk.pending_tasks() == expected


@pytest.mark.spec("W-6")
def test_removing_an_id_that_is_not_pending_writes_nothing(storage: Path) -> None:
    env = RecordingEnv()
    with open_disk(storage, env) as disk:
        disk.add_task(b"x", task_id="x")
        disk.remove_task("x")
        wal = only_wal(storage)
        before = wal.read_bytes()
        env.clear()
        disk.remove_task("x")  # already removed
        disk.remove_task("never-added")
        assert env.calls == []
        assert wal.read_bytes() == before
        assert disk.pending_tasks() == []


@pytest.mark.spec("R-@I")
def test_replayed_rem_of_an_id_that_is_not_pending_is_a_no_op(
        storage: Path, caplog: pytest.LogCaptureFixture) -> None:
    with open_disk(storage) as disk:
        disk.add_task(b"a", task_id="a")
    wal = only_wal(storage)
    append_to_wal(wal, encode_rem("ghost") + encode_add("b", None, b"b") + encode_rem("ghost"))
    with caplog.at_level(logging.WARNING, logger="deferq"), open_disk(storage) as disk:
        assert ids(disk) == ["a", "b"]
    assert corruption_warnings(caplog) == []


@pytest.mark.spec("W-7")
def test_pending_is_idempotent_does_no_io_and_includes_tasks_added_since_open(
        storage: Path) -> None:
    with open_disk(storage) as disk:
        disk.add_task(b"old", task_id="old")
    env = RecordingEnv()
    with open_disk(storage, env) as disk:
        disk.add_task(b"new", task_id="new")
        env.clear()
        first = disk.pending_tasks()
        second = disk.pending_tasks()
        assert env.calls == []
        assert first == second == [PendingTask("old", b"old", None),
                                   PendingTask("new", b"new", None)]
        disk.remove_task("old")
        assert disk.pending_tasks() == [PendingTask("new", b"new", None)]


# ----------------------------------------------------------------------------- ids (W-28)


@pytest.mark.spec("W-28")
def test_generated_ids_are_seed_pid_counter_and_the_seed_follows_the_monotonic_clock(
        storage: Path) -> None:
    clock = ManualClock(wall=WALL)
    seed = int(WALL) + 1
    with open_disk(storage, RecordingEnv(clock)) as disk:
        assert disk.add_task(b"") == f"{seed}-{PID}-1"
        assert disk.add_task(b"") == f"{seed}-{PID}-2"
        clock.advance(0.5)
        assert disk.add_task(b"") == f"{seed}-{PID}-3"
        clock.advance(0.5)  # one whole second since open: the seed moves, n restarts
        assert disk.add_task(b"") == f"{seed + 1}-{PID}-1"
        clock.advance(3.0)
        assert disk.add_task(b"") == f"{seed + 4}-{PID}-1"
        clock.set_wall(WALL - 86_400)  # a wall-clock step changes nothing while running
        assert disk.add_task(b"") == f"{seed + 4}-{PID}-2"


@pytest.mark.spec("W-28")
def test_the_seed_starts_above_the_largest_seed_in_the_adopted_files(storage: Path) -> None:
    with open_disk(storage, RecordingEnv(ManualClock(wall=WALL))) as disk:
        disk.add_task(b"", task_id="1800000000-7-1")
        disk.remove_task("1800000000-7-1")  # removed tasks' ids still count
    with open_disk(storage, RecordingEnv(ManualClock(wall=WALL))) as disk:
        assert disk.add_task(b"") == f"1800000001-{PID}-1"


@pytest.mark.spec("W-28")
def test_a_restart_with_the_same_pid_and_the_clock_stepped_back_never_repeats_an_id(
        storage: Path) -> None:
    clock = ManualClock(wall=WALL)
    issued: set[str] = set()
    with open_disk(storage, RecordingEnv(clock)) as disk:
        for _ in range(3):
            for _ in range(3):
                issued.add(disk.add_task(b""))
            clock.advance(1.0)  # seeds run ahead of the wall clock's start
        for task_id in list(issued)[:4]:
            disk.remove_task(task_id)
    for wall in (WALL, WALL - 3600, WALL + 1):
        with open_disk(storage, RecordingEnv(ManualClock(wall=wall))) as disk:
            new = {disk.add_task(b"") for _ in range(5)}
        assert not new & issued
        issued |= new


@pytest.mark.spec("W-28", "R-@C")
def test_damaged_or_oversized_seeds_in_the_file_do_not_move_the_seed(storage: Path) -> None:
    with open_disk(storage, RecordingEnv(ManualClock(wall=WALL))) as disk:
        disk.add_task(b"", task_id="99999999999999999999-1-1")  # 20 digits: not a seed
    wal = only_wal(storage)
    bad = encode_add("999999999999-1-1", None, b"")
    bad = b"00000000" + bad[8:]  # a huge 12-digit seed behind a wrong CRC
    append_to_wal(wal, bad)
    with open_disk(storage, RecordingEnv(ManualClock(wall=WALL))) as disk:
        assert disk.add_task(b"") == f"{int(WALL) + 1}-{PID}-1"


@pytest.mark.spec("W-28", "W-68")
def test_two_disks_of_one_process_sharing_an_env_never_issue_the_same_id(
        storage: Path, tmp_path: Path) -> None:
    env = RecordingEnv(ManualClock(wall=WALL))
    with open_disk(storage, env) as one, open_disk(storage, env) as two, \
            open_disk(tmp_path / "elsewhere", env) as three:
        issued = [disk.add_task(b"") for disk in (one, two, three, two, one)]
    assert len(set(issued)) == len(issued)


@pytest.mark.spec("W-28", "W-9", "W-67")
def test_ids_issued_before_a_rotation_are_not_repeated_after_a_restart_with_the_clock_back(
        storage: Path) -> None:
    clock = ManualClock(wall=WALL)
    with open_disk(storage, RecordingEnv(clock), f=3600) as disk:
        first = disk.add_task(b"")
        disk.remove_task(first)
        name = only_wal(storage).name
        for _ in range(200):
            disk.remove_task(disk.add_task(b"f" * 30_000))
            if only_wal(storage).name != name:
                break
        assert only_wal(storage).name != name, "no rotation happened"
    with open_disk(storage, RecordingEnv(ManualClock(wall=WALL))) as disk:
        assert disk.add_task(b"") != first


# ----------------------------------------------------------------------------- W-1 / W-27


@pytest.mark.spec("W-1", "F-1")
def test_a_new_wal_file_is_exclusive_locked_and_its_directory_fsynced_before_the_first_write(
        storage: Path) -> None:
    env = RecordingEnv()
    with open_disk(storage, env) as disk:
        wal = str(only_wal(storage))
        match = re.fullmatch(rf"deferred-0-(\d{{8}})-{PID}-([0-9a-z]{{1,7}})", Path(wal).name)
        assert match is not None and match.group(1) == env.local_date()
        created = env.index("open", wal)
        flags = env.calls[created].flags
        assert flags is not None and OpenFlag.CREATE in flags and OpenFlag.EXCLUSIVE in flags
        locked = env.index("flock", wal, start=created)
        durable = env.index("fsync_dir", str(storage), start=locked)
        disk.add_task(b"x")
        assert env.index("write", wal) > durable


@pytest.mark.spec("W-27", "W-66")
def test_a_second_disk_creates_its_own_file_while_the_first_is_open_and_adopts_after_close(
        storage: Path) -> None:
    first = open_disk(storage)
    first.add_task(b"1", task_id="one")
    mine = only_wal(storage)
    second = open_disk(storage)
    theirs = next(p for p in wal_files(storage) if p != mine)
    assert ids(second) == []
    second.add_task(b"2", task_id="two")
    first.close()
    with open_disk(storage) as third:  # adopts the closed file only; the open one stays locked
        assert ids(third) == ["one"]
        files = wal_files(storage)
        assert theirs in files and mine not in files and len(files) == 2  # mine was copied (W-3)
    second.close()
    with open_disk(storage) as fourth:
        assert set(ids(fourth)) == {"one", "two"}
        assert len(wal_files(storage)) == 1


def make_orphans(storage: Path, count: int) -> list[tuple[Path, list[str]]]:
    """``count`` closed WAL files, each with its own tasks; returned sorted by file name."""
    disks: list[Disk] = []
    files: dict[Path, list[str]] = {}
    for number in range(count):
        known = set(wal_files(storage))
        disk = open_disk(storage)  # the others hold their files: this one creates its own
        disks.append(disk)
        (path,) = set(wal_files(storage)) - known
        task_ids = [f"w{number}-{i}" for i in range(3)]
        for task_id in task_ids:
            disk.add_task(task_id.encode(), task_id=task_id)
        disk.remove_task(task_ids[0])
        files[path] = task_ids[1:]
    for disk in disks:
        disk.close()
    return sorted(files.items())


def only_fresh_copy(storage: Path, adopted: list[Path]) -> Path:
    """The one WAL file left after adoption: a new one, none of the ``adopted`` (W-3, W-4)."""
    fresh = only_wal(storage)
    assert fresh not in adopted
    return fresh


@pytest.mark.spec("W-27", "W-3", "W-4", "W-28", "W-66")
def test_orphans_are_copied_in_name_order_to_a_fresh_fsynced_file_and_only_then_unlinked(
        storage: Path) -> None:
    (first, first_ids), (other, other_ids) = make_orphans(storage, 2)
    env = RecordingEnv()
    with open_disk(storage, env) as disk:
        assert ids(disk) == first_ids + other_ids
        fresh = str(only_fresh_copy(storage, [first, other]))
        created = env.index("open", fresh)
        assert (flags := env.calls[created].flags) is not None and OpenFlag.EXCLUSIVE in flags
        name_synced = env.index("fsync_dir", str(storage), start=created)
        copied = env.index("write", fresh, start=name_synced)
        synced = env.index("fsync", fresh, start=env.last_index("write", fresh))
        unlinked = max(env.index("unlink", str(path), start=synced) for path in (first, other))
        dir_synced = env.index("fsync_dir", str(storage), start=unlinked)
        for path in (first, other):
            env.index("close", str(path), start=dir_synced)
            assert not env.calls_of("write", str(path)) and not env.calls_of("ftruncate", str(path))
        assert copied < synced
        lines = wal_bytes(fresh).split(b"\n")
        marker = decode_wal_line(lines[0])  # W-28: the seed marker comes first
        assert isinstance(marker, WalRem) and marker.task_id.endswith(f"-{PID}-0")
        assert [decode_wal_line(line) for line in lines[1:-1]] == [
            WalAdd(task_id, None, task_id.encode()) for task_id in first_ids + other_ids]
        disk.add_task(b"z", task_id="z")
        assert env.last_index("write", fresh) > dir_synced
    with open_disk(storage) as disk:
        assert ids(disk) == first_ids + other_ids + ["z"]


class UnlinkBeforeLockEnv(RecordingEnv):
    """Unlinks ``victim`` between its open and its flock, as a rotating owner could."""

    def __init__(self, victim: Path) -> None:
        super().__init__()
        self.victim = victim

    def flock_exclusive_nb(self, fd: int) -> bool:
        if self.path_of(fd) == str(self.victim) and self.victim.exists():
            self.victim.unlink()
        return super().flock_exclusive_nb(fd)


@pytest.mark.spec("W-27")
def test_a_file_unlinked_between_open_and_lock_is_skipped(storage: Path) -> None:
    (ghost, _), (kept, kept_ids) = make_orphans(storage, 2)
    env = UnlinkBeforeLockEnv(ghost)
    with open_disk(storage, env) as disk:
        assert ids(disk) == kept_ids
        only_fresh_copy(storage, [kept])
        assert not env.calls_of("pread", str(ghost))


@pytest.mark.spec("F-1", "F-15")
def test_files_not_matching_the_wal_name_pattern_are_never_opened_or_changed(
        storage: Path) -> None:
    storage.mkdir()
    line = encode_add("stranger", None, b"s")
    strangers = ["deferred-0-20240101-123-ABC", "deferred-0-2024011-1-a",
                 "deferred-0-20240101-1-a-b", "deferred-1-20240101-1-a",
                 "other-0-20240101-1-a", "deferred-0-20240101-12345678901-a",
                 "deferred-0-20240101-1-zzzzzzzz"]
    for name in strangers:
        (storage / name).write_bytes(line + b"torn")
    before = snapshot(storage)
    env = RecordingEnv()
    with open_disk(storage, env) as disk:
        assert ids(disk) == []
        opened = {Path(c.path).name for c in env.calls_of("open") if c.path}
        assert not opened & set(strangers)
    after = snapshot(storage)
    assert {name: after[name] for name in strangers} == {name: before[name] for name in strangers}


# ----------------------------------------------------------------------------- W-3 / W-4


TORN_TAILS = {
    "text": b"abc",
    "zero fill": b"\0" * 4096,
    "partial record": encode_add("lost", None, b"lost-context")[:-7],
}


@pytest.mark.spec("W-3", "W-4", "R-@F", "W-45")
@pytest.mark.parametrize("tail", list(TORN_TAILS.values()), ids=list(TORN_TAILS))
def test_a_torn_tail_is_left_behind_with_the_adopted_file_and_never_appended_to(
        storage: Path, tail: bytes, caplog: pytest.LogCaptureFixture) -> None:
    with open_disk(storage) as disk:
        disk.add_task(b"a", task_id="a")
        disk.add_task(b"b", task_id="b")
    wal = only_wal(storage)
    wal.write_bytes(wal_bytes(wal) + tail)
    env = RecordingEnv()
    with open_disk(storage, env) as disk:
        fresh = only_fresh_copy(storage, [wal])
        assert not env.calls_of("write", str(wal)) and not env.calls_of("ftruncate", str(wal))
        disk.add_task(b"c", task_id="c")
    records = wal_bytes(fresh).split(b"\n", 1)[1]  # after the seed marker (W-28)
    assert records == b"".join(encode_add(t, None, t.encode()) for t in ("a", "b", "c"))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="deferq"), open_disk(storage) as disk:
        assert ids(disk) == ["a", "b", "c"]
    assert corruption_warnings(caplog) == []


@pytest.mark.spec("W-3", "W-9")
def test_an_adopted_file_is_copied_and_the_copy_fsynced_before_open_returns(storage: Path) -> None:
    with open_disk(storage, f=3600) as disk:  # f > 0: the records may still be unsynced
        disk.add_task(b"a", task_id="a")
    wal = only_wal(storage)
    env = RecordingEnv()
    with open_disk(storage, env, f=3600) as disk:
        fresh = str(only_fresh_copy(storage, [wal]))
        opened = len(env.calls)
        assert env.last_index("fsync", fresh) > env.last_index("write", fresh)
        assert env.calls_of("fsync", str(wal)) == []  # its fsync may write nothing
        disk.add_task(b"b", task_id="b")
        assert env.index("write", fresh, start=opened) >= opened


@pytest.mark.spec("W-15", "W-27", "R-@J", "R-@I")
@pytest.mark.parametrize("merged_record,expected", [
    (encode_add("dup", None, b"merged"), [("dup", b"merged"), ("x", b"x"), ("y", b"y")]),
    (encode_rem("dup"), [("x", b"x"), ("y", b"y")]),
], ids=["re-add", "rem"])
def test_records_of_one_id_in_several_files_apply_main_first_then_in_name_order(
        storage: Path, merged_record: bytes, expected: list[tuple[str, bytes]]) -> None:
    storage.mkdir()
    # The merged file is older (by mtime) but later by name: name order decides, not time.
    main = storage / "deferred-0-20240102-1-1"
    other = storage / "deferred-0-20240102-1-2"
    main.write_bytes(encode_add("dup", None, b"main") + encode_add("x", None, b"x"))
    other.write_bytes(encode_add("y", None, b"y") + merged_record)
    os.utime(other, (1, 1))
    with open_disk(storage) as disk:
        assert [(t.task_id, t.context) for t in disk.pending_tasks()] == expected
        only_fresh_copy(storage, [main, other])
    with open_disk(storage) as disk:  # the copy keeps the outcome (W-3)
        assert [(t.task_id, t.context) for t in disk.pending_tasks()] == expected


@pytest.mark.spec("W-4", "R-@F", "D-5")
def test_a_torn_tail_of_a_merged_orphan_is_not_copied_and_the_following_records_survive(
        storage: Path, caplog: pytest.LogCaptureFixture) -> None:
    # The reference bug: Rage copied the fragment, and the next record glued onto it was lost.
    orphans = make_orphans(storage, 3)
    (main, main_ids), (middle, middle_ids), (last, last_ids) = orphans
    for path in (middle, last):
        append_to_wal(path, encode_add("torn", None, b"torn")[:-9])
    with open_disk(storage) as disk:
        assert ids(disk) == main_ids + middle_ids + last_ids
        fresh = only_fresh_copy(storage, [main, middle, last])
        assert wal_lines_are_all_valid(fresh)
        disk.add_task(b"z", task_id="z")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="deferq"), open_disk(storage) as disk:
        assert ids(disk) == main_ids + middle_ids + last_ids + ["z"]
    assert corruption_warnings(caplog) == []


def is_new_wal(adopted: list[Path]) -> Callable[[str | None], bool]:
    """Matches the path of a WAL file that is none of ``adopted``: the fresh copy (W-3)."""
    names = {str(path) for path in adopted}
    return lambda p: p is not None and is_wal_file_name(PREFIX, Path(p).name) and p not in names


@pytest.mark.spec("W-4", "W-10", "W-46")
@pytest.mark.parametrize("failing", ["write", "fsync"])
def test_a_failed_copy_at_adoption_is_discarded_and_the_adopted_files_are_left_unchanged(
        storage: Path, failing: str) -> None:
    orphans = make_orphans(storage, 2)
    adopted = [path for path, _ in orphans]
    before = snapshot(storage)
    env = FaultyEnv()
    env.inject(failing, match=is_new_wal(adopted))
    with pytest.raises(OSError) as raised:
        open_disk(storage, env)
    assert not isinstance(raised.value, StorageBrokenError)
    assert snapshot(storage) == before  # the copy was unlinked, nothing else changed
    discarded = env.index("unlink")
    assert is_new_wal(adopted)(env.calls[discarded].path)
    env.index("fsync_dir", str(storage), start=discarded)
    assert not any(call.path in {str(p) for p in adopted} for call in env.calls_of("unlink"))
    with open_disk(storage) as disk:  # the next worker adopts the same tasks
        assert ids(disk) == [task for _, tasks in orphans for task in tasks]


@pytest.mark.spec("W-4", "W-12", "W-47")
def test_a_failed_unlink_of_an_adopted_file_makes_open_fail_stop_and_keeps_the_tasks(
        storage: Path) -> None:
    orphans = make_orphans(storage, 2)
    env = FaultyEnv()
    env.inject("unlink", path=str(orphans[1][0]))
    with pytest.raises(StorageBrokenError):
        open_disk(storage, env)
    assert orphans[1][0].exists()
    with open_disk(storage) as disk:  # the copy and the survivor hold the same pending tasks
        # (in name order: the copy may sort before the survivor, so only the set is the same)
        assert sorted(ids(disk)) == sorted(task for _, tasks in orphans for task in tasks)
        only_wal(storage)


# ----------------------------------------------------------------------------- W-8 fsync policy


@pytest.mark.spec("W-48")
def test_fsync_frequency_zero_fsyncs_every_add_and_remove_before_returning(
        storage: Path) -> None:
    env = RecordingEnv(ManualClock())
    with open_disk(storage, env, f=0) as disk:
        wal = str(only_wal(storage))
        assert env.clock is not None and env.clock.timers == []
        for action in (lambda: disk.add_task(b"a", task_id="a"),
                       lambda: disk.add_task(b"b", publish_at=FAR_FUTURE, task_id="b"),
                       lambda: disk.remove_task("a")):
            env.clear()
            action()
            # The first record also reserves space after itself (W-25); with f = 0 the WAL
            # writes its records, it does not map (W-26).
            assert env.ops(wal) in (["write", "fsync"], ["allocate", "write", "fsync"])


@pytest.mark.spec("W-8")
def test_positive_fsync_frequency_fsyncs_only_once_the_period_has_passed(storage: Path) -> None:
    clock = ManualClock()
    env = RecordingEnv(clock)
    with open_disk(storage, env, f=5) as disk:
        wal = str(only_wal(storage))
        assert [t.interval_s for t in clock.active_timers()] == [5]
        env.clear()
        disk.add_task(b"a", task_id="a")
        clock.advance(4.5)
        disk.add_task(b"b", task_id="b")
        disk.remove_task("a")
        assert env.calls_of("fsync", wal) == []  # writes within the period do not fsync
        clock.advance(0.5)
        clock.fire_timers()  # the background timer fires once the period is over
        assert len(env.calls_of("fsync", wal)) == 1
        clock.advance(60)
        clock.fire_timers()
        disk.tick()
        assert len(env.calls_of("fsync", wal)) == 1  # nothing unsynced: no fsync
        disk.add_task(b"c", task_id="c")  # the period is long over: this write fsyncs inline
        assert env.ops(wal)[-2:] == ["write", "fsync"]
        disk.add_task(b"d", task_id="d")
        assert env.ops(wal)[-1] == "write"


@pytest.mark.spec("W-8", "C-9", "W-49")
def test_sync_fsyncs_now_and_close_fsyncs_and_stops_the_timer(storage: Path) -> None:
    clock = ManualClock()
    env = RecordingEnv(clock)
    disk = open_disk(storage, env, f=5)
    wal = str(only_wal(storage))
    env.clear()
    disk.add_task(b"a", task_id="a")
    assert env.calls_of("fsync", wal) == []
    disk.sync()
    assert len(env.calls_of("fsync", wal)) == 1
    disk.sync()  # nothing new: no second fsync
    assert len(env.calls_of("fsync", wal)) == 1
    disk.add_task(b"b", task_id="b")
    disk.close()
    assert len(env.calls_of("fsync", wal)) == 2
    assert env.index("fsync", wal, start=env.last_index("write", wal)) < env.index("close", wal)
    assert clock.active_timers() == []
    clock.timers[0].callback()  # a timer that fires while close runs must not raise
    disk.tick()


@pytest.mark.spec("C-9")
def test_close_stops_the_real_background_timer_thread(storage: Path) -> None:
    disk = Disk(path=storage, fsync_frequency=0.5)
    assert any(t.name == "deferq-ticker" for t in threading.enumerate())
    disk.close()
    assert not any(t.name == "deferq-ticker" and t.is_alive() for t in threading.enumerate())


# ----------------------------------------------------------------------------- rotation


FILLER = b"f" * 30_000


def churn(disk: Disk, storage: Path, *, until_rotations: int,
          max_cycles: int = 400) -> list[tuple[int, bool]]:
    """Add and remove filler tasks until the WAL file has rotated ``until_rotations`` times.

    Returns one (size the remove left in the file before any rotation, rotated?) per cycle.
    """
    out: list[tuple[int, bool]] = []
    rotations = 0
    for _ in range(max_cycles):
        tid = disk.add_task(FILLER)
        before = only_wal(storage)
        size_after_remove = wal_size(before) + len(encode_rem(tid))
        disk.remove_task(tid)
        rotated = not before.exists()
        out.append((size_after_remove, rotated))
        rotations += rotated
        if rotations == until_rotations:
            return out
    raise AssertionError(f"only {rotations} rotations in {max_cycles} cycles")


@pytest.mark.spec("W-9", "W-10", "W-11", "W-28", "W-67")
def test_rotation_copies_every_live_task_to_a_new_file_and_drops_the_old_one_in_order(
        storage: Path) -> None:
    clock = ManualClock()
    env = RecordingEnv(clock)
    with open_disk(storage, env, f=3600) as disk:
        for i in range(3):
            disk.add_task(b"delayed-%d" % i, publish_at=FAR_FUTURE + i, task_id=f"delayed-{i}")
            disk.add_task(b"now-%d" % i, task_id=f"now-{i}")  # immediate tasks never block it
        expected = disk.pending_tasks()
        old = only_wal(storage)
        env.clear()
        cycles = churn(disk, storage, until_rotations=1)
        sizes = [size for size, _ in cycles]
        assert all(size < WAL_SIZE_LIMIT_BYTES for size in sizes[:-1])
        assert sizes[-1] >= WAL_SIZE_LIMIT_BYTES
        new = only_wal(storage)
        assert new != old and not old.exists()
        assert disk.pending_tasks() == expected
        records = [decode_wal_line(rec) for rec in wal_bytes(new).split(b"\n")[:-1]]
        assert records[0] == WalRem(f"{int(clock.wall) + 1}-{PID}-0")  # the W-28 seed marker
        assert [(r.task_id, r.publish_at, r.context) for r in records
                if isinstance(r, WalAdd)] == [(t.task_id, t.publish_at, t.context) for t in expected]
        assert all(isinstance(r, WalRem) and r.task_id not in ids(disk)  # at most markers
                   for r in records if not isinstance(r, WalAdd))
        created = next(i for i, c in enumerate(env.calls) if c.op == "open" and c.path == str(new))
        named = env.index("fsync_dir", str(storage), start=created)
        written = env.index("write", str(new), start=named)
        synced = env.index("fsync", str(new), start=written)
        unlinked = env.index("unlink", str(old), start=synced)
        dir_synced = env.index("fsync_dir", str(storage), start=unlinked)
        env.index("close", str(old), start=dir_synced)
        assert len(env.calls_of("close", str(old))) == 1  # open (locked) until then
    with open_disk(storage) as disk:
        assert disk.pending_tasks() == expected


@pytest.mark.spec("W-9")
def test_the_rotation_limit_grows_while_live_tasks_fill_two_thirds_of_it(storage: Path) -> None:
    big = b"L" * 140_000  # 8 live tasks of ~187 KB: ~1.49 MB survive every rotation
    with open_disk(storage, RecordingEnv(ManualClock()), f=3600) as disk:
        for i in range(8):
            disk.add_task(big, task_id=f"big-{i}")
        first = churn(disk, storage, until_rotations=1)
        live_size = wal_size(only_wal(storage))
        assert live_size >= WAL_SIZE_LIMIT_BYTES * 2 / 3
        limit = WAL_SIZE_LIMIT_BYTES * 1.5  # the smallest 2e6 * 1.5**k with live < 2/3 of it
        second = churn(disk, storage, until_rotations=1)
        sizes = [size for size, _ in second]
        assert max(sizes[:-1]) >= WAL_SIZE_LIMIT_BYTES + 100_000  # 2 MB no longer rotates
        assert all(size < limit for size in sizes[:-1]) and sizes[-1] >= limit
        assert first[-1][1] and second[-1][1]
        assert ids(disk) == [f"big-{i}" for i in range(8)]


@pytest.mark.spec("W-10", "W-50")
@pytest.mark.parametrize("op,error", [("write", errno.ENOSPC), ("fsync", errno.EIO)],
                         ids=["write ENOSPC", "fsync EIO"])
def test_a_failed_rotation_keeps_the_old_file_and_is_retried_after_more_growth(
        storage: Path, op: str, error: int, caplog: pytest.LogCaptureFixture) -> None:
    env = FaultyEnv(ManualClock())
    with open_disk(storage, env, f=3600) as disk:
        disk.add_task(b"keep", task_id="keep")
        old = only_wal(storage)
        env.inject(op, error=error,  # the new file's first write or fsync fails
                   match=lambda p: p is not None and p != str(old)
                   and is_wal_file_name(PREFIX, Path(p).name))
        with caplog.at_level(logging.WARNING, logger="deferq"):
            cycles = churn(disk, storage, until_rotations=1)
        sizes = [size for size, _ in cycles]
        failed_at = next(i for i, size in enumerate(sizes) if size >= WAL_SIZE_LIMIT_BYTES)
        assert failed_at < len(sizes) - 1, "the first rotation should have failed"
        assert any("rotation failed" in r.getMessage() for r in caplog.records)
        retry_limit = sizes[failed_at] * 1.5
        assert all(size < retry_limit for size in sizes[failed_at + 1:-1])
        assert sizes[-1] >= retry_limit - 1
        assert ids(disk) == ["keep"]
        assert not old.exists() and len(wal_files(storage)) == 1
    with open_disk(storage) as disk:
        assert ids(disk) == ["keep"]


@pytest.mark.spec("W-10", "W-12", "W-52")
@pytest.mark.parametrize("op", ["unlink", "fsync_dir"])
def test_a_failure_after_the_rotation_switch_breaks_the_wal_and_loses_no_task(
        storage: Path, op: str) -> None:
    env = FaultyEnv(ManualClock())
    with open_disk(storage, env, f=3600) as disk:
        disk.add_task(b"keep", task_id="keep")
        disk.add_task(b"later", publish_at=FAR_FUTURE, task_id="later")
        old = only_wal(storage)
        if op == "unlink":
            env.inject("unlink", path=str(old))
        else:  # the directory fsync that follows the old file's unlink
            env.inject("fsync_dir", match=lambda p: p == str(storage) and not old.exists())
        with pytest.raises(StorageBrokenError):
            churn(disk, storage, until_rotations=2)
        for call in (lambda: disk.add_task(b"x"), disk.pending_tasks, disk.sync):
            with pytest.raises(StorageBrokenError):
                call()
    with open_disk(storage) as disk:
        assert sorted(ids(disk)) == ["keep", "later"]


# ----------------------------------------------------------------------------- failures


@pytest.mark.spec("W-12", "D-10")
def test_a_failed_fsync_breaks_the_wal_for_good_and_is_never_retried(storage: Path) -> None:
    env = FaultyEnv()
    disk = open_disk(storage, env, f=0)
    disk.add_task(b"a", task_id="a")
    wal = str(only_wal(storage))
    env.inject("fsync", path=wal, times=1_000)
    with pytest.raises(StorageBrokenError) as info:
        disk.add_task(b"b", task_id="b")
    assert isinstance(info.value.__cause__, OSError) and info.value.__cause__.errno == errno.EIO
    env.clear()
    later: list[Callable[[], object]] = [
        lambda: disk.add_task(b"c"), lambda: disk.remove_task("a"),
        disk.pending_tasks, disk.sync]
    for call in later:
        with pytest.raises(StorageBrokenError):
            call()
    disk.tick()
    disk.close()
    assert env.calls_of("fsync", wal) == [] and env.calls_of("fsync!", wal) == []
    assert env.calls_of("write", wal) == []


@pytest.mark.spec("W-12")
def test_a_failed_background_fsync_makes_the_next_call_raise_storage_broken(
        storage: Path) -> None:
    clock = ManualClock()
    env = FaultyEnv(clock)
    with open_disk(storage, env, f=1) as disk:
        disk.add_task(b"a", task_id="a")
        env.inject("fsync", path=str(only_wal(storage)))
        clock.advance(1)
        with pytest.raises(StorageBrokenError):
            clock.fire_timers()
        with pytest.raises(StorageBrokenError):
            disk.add_task(b"b")
        fsyncs = len(env.calls_of("fsync")) + len(env.calls_of("fsync!"))
    assert len(env.calls_of("fsync")) + len(env.calls_of("fsync!")) == fsyncs


# Each fault: (nth call, bytes a short write writes or None, errno raised otherwise).
WRITE_FAILURES: dict[str, list[tuple[int, int | None, int]]] = {
    "ENOSPC": [(1, None, errno.ENOSPC)],
    "short write then ENOSPC": [(1, 11, 0), (2, None, errno.ENOSPC)],
    "write returns 0": [(1, 0, 0)],
}


@pytest.mark.spec("W-13", "D-10", "W-25")
@pytest.mark.parametrize("faults", list(WRITE_FAILURES.values()), ids=list(WRITE_FAILURES))
def test_a_failed_write_is_cut_back_and_the_wal_stays_usable(
        storage: Path, faults: list[tuple[int, int | None, int]],
        caplog: pytest.LogCaptureFixture) -> None:
    env = FaultyEnv()
    with open_disk(storage, env, f=0) as disk:
        disk.add_task(b"a", task_id="a")
        wal = only_wal(storage)
        before = wal_bytes(wal)
        assert wal.stat().st_size > len(before)  # space reserved after the record (W-25)
        for nth, short_bytes, error in faults:
            env.inject("write", path=str(wal), nth=nth, short_bytes=short_bytes, error=error)
        with pytest.raises(OSError) as info:
            disk.add_task(b"b" * 100, task_id="b")
        assert not isinstance(info.value, StorageBrokenError)
        assert wal.read_bytes() == before  # cut back to the records, reserved space too
        assert ids(disk) == ["a"]
        # The next record goes right after "a" (the offset was moved back, W-13): no hole
        # of zeros that the replay below would count as damage (R-@K).
        disk.add_task(b"c", task_id="c")
        disk.remove_task("a")
        assert ids(disk) == ["c"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="deferq"), open_disk(storage) as disk:
        assert ids(disk) == ["c"]
    assert corruption_warnings(caplog) == []


# ----------------------------------------------------------------------------- reserved space


@pytest.mark.spec("W-25", "R-@L", "F-46", "W-58")
def test_records_are_written_into_space_reserved_after_them_and_read_back_without_it(
        storage: Path, caplog: pytest.LogCaptureFixture) -> None:
    env = RecordingEnv()
    with open_disk(storage, env, f=0) as disk:
        wal = only_wal(storage)
        env.clear()
        first = disk.add_task(b"a" * 10, task_id="a")
        assert env.ops(str(wal)) == ["allocate", "write", "fsync"]
        records = encode_add(first, None, b"a" * 10)
        assert wal.stat().st_size == WAL_RESERVE_BYTES  # reserved from the records' end (0)
        assert wal_bytes(wal) == records
        env.clear()
        for n in range(50):
            disk.remove_task(disk.add_task(b"%d" % n))
        assert "allocate" not in env.ops(str(wal))  # 50 records fit in the reserved space
        data = wal.read_bytes()
        end = len(data.rstrip(b"\0"))
        assert data[end - 1:end] == b"\n" and data[end:] == bytes(len(data) - end)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="deferq"), open_disk(storage) as disk:
        assert ids(disk) == ["a"]
    assert corruption_warnings(caplog) == []  # the reserved zeros are not damage (R-@L)
    assert not wal.exists() and wal_lines_are_all_valid(only_wal(storage))


@pytest.mark.spec("W-25", "W-58")
def test_a_record_longer_than_the_reserve_step_reserves_its_own_size(storage: Path) -> None:
    env = RecordingEnv()
    big = b"x" * (WAL_RESERVE_BYTES + 1000)
    with open_disk(storage, env, f=0) as disk:
        wal = only_wal(storage)
        env.clear()
        disk.add_task(big, task_id="big")
        assert env.ops(str(wal)) == ["allocate", "write", "fsync"]
        size = len(encode_add("big", None, big))
        assert wal.stat().st_size == size  # reserved exactly the record, then filled it
        env.clear()
        disk.add_task(b"", task_id="small")  # the next one reserves again
        assert env.ops(str(wal)) == ["allocate", "write", "fsync"]
    with open_disk(storage) as disk:
        assert ids(disk) == ["big", "small"]


@pytest.mark.spec("W-25", "W-59")
@pytest.mark.parametrize("error,asked_again", [
    (errno.ENOSPC, True), (errno.EIO, True), (errno.EOPNOTSUPP, False), (errno.EINVAL, False),
], ids=["ENOSPC", "EIO", "EOPNOTSUPP", "EINVAL"])
def test_a_failed_reservation_never_fails_the_write(
        storage: Path, error: int, asked_again: bool, caplog: pytest.LogCaptureFixture) -> None:
    env = FaultyEnv()
    with open_disk(storage, env, f=0) as disk:
        wal = str(only_wal(storage))
        fault = env.inject("allocate", path=wal, error=error)
        disk.add_task(b"a", task_id="a")  # the write goes ahead and grows the file
        assert fault.fired == 1
        assert Path(wal).stat().st_size == len(encode_add("a", None, b"a"))
        disk.add_task(b"b", task_id="b")
        assert (len(env.calls_of("allocate", wal)) == 1) is asked_again  # only non-failed calls
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="deferq"), open_disk(storage) as disk:
        assert ids(disk) == ["a", "b"]
    assert corruption_warnings(caplog) == []


@pytest.mark.spec("W-25", "W-59")
def test_without_posix_fallocate_the_wal_grows_as_it_writes(
        storage: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import deferq._engine.osenv  # noqa: PLC0415 - the module whose capability is taken away

    monkeypatch.setattr(deferq._engine.osenv, "_posix_fallocate", None)  # as on macOS
    env = RecordingEnv()
    with open_disk(storage, env, f=0) as disk:
        wal = only_wal(storage)
        for name in ("a", "b", "c"):
            disk.add_task(name.encode(), task_id=name)
        assert len(env.calls_of("allocate", str(wal))) == 1  # refused once, then never asked
        assert wal.read_bytes() == b"".join(encode_add(t, None, t.encode()) for t in "abc")
    with open_disk(storage) as disk:
        assert ids(disk) == ["a", "b", "c"]


@pytest.mark.spec("R-@L", "D-14")
def test_the_end_of_the_records_is_found_across_read_chunks(tmp_path: Path) -> None:
    path = tmp_path / "f"
    records = encode_add("a", None, b"a") + b"torn"
    for zeros in (0, 1, READ_CHUNK_BYTES - 1, READ_CHUNK_BYTES, 3 * READ_CHUNK_BYTES + 7):
        for head in (b"", records):
            path.write_bytes(head + bytes(zeros))
            env = OsEnv()
            fd = env.open(str(path), OpenFlag.READ)
            try:
                assert records_end(env, fd, env.fstat(fd).size) == len(head), (zeros, head)
            finally:
                env.close(fd)


@pytest.mark.spec("A-6")
def test_a_short_write_is_completed_by_writing_the_rest(storage: Path) -> None:
    env = FaultyEnv()
    with open_disk(storage, env) as disk:
        wal = str(only_wal(storage))
        env.inject("write", path=wal, short_bytes=5)
        disk.add_task(b"whole", task_id="whole")
        assert len(env.calls_of("write", wal)) == 2
    with open_disk(storage) as disk:
        assert disk.pending_tasks() == [PendingTask("whole", b"whole", None)]


@pytest.mark.spec("W-13", "W-12")
def test_a_failed_cut_after_a_failed_write_breaks_the_wal(storage: Path) -> None:
    env = FaultyEnv()
    disk = open_disk(storage, env, f=0)
    disk.add_task(b"a", task_id="a")
    wal = str(only_wal(storage))
    env.inject("write", path=wal, short_bytes=11)
    env.inject("write", path=wal, nth=2, error=errno.ENOSPC)
    env.inject("ftruncate", path=wal)
    with pytest.raises(StorageBrokenError) as info:
        disk.add_task(b"b", task_id="b")
    assert isinstance(info.value.__cause__, OSError)
    with pytest.raises(StorageBrokenError):
        disk.add_task(b"c", task_id="c")
    with pytest.raises(StorageBrokenError):
        disk.pending_tasks()
    disk.close()
    with open_disk(storage) as disk:  # the 11 stray bytes are a torn tail, left behind at adoption (W-3)
        assert ids(disk) == ["a"]


@pytest.mark.spec("W-14")
def test_a_forked_child_cannot_use_the_parents_disk(storage: Path) -> None:
    with open_disk(storage) as disk:
        disk.add_task(b"a", task_id="a")
        wal = only_wal(storage)
        before = snapshot(storage)
        child = os.fork()
        if child == 0:  # pragma: no cover - runs in the child; reported by exit code
            code = 0
            try:
                calls: tuple[Callable[[], object], ...] = (
                    lambda: disk.add_task(b"x"), lambda: disk.remove_task("a"),
                    disk.pending_tasks, disk.sync,
                    lambda: disk.add_dead_task("d", b"", ValueError(), task_class="T", attempts=1),
                    disk.list_dead_tasks, lambda: disk.find_dead_task("d"),
                    lambda: disk.remove_dead_tasks(["d"]))
                for number, call in enumerate(calls, start=1):
                    try:
                        call()
                    except RuntimeError:
                        continue
                    except BaseException:
                        code = 100 + number
                        break
                    code = number
                    break
            finally:
                os._exit(code)
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert snapshot(storage) == before
        assert wal.exists() and ids(disk) == ["a"]


# ----------------------------------------------------------------------------- lifecycle and API


@pytest.mark.spec("C-9", "C-33", "C-34")
def test_close_is_idempotent_releases_the_locks_and_later_calls_raise_storage_closed(
        storage: Path) -> None:
    disk = open_disk(storage)
    disk.add_task(b"a", task_id="a")
    wal = only_wal(storage)
    disk.close()
    disk.close()
    fd = os.open(wal, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the WAL lock was released
    finally:
        os.close(fd)
    try:
        raise ValueError("boom")
    except ValueError as exc:
        error = exc
    calls: list[Callable[[], object]] = [
        lambda: disk.add_task(b"x"), lambda: disk.remove_task("a"), disk.pending_tasks,
        disk.sync, lambda: disk.add_dead_task("a", b"", error, task_class="T", attempts=1),
        disk.list_dead_tasks, lambda: disk.find_dead_task("a"),
        lambda: disk.remove_dead_tasks(["a"]), lambda: disk.remove_dead_tasks(None)]
    for call in calls:
        with pytest.raises(StorageClosedError):
            call()


@pytest.mark.spec("C-11", "D-6")
def test_opening_creates_the_directory_with_parents_its_files_and_fsyncs_the_parent(
        tmp_path: Path) -> None:
    storage = tmp_path / "a" / "b" / "storage"
    env = RecordingEnv()
    with open_disk(storage, env):
        names = sorted(p.name for p in storage.iterdir())
        assert "deferred-dead_tasks-0" in names and "deferred-dead_tasks.lock" in names
        assert len(wal_files(storage)) == 1 and len(names) == 3
        made = env.index("makedirs", str(storage))
        env.index("fsync_dir", str(tmp_path / "a" / "b"), start=made)
        env.index("fsync_dir", str(storage), start=made)


@pytest.mark.spec("F-26")
def test_files_are_created_0600_and_the_directory_0700(storage: Path) -> None:
    old = os.umask(0)
    try:
        with open_disk(storage) as disk:
            try:
                raise ValueError("x")
            except ValueError as exc:
                disk.add_dead_task("a", b"", exc, task_class="T", attempts=1)
                disk.add_dead_task("b", b"", exc, task_class="T", attempts=1)
            assert disk.remove_dead_tasks("a") == 1  # the data file is now the renamed .tmp
    finally:
        os.umask(old)
    assert storage.stat().st_mode & 0o777 == 0o700
    for path in storage.iterdir():
        assert path.stat().st_mode & 0o777 == 0o600, path.name


@pytest.mark.slow
@pytest.mark.spec("F-8")
def test_a_context_over_the_limit_raises_limit_exceeded_and_writes_nothing(
        storage: Path) -> None:
    env = RecordingEnv()
    with open_disk(storage, env) as disk:
        before = snapshot(storage)
        env.clear()
        too_big = b"x" * (CONTEXT_BYTES_MAX + 1)
        with pytest.raises(LimitExceededError):
            disk.add_task(too_big)
        with pytest.raises(ValueError):
            disk.add_dead_task("a", too_big, ValueError("x"), task_class="T", attempts=1)
        assert env.calls == []
        assert snapshot(storage) == before
        disk.add_task(b"y" * CONTEXT_BYTES_MAX, task_id="max")  # the limit itself is fine
    with open_disk(storage) as disk:
        assert [len(t.context) for t in disk.pending_tasks()] == [CONTEXT_BYTES_MAX]


BAD_CALLS: dict[str, Callable[[Any], object]] = {
    "empty id": lambda d: d.add_task(b"x", task_id=""),
    "id with colon": lambda d: d.add_task(b"x", task_id="a:b"),
    "id with newline": lambda d: d.add_task(b"x", task_id="a\nb"),
    "id with NUL": lambda d: d.add_task(b"x", task_id="a\0b"),
    "id of 257 bytes": lambda d: d.add_task(b"x", task_id="é" * 128 + "x"),
    "id not str": lambda d: d.add_task(b"x", task_id=5),
    "id lone surrogate": lambda d: d.add_task(b"x", task_id="\ud800"),
    "context str": lambda d: d.add_task("text"),
    "context None": lambda d: d.add_task(None),
    "publish_at 0": lambda d: d.add_task(b"x", publish_at=0),
    "publish_at negative": lambda d: d.add_task(b"x", publish_at=-5),
    "publish_at bool": lambda d: d.add_task(b"x", publish_at=True),
    "publish_at float": lambda d: d.add_task(b"x", publish_at=1.5e9),
    "publish_at str": lambda d: d.add_task(b"x", publish_at="1"),
    "remove bad id": lambda d: d.remove_task("a:b"),
    "remove non-str id": lambda d: d.remove_task(None),
    "limit negative": lambda d: d.list_dead_tasks(limit=-1),
    "limit float": lambda d: d.list_dead_tasks(limit=1.0),
    "limit bool": lambda d: d.list_dead_tasks(limit=True),
    "offset negative": lambda d: d.list_dead_tasks(offset=-1),
    "offset None": lambda d: d.list_dead_tasks(offset=None),
    "find bad id": lambda d: d.find_dead_task(""),
    "remove dead bad id among good": lambda d: d.remove_dead_tasks(["dead", "a\nb"]),
    "remove dead non-str id": lambda d: d.remove_dead_tasks([b"dead"]),
    "dead bad id": lambda d: d.add_dead_task("a:b", b"", ValueError(), task_class="T", attempts=1),
    "dead context str": lambda d: d.add_dead_task("n", "c", ValueError(), task_class="T", attempts=1),
    "dead not an exception": lambda d: d.add_dead_task("n", b"", "oops", task_class="T", attempts=1),
    "dead exception class": lambda d: d.add_dead_task("n", b"", ValueError, task_class="T", attempts=1),
    "dead empty task_class": lambda d: d.add_dead_task("n", b"", ValueError(), task_class="", attempts=1),
    "dead task_class too long": lambda d: d.add_dead_task("n", b"", ValueError(), task_class="T" * 1025,
                                                          attempts=1),
    "dead negative attempts": lambda d: d.add_dead_task("n", b"", ValueError(), task_class="T", attempts=-1),
    "dead attempts bool": lambda d: d.add_dead_task("n", b"", ValueError(), task_class="T", attempts=True),
}


@pytest.mark.spec("C-7", "F-5")
@pytest.mark.parametrize("call", list(BAD_CALLS.values()), ids=list(BAD_CALLS))
def test_invalid_arguments_raise_value_error_before_any_io(
        storage: Path, call: Callable[[Any], object]) -> None:
    env = RecordingEnv()
    with open_disk(storage, env) as disk:
        disk.add_task(b"a", task_id="a")
        disk.add_dead_task("dead", b"", ValueError("x"), task_class="T", attempts=1)
        before = snapshot(storage)
        env.clear()
        with pytest.raises(ValueError):
            call(disk)
        assert env.calls == []
        assert snapshot(storage) == before
        assert ids(disk) == ["a"]


# ----------------------------------------------------------------------------- mapped writes


def mapping_env() -> FaultyEnv:
    """The real OS with mapping on, and a clock that never makes an fsync due by itself."""
    return FaultyEnv(ManualClock(wall=WALL), mapping=True)


@pytest.mark.spec("W-26", "W-25", "W-63")
def test_records_are_stored_into_the_mapped_space_and_a_write_after_them_seeks_to_their_end(
        storage: Path, caplog: pytest.LogCaptureFixture) -> None:
    env = mapping_env()
    with open_disk(storage, env, f=1) as disk:
        wal = str(only_wal(storage))
        env.clear()
        disk.add_task(b"a" * 10, task_id="a")
        disk.add_task(b"b" * 10, task_id="b")
        # One reservation, one map, then two stores (recorded as writes) and no seek.
        assert env.ops(wal) == ["allocate", "map", "write", "write"]
        stored = len(encode_add("a", None, b"a" * 10) + encode_add("b", None, b"b" * 10))
        # A record bigger than what is left must reserve again; that fails, so it is written
        # with write(), at the end of the records: the descriptor's offset never moved.
        env.inject("allocate", error=errno.ENOSPC, path=wal)
        env.clear()
        disk.add_task(b"c" * (WAL_RESERVE_BYTES + 10), task_id="c")
        assert env.ops(wal) == ["unmap", "allocate!", "seek", "write"]
        assert env.calls_of("seek", wal)[0].size == stored
        env.clear()
        disk.add_task(b"d", task_id="d")  # the offset is right now: no second seek
        assert "seek" not in env.ops(wal)
    with caplog.at_level(logging.WARNING, logger="deferq"), open_disk(storage) as disk:
        assert ids(disk) == ["a", "b", "c", "d"]
    assert corruption_warnings(caplog) == []


@pytest.mark.spec("W-26", "W-8", "W-48")
def test_a_wal_fsynced_after_every_record_writes_them_and_never_maps(storage: Path) -> None:
    env = FaultyEnv(mapping=True)
    with open_disk(storage, env, f=0) as disk:
        wal = str(only_wal(storage))
        env.clear()
        for n in range(3):
            disk.remove_task(disk.add_task(b"%d" % n))
        # With f = 0 every record is followed by an fsync, which write-protects a mapped page
        # again: the next store would pay a fault (and, from another thread, a TLB shootdown).
        assert env.ops(wal) == ["allocate"] + ["write", "fsync"] * 6


@pytest.mark.spec("W-26", "W-64")
def test_a_wal_that_cannot_map_writes_its_records_and_never_asks_again(storage: Path) -> None:
    env = mapping_env()
    env.inject("map", error=errno.ENOMEM)
    with open_disk(storage, env, f=1) as disk:
        wal = str(only_wal(storage))
        env.clear()
        disk.add_task(b"a", task_id="a")
        assert env.ops(wal) == ["allocate", "map!", "write"]
        env.clear()
        disk.add_task(b"b" * (WAL_RESERVE_BYTES + 10), task_id="b")  # reserves again
        disk.remove_task("a")
        # Each reserves (b fills its own reservation exactly), none maps (W-25, W-26).
        assert env.ops(wal) == ["allocate", "write", "allocate", "write"]
    with open_disk(storage) as disk:
        assert ids(disk) == ["b"]


@pytest.mark.spec("W-26", "W-13", "W-62")
def test_a_failed_write_after_stores_is_cut_back_without_a_window_over_the_cut(
        storage: Path) -> None:
    env = mapping_env()
    with open_disk(storage, env, f=1) as disk:
        wal = str(only_wal(storage))
        disk.add_task(b"a", task_id="a")
        env.inject("allocate", error=errno.ENOSPC, path=wal)
        env.inject("write", error=errno.EIO, path=wal)
        env.clear()
        with pytest.raises(OSError):
            disk.add_task(b"b" * (WAL_RESERVE_BYTES + 10), task_id="b")
        # The window was released before the reservation; the cut-back truncates to the
        # records' end (a live window over the cut would make a later store SIGBUS).
        assert env.ops(wal) == ["unmap", "allocate!", "seek", "write!", "ftruncate", "seek"]
        assert env.calls_of("ftruncate", wal)[0].size == len(encode_add("a", None, b"a"))
        disk.add_task(b"c", task_id="c")
    with open_disk(storage) as disk:
        assert ids(disk) == ["a", "c"]


@pytest.mark.spec("W-26", "W-65")
def test_where_fsync_is_not_known_to_cover_stores_the_wal_writes_its_records(
        storage: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import deferq._engine.osenv  # noqa: PLC0415 - the module whose capability is taken away

    monkeypatch.setattr(deferq._engine.osenv, "_MAP_FSYNC_COVERED", False)  # as on macOS
    env = RecordingEnv(ManualClock(wall=WALL))
    with open_disk(storage, env, f=1) as disk:
        wal = str(only_wal(storage))
        for name in ("a", "b", "c"):
            disk.add_task(name.encode(), task_id=name)
        assert env.ops(wal).count("map") == 1  # refused once, then never asked
        assert env.ops(wal).count("write") == 3 and "seek" not in env.ops(wal)
    with open_disk(storage) as disk:
        assert ids(disk) == ["a", "b", "c"]


@pytest.mark.spec("W-26")
def test_the_os_env_reports_a_window_past_the_end_of_the_file_as_an_oserror(
        tmp_path: Path) -> None:
    env = OsEnv()
    fd = env.open(str(tmp_path / "f"), OpenFlag.READ | OpenFlag.WRITE | OpenFlag.CREATE)
    try:
        env.write(fd, b"x" * 10)
        with pytest.raises(OSError) as caught:
            env.map_shared(fd, 0, env.map_granularity)  # Python's mmap says ValueError
        assert caught.value.errno == errno.EINVAL
        window = env.map_shared(fd, 0, 10)
        window[2:5] = b"abc"  # a store is in the file at once, the offset unmoved
        window.close()
        assert env.pread(fd, 10, 0) == b"xxabcxxxxx"
        env.write(fd, b"!")
        assert env.pread(fd, 11, 0) == b"xxabcxxxxx!"
    finally:
        env.close(fd)


@pytest.mark.spec("W-26", "W-65")
def test_a_file_on_a_filesystem_not_known_to_allocate_in_place_is_never_mapped(
        storage: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import deferq._engine.osenv  # noqa: PLC0415 - the module whose capability is taken away

    monkeypatch.setattr(deferq._engine.osenv, "fs_type", lambda fd: "btrfs")  # copy-on-write
    env = RecordingEnv(ManualClock(wall=WALL))
    with open_disk(storage, env, f=1) as disk:
        wal = str(only_wal(storage))
        disk.add_task(b"a", task_id="a")
        disk.add_task(b"b" * (WAL_RESERVE_BYTES + 10), task_id="b")  # reserves again
        assert env.ops(wal).count("map") == 1  # refused once (ENOTSUP), then never asked
        assert env.ops(wal).count("write") == 2
    with open_disk(storage) as disk:
        assert ids(disk) == ["a", "b"]


@pytest.mark.spec("W-26", "W-65")
def test_the_filesystem_type_of_a_descriptor_matches_the_mount_its_path_is_on(
        tmp_path: Path) -> None:
    from deferq._engine.osenv import fs_type  # noqa: PLC0415

    if not Path("/proc/self/mountinfo").exists():
        pytest.skip("no /proc/self/mountinfo: not Linux, fs_type answers None")
    real = os.path.realpath(tmp_path)
    best, kind = "", None  # the longest mount point that is a prefix of the path
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        point = fields[4].replace("\\040", " ")
        if (real == point or real.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
            best, kind = point, fields[fields.index("-") + 1]
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        assert fs_type(fd) == kind is not None
    finally:
        os.close(fd)
    assert fs_type(1_000_000) is None  # no such descriptor


@pytest.mark.spec("C-35")
def test_a_disk_is_a_context_manager_whose_exit_closes_it(storage: Path) -> None:
    with open_disk(storage) as disk:
        task_id = disk.add_task(b"x")
    with pytest.raises(StorageClosedError):
        disk.pending_tasks()
    fd = os.open(only_wal(storage), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # its WAL lock was released at exit
    finally:
        os.close(fd)
    with open_disk(storage) as again:
        assert [t.task_id for t in again.pending_tasks()] == [task_id]
