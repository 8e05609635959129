"""The shared dead-task store of ``Disk`` on the real filesystem (spec/dead-tasks.md, S-*, L-*).

Goal: each statement about the dead-task store holds on a real directory. That
covers which files exist and when, the order of fsync, rename and directory
fsync, what add/list/find/remove read and write, how damage is handled, how the
lock is taken and released, and how exceptions are recorded (F-17). Method:
``Disk`` in ``tmp_path`` with the envs of ``tests.fsenv``: ``RecordingEnv``
for call orders and byte counts, ``FaultyEnv`` for I/O errors, ``ManualClock``
so lock retries sleep on a fake clock. "Another worker" holds the lock through
a second open file description of the lock file (A-8). Store files are
sometimes written by hand with the codec, to place damage exactly.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from deferq._engine.env import Env, OpenFlag
from deferq._core.deadcodec import DeadLine, decode_dead_line, encode_dead
from deferq._core.errors import DeadTasksLockTimeout, StorageBrokenError
from deferq._core.frame import frame
from deferq._core.limits import (
    EXCEPTION_CLASS_CHARS_MAX,
    EXCEPTION_MESSAGE_CHARS_MAX,
    LOCK_ATTEMPTS_MAX,
    READ_CHUNK_BYTES,
)
from deferq._core.taskid import id_seed
from deferq._core.types import DeadTask
from deferq.backends import Disk
from tests.fsenv import FaultyEnv, ManualClock, RecordingEnv, snapshot

PREFIX = "deferred-"
DATA = "deferred-dead_tasks-0"
LOCK = "deferred-dead_tasks.lock"
TMP = "deferred-dead_tasks-0.tmp"
SLEEPS = [0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.09] + [0.1] * 10


def open_disk(storage: Path, env: Env | None = None) -> Disk:
    return Disk(path=storage, prefix=PREFIX, fsync_frequency=0, env=env)


def caught(message: str = "boom") -> BaseException:
    """An exception with a traceback, as a task runner would hand over."""
    try:
        raise ValueError(message)
    except ValueError as exc:
        return exc


def add(disk: Disk, task_id: str, context: bytes = b"ctx", attempts: int = 1) -> str:
    return disk.add_dead_task(task_id, context, caught(), task_class="app.Task",
                              attempts=attempts)


def line(task_id: str, context: bytes = b"") -> bytes:
    """A valid dead-task line, as ``add_dead_task`` would write it."""
    return encode_dead(DeadTask(
        id=task_id, task_class="app.Task", attempts=1, enqueued_at=id_seed(task_id),
        failed_at=1_700_000_000, exception_class="ValueError", exception_message="boom",
        backtrace=("x.py:1:in f",), context=context))


def bad_crc(task_id: str) -> bytes:
    good = line(task_id)
    return (b"0" if good[:1] != b"0" else b"1") + good[1:]


def listed(disk: Disk, **kwargs: Any) -> list[str]:
    return [t.id for t in disk.list_dead_tasks(**kwargs)]


def messages(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level]


@contextmanager
def lock_held_elsewhere(storage: Path) -> Iterator[int]:
    """Hold the store's flock through another open file description, as another worker would."""
    fd = os.open(storage / LOCK, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield fd
    finally:
        os.close(fd)


def lock_is_free(storage: Path) -> bool:
    fd = os.open(storage / LOCK, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


# ----------------------------------------------------------------------------- S-1, S-2, S-3


@pytest.mark.spec("S-1", "D-6")
def test_opening_creates_the_data_file_without_truncating_it_and_fsyncs_the_directory(
        storage: Path) -> None:
    storage.mkdir()
    existing = line("a") + line("b")
    (storage / DATA).write_bytes(existing)
    env = RecordingEnv()
    with open_disk(storage, env) as disk:
        opened = env.index("open", str(storage / DATA))
        flags = env.calls[opened].flags
        assert flags is not None and OpenFlag.CREATE in flags and OpenFlag.TRUNCATE not in flags
        env.index("fsync_dir", str(storage), start=opened)
        assert (storage / DATA).read_bytes() == existing
        assert listed(disk) == ["b", "a"]
        assert (storage / LOCK).exists()


@pytest.mark.spec("S-1", "D-6")
def test_a_data_file_deleted_by_hand_reads_as_empty_and_the_next_add_recreates_it_durably(
        storage: Path) -> None:
    env = RecordingEnv()
    with open_disk(storage, env) as disk:
        add(disk, "a")
        (storage / DATA).unlink()
        assert disk.list_dead_tasks() == []
        assert disk.find_dead_task("a") is None
        assert disk.remove_dead_tasks(["a"]) == 0
        assert not (storage / DATA).exists() and not (storage / TMP).exists()
        env.clear()
        add(disk, "b")
        data = str(storage / DATA)
        created = next(i for i, c in enumerate(env.calls) if c.op == "open" and c.path == data
                       and c.flags is not None and OpenFlag.CREATE in c.flags)
        synced = env.index("fsync", data, start=created)
        env.index("fsync_dir", str(storage), start=synced)
        assert listed(disk) == ["b"]


@pytest.mark.spec("S-2")
def test_the_lock_file_is_never_renamed_or_unlinked_and_holds_no_data(storage: Path) -> None:
    env = RecordingEnv()
    with open_disk(storage, env) as disk:
        inode = (storage / LOCK).stat().st_ino
        for task_id in ("a", "b", "c"):
            add(disk, task_id)
        assert disk.remove_dead_tasks(["a", "b"]) == 2
        assert disk.remove_dead_tasks(["missing"]) == 0
        assert (storage / LOCK).stat().st_ino == inode
        lock = str(storage / LOCK)
        assert [c.op for c in env.calls if lock in (c.path, c.dst)
                and c.op in ("rename", "unlink", "write")] == []
        # Its only changes are the compaction mark's (S-9): set and cleared per compaction.
        assert len(env.calls_of("ftruncate", lock)) == 2
        assert len(env.calls_of("open", lock)) == 1  # opened once, at open, and kept
        assert (storage / LOCK).stat().st_size == 0


OPERATIONS: dict[str, Callable[[Disk], object]] = {
    "add": lambda d: add(d, "new"),
    "list": lambda d: d.list_dead_tasks(),
    "find": lambda d: d.find_dead_task("a"),
    "remove found": lambda d: d.remove_dead_tasks(["a"]),
    "remove not found": lambda d: d.remove_dead_tasks(["missing"]),
}


@pytest.mark.spec("S-3", "L-4")
@pytest.mark.parametrize("operation", list(OPERATIONS.values()), ids=list(OPERATIONS))
def test_each_operation_opens_the_data_file_under_the_lock_and_closes_it_before_unlocking(
        storage: Path, operation: Callable[[Disk], object]) -> None:
    env = RecordingEnv()
    with open_disk(storage, env) as disk:
        add(disk, "a")
        add(disk, "b")
        env.clear()
        operation(disk)
        lock, data, tmp = (str(storage / n) for n in (LOCK, DATA, TMP))
        locked = env.index("flock", lock)
        unlocked = env.last_index("unlock", lock)
        touching = [i for i, c in enumerate(env.calls) if c.path in (data, tmp) or c.dst == data]
        assert env.calls_of("open", data)
        assert touching and all(locked < i < unlocked for i in touching)
        assert len(env.calls_of("open", data)) == len(env.calls_of("close", data))
        assert len(env.calls_of("open", tmp)) == len(env.calls_of("close", tmp))
        assert lock_is_free(storage)


# ----------------------------------------------------------------------------- S-4 add


TAILS = {
    "text": b"abc",
    "zero fill": b"\0" * 3000,
    "partial record": line("torn")[:-20],
    "longer than a scan chunk": b"x" * 20_000,
}


@pytest.mark.spec("S-4", "R-@F", "D-7")
@pytest.mark.parametrize("tail", list(TAILS.values()), ids=list(TAILS))
def test_add_cuts_a_torn_tail_to_the_last_newline_appends_and_fsyncs_before_returning(
        storage: Path, tail: bytes) -> None:
    env = RecordingEnv()
    with open_disk(storage, env) as disk:
        add(disk, "a")
        good = (storage / DATA).read_bytes()
        with (storage / DATA).open("ab") as handle:
            handle.write(tail)
        env.clear()
        add(disk, "b")
        data = str(storage / DATA)
        cut = env.index("ftruncate", data)
        assert env.calls[cut].size == len(good)
        written = env.index("write", data, start=cut)
        synced = env.index("fsync", data, start=written)
        closed = env.index("close", data, start=synced)
        assert closed < env.last_index("unlock", str(storage / LOCK))
        content = (storage / DATA).read_bytes()
        assert content.startswith(good)
        new = content[len(good):]
        assert new.endswith(b"\n") and new.count(b"\n") == 1
        framed = decode_dead_line(new[:-1])
        assert isinstance(framed, DeadLine) and framed.task_id == "b"
        assert listed(disk) == ["b", "a"]


@pytest.mark.spec("S-4", "R-@F")
@pytest.mark.parametrize("garbage", [b"garbage", b"\0" * 9000, b"y" * 70_000],
                         ids=["short", "zero fill", "many chunks"])
def test_add_truncates_a_file_without_a_complete_line_to_zero(
        storage: Path, garbage: bytes) -> None:
    storage.mkdir()
    (storage / DATA).write_bytes(garbage)
    with open_disk(storage) as disk:
        add(disk, "a")
        content = (storage / DATA).read_bytes()
        assert content.count(b"\n") == 1 and content.endswith(b"\n")
        assert isinstance(decode_dead_line(content[:-1]), DeadLine)
        assert listed(disk) == ["a"]


@pytest.mark.spec("S-4", "R-@C")
def test_add_leaves_a_complete_line_with_a_bad_crc_in_place(storage: Path) -> None:
    storage.mkdir()
    before = line("a") + bad_crc("b")
    (storage / DATA).write_bytes(before)
    with open_disk(storage) as disk:
        add(disk, "c")
        assert (storage / DATA).read_bytes().startswith(before)
        assert listed(disk) == ["c", "a"]


# ----------------------------------------------------------------------------- S-5 remove


@pytest.mark.spec("S-5", "C-8")
@pytest.mark.parametrize("nothing", [None, [], (), set(), iter([])],
                         ids=["None", "list", "tuple", "set", "iterator"])
def test_remove_of_no_ids_returns_zero_without_any_call_to_the_env(
        storage: Path, nothing: Iterable[str] | None) -> None:
    env = RecordingEnv()
    with open_disk(storage, env) as disk:
        add(disk, "a")
        env.clear()
        assert disk.remove_dead_tasks(nothing) == 0
        assert env.calls == []


@pytest.mark.spec("S-5", "C-8")
def test_remove_takes_a_single_str_as_one_id(storage: Path) -> None:
    with open_disk(storage) as disk:
        add(disk, "ab")
        add(disk, "a")
        add(disk, "b")
        assert disk.remove_dead_tasks("ab") == 1  # one id, not the ids "a" and "b"
        assert listed(disk) == ["b", "a"]


@pytest.mark.spec("S-5", "S-42", "C-8", "R-@H")
def test_remove_counts_each_distinct_id_found_once(storage: Path) -> None:
    with open_disk(storage) as disk:
        add(disk, "a")
        add(disk, "b")
        add(disk, "a", attempts=2)  # written twice
        assert disk.remove_dead_tasks(["a", "a", "b", "missing"]) == 2
        assert disk.list_dead_tasks() == []
        assert (storage / DATA).read_bytes() == b""


@pytest.mark.spec("S-41")
def test_remove_that_finds_nothing_keeps_the_data_file_byte_identical_and_fsyncs_nothing(
        storage: Path) -> None:
    storage.mkdir()
    before = line("a") + bad_crc("b") + b"garbage\n" + line("c") + b"torn"
    (storage / DATA).write_bytes(before)
    env = RecordingEnv()
    with open_disk(storage, env) as disk:
        env.clear()
        assert disk.remove_dead_tasks(["missing", "b"]) == 0  # "b" is only a damaged line
        assert (storage / DATA).read_bytes() == before
        assert not (storage / TMP).exists()
        assert env.calls_of("unlink", str(storage / TMP))
        assert [c.op for c in env.calls if c.op in ("fsync", "fsync_dir", "rename")] == []


@pytest.mark.spec("S-39", "S-38", "D-9")
def test_remove_that_finds_an_id_fsyncs_the_tmp_renames_it_then_fsyncs_the_directory(
        storage: Path) -> None:
    env = RecordingEnv()
    with open_disk(storage, env) as disk:
        for task_id in ("a", "b", "c"):
            add(disk, task_id)
        kept = [rec for rec in (storage / DATA).read_bytes().splitlines(keepends=True)
                if b":dead_task:b:" not in rec]
        env.clear()
        assert disk.remove_dead_tasks(["b"]) == 1
        tmp, data = str(storage / TMP), str(storage / DATA)
        created = env.index("open", tmp)
        flags = env.calls[created].flags
        assert flags is not None and OpenFlag.TRUNCATE in flags and OpenFlag.CREATE in flags
        synced = env.index("fsync", tmp, start=created)
        closed = env.index("close", tmp, start=synced)
        renamed = env.index("rename", tmp, start=closed)
        assert env.calls[renamed].dst == data
        dir_synced = env.index("fsync_dir", str(storage), start=renamed)
        assert dir_synced < env.last_index("unlock", str(storage / LOCK))
        assert (storage / DATA).read_bytes() == b"".join(kept)
        assert listed(disk) == ["c", "a"]


@pytest.mark.spec("S-38", "R-@B", "R-@C", "R-@E", "R-@F")
def test_compaction_drops_damaged_lines_and_keeps_every_other_valid_record(
        storage: Path) -> None:
    storage.mkdir()
    junk = bad_crc("x") + b"not a record\n" + b"z" * (8 * 1024 * 1024 + 1) + b"\n"
    (storage / DATA).write_bytes(line("a") + junk + line("b") + line("c") + b"torn tail")
    with open_disk(storage) as disk:
        assert disk.remove_dead_tasks(["a"]) == 1
        assert (storage / DATA).read_bytes() == line("b") + line("c")


@pytest.mark.spec("S-44")
def test_a_compaction_that_drops_damaged_lines_says_how_many_in_one_warning(
        storage: Path, caplog: pytest.LogCaptureFixture) -> None:
    storage.mkdir()
    (storage / DATA).write_bytes(line("a") + bad_crc("x") + b"junk\n" + line("b") + b"torn")
    with open_disk(storage) as disk, caplog.at_level(logging.WARNING, logger="deferq"):
        assert disk.remove_dead_tasks(["missing"]) == 0  # nothing replaced, nothing dropped
        assert messages(caplog, logging.WARNING) == []
        assert disk.remove_dead_tasks(["a"]) == 1
        warnings = messages(caplog, logging.WARNING)
        assert len(warnings) == 1 and "dropped 3 corrupted" in warnings[0]


@pytest.mark.spec("S-38", "R-@G")
def test_compaction_keeps_records_whose_json_does_not_decode_unless_removed(
        storage: Path) -> None:
    storage.mkdir()
    undecodable = frame(b"dead_task:odd:{not json")
    (storage / DATA).write_bytes(line("a") + undecodable + line("b"))
    with open_disk(storage) as disk:
        assert disk.remove_dead_tasks(["a"]) == 1
        assert (storage / DATA).read_bytes() == undecodable + line("b")
        assert disk.remove_dead_tasks(["odd"]) == 1
        assert (storage / DATA).read_bytes() == line("b")


@pytest.mark.spec("S-38", "S-41")
def test_a_stale_tmp_left_by_a_crash_is_truncated_not_appended_to(storage: Path) -> None:
    storage.mkdir()
    (storage / DATA).write_bytes(line("a") + line("b"))
    (storage / TMP).write_bytes(line("ghost") + b"half a rec")
    with open_disk(storage) as disk:
        assert disk.remove_dead_tasks(["a"]) == 1
        assert (storage / DATA).read_bytes() == line("b")
        assert not (storage / TMP).exists()
        (storage / TMP).write_bytes(line("ghost"))
        assert disk.remove_dead_tasks(["missing"]) == 0
        assert not (storage / TMP).exists()
        assert listed(disk) == ["b"]


# ----------------------------------------------------------------------------- S-6, S-7 reads


@pytest.mark.spec("S-6")
def test_list_returns_newest_first_applying_offset_then_limit(storage: Path) -> None:
    with open_disk(storage) as disk:
        for number in range(10):
            add(disk, f"t{number}")
        newest = [f"t{number}" for number in range(9, -1, -1)]
        assert listed(disk) == newest
        assert listed(disk, limit=3) == newest[:3]
        assert listed(disk, offset=2, limit=3) == newest[2:5]
        assert listed(disk, offset=8, limit=5) == newest[8:]
        assert listed(disk, offset=7) == newest[7:]
        assert listed(disk, offset=10) == []
        assert listed(disk, offset=50, limit=1) == []


@pytest.mark.spec("S-6", "R-@H")
def test_an_id_written_twice_is_listed_once_at_its_latest_position(storage: Path) -> None:
    with open_disk(storage) as disk:
        add(disk, "a", context=b"first")
        add(disk, "b")
        add(disk, "c")
        add(disk, "a", context=b"second", attempts=2)
        assert listed(disk) == ["a", "c", "b"]
        assert listed(disk, offset=1) == ["c", "b"]
        found = disk.find_dead_task("a")
        assert found is not None and found.context == b"second" and found.attempts == 2


@pytest.mark.spec("S-6", "S-37")
def test_limit_zero_returns_nothing_without_reading(storage: Path) -> None:
    env = RecordingEnv()
    with open_disk(storage, env) as disk:
        add(disk, "a")
        env.clear()
        assert disk.list_dead_tasks(limit=0) == []
        assert disk.list_dead_tasks(limit=0, offset=5) == []
        assert env.calls == []


@pytest.mark.slow
@pytest.mark.spec("S-6", "S-36", "D-14")
def test_reading_the_newest_records_of_a_large_store_reads_only_its_end(storage: Path) -> None:
    storage.mkdir()
    count = 20_000
    body = line("@@", b"c" * 100)[9:-1]  # reframed with each id: much faster than encoding
    (storage / DATA).write_bytes(b"".join(
        frame(body.replace(b"@@", b"task-%d" % n)) for n in range(count)))
    size = (storage / DATA).stat().st_size
    env = RecordingEnv()
    data = str(storage / DATA)
    with open_disk(storage, env) as disk:
        env.clear()
        page = listed(disk, limit=50)
        assert page == [f"task-{n}" for n in range(count - 1, count - 51, -1)]
        assert env.bytes_read(data) <= 2 * READ_CHUNK_BYTES < size // 20
        env.clear()
        found = disk.find_dead_task(f"task-{count - 200}")
        assert found is not None and found.context == b"c" * 100
        assert env.bytes_read(data) <= 2 * READ_CHUNK_BYTES
        assert all((c.size or 0) <= READ_CHUNK_BYTES for c in env.calls_of("pread", data))
        env.clear()
        assert listed(disk, offset=100, limit=50) == [
            f"task-{n}" for n in range(count - 101, count - 151, -1)]
        assert env.bytes_read(data) < size // 20
        env.clear()
        assert disk.find_dead_task("absent") is None  # a miss reads it all, chunk by chunk
        assert env.bytes_read(data) == size


@pytest.mark.spec("S-7", "R-@B", "R-@C", "R-@F")
def test_damaged_lines_met_by_a_read_are_counted_in_one_warning(
        storage: Path, caplog: pytest.LogCaptureFixture) -> None:
    storage.mkdir()
    (storage / DATA).write_bytes(
        line("a") + bad_crc("x") + b"garbage\n" + b"\n" + line("b") + b"torn")
    with open_disk(storage) as disk, caplog.at_level(logging.WARNING, logger="deferq"):
        assert listed(disk) == ["b", "a"]
        warnings = messages(caplog, logging.WARNING)
        assert len(warnings) == 1 and "Detected 4 corrupted" in warnings[0]
        caplog.clear()
        assert disk.find_dead_task("b") is not None  # the torn tail is another id's: skipped
        assert messages(caplog, logging.WARNING) == []
        assert disk.find_dead_task("x") is None  # the damaged "x" line is x's: counted
        warnings = messages(caplog, logging.WARNING)
        assert len(warnings) == 1 and "Detected 1 corrupted" in warnings[0]
        caplog.clear()
        add(disk, "c")
        assert messages(caplog, logging.WARNING) == []  # add does not read lines
        assert listed(disk, limit=1) == ["c"]
        assert messages(caplog, logging.WARNING) == []  # nothing damaged was met


@pytest.mark.spec("S-43", "R-@G")
def test_a_record_whose_json_does_not_decode_is_logged_as_an_error_and_skipped(
        storage: Path, caplog: pytest.LogCaptureFixture) -> None:
    storage.mkdir()
    good_b = line("b")
    wrong_keys = frame(b'dead_task:keys:{"id":"keys"}')
    other_id = frame(good_b[9:-1].replace(b"dead_task:b:", b"dead_task:other:"))
    (storage / DATA).write_bytes(line("a") + frame(b"dead_task:bad:{not json") + wrong_keys
                                 + other_id + good_b)
    with open_disk(storage) as disk, caplog.at_level(logging.WARNING, logger="deferq"):
        assert listed(disk) == ["b", "a"]
        errors = messages(caplog, logging.ERROR)
        for task_id in ("bad", "keys", "other"):
            assert any(f"dead-lettered task with id {task_id}" in m for m in errors), task_id
        for task_id in ("bad", "keys", "other"):
            assert disk.find_dead_task(task_id) is None


@pytest.mark.spec("R-@G", "R-@H")
def test_a_latest_record_whose_json_does_not_decode_hides_the_older_valid_one(
        storage: Path, caplog: pytest.LogCaptureFixture) -> None:
    storage.mkdir()
    (storage / DATA).write_bytes(line("a") + line("b") + frame(b"dead_task:a:{not json"))
    with open_disk(storage) as disk, caplog.at_level(logging.ERROR, logger="deferq"):
        assert listed(disk) == ["b"]
        assert disk.find_dead_task("a") is None
        assert len(messages(caplog, logging.ERROR)) == 2  # once per read that met it


# ----------------------------------------------------------------------------- L-1..L-4 locking


LOCKED_OPERATIONS: dict[str, tuple[Callable[[Disk], object], str]] = {
    "add": (lambda d: add(d, "new"), "add a task to"),
    "list": (lambda d: d.list_dead_tasks(), "read tasks from"),
    "find": (lambda d: d.find_dead_task("a"), "read tasks from"),
    "remove": (lambda d: d.remove_dead_tasks(["a"]), "delete tasks from"),
}


@pytest.mark.spec("L-1", "L-2", "L-3", "D-8")
@pytest.mark.parametrize("operation,verb", list(LOCKED_OPERATIONS.values()),
                         ids=list(LOCKED_OPERATIONS))
def test_an_operation_gives_up_after_20_attempts_with_the_exact_message_and_changes_nothing(
        storage: Path, operation: Callable[[Disk], object], verb: str) -> None:
    clock = ManualClock()
    env = RecordingEnv(clock)
    with open_disk(storage, env) as disk:
        add(disk, "a")
        before = snapshot(storage)
        env.clear()
        with lock_held_elsewhere(storage):
            with pytest.raises(DeadTasksLockTimeout) as info:
                operation(disk)
        assert str(info.value) == f"Could not lock the dead tasks store to {verb} it"
        assert clock.sleeps == pytest.approx(SLEEPS)
        assert len(env.calls_of("flock")) == LOCK_ATTEMPTS_MAX
        assert snapshot(storage) == before
        assert not env.calls_of("open")  # the data file was never opened
        operation(disk)  # and with the lock free it works at once
        assert len(clock.sleeps) == len(SLEEPS)


@pytest.mark.spec("L-1", "L-2")
def test_an_operation_takes_the_lock_as_soon_as_the_other_holder_releases_it(
        storage: Path) -> None:
    clock = ManualClock()
    with open_disk(storage, RecordingEnv(clock)) as disk:
        with lock_held_elsewhere(storage) as fd:
            def release_after_three(_: float) -> None:
                if len(clock.sleeps) == 3:
                    fcntl.flock(fd, fcntl.LOCK_UN)
            clock.on_sleep = release_after_three
            add(disk, "a")
        assert clock.sleeps == pytest.approx([0.01, 0.02, 0.03])
        assert listed(disk) == ["a"]


class HookEnv(RecordingEnv):
    """Calls ``hook`` once, just before the first fsync of ``path``."""

    def __init__(self, clock: ManualClock, path: Path) -> None:
        super().__init__(clock)
        self.path = str(path)
        self.hook: Callable[[], None] | None = None

    def fsync(self, fd: int) -> None:
        hook = self.hook
        if hook is not None and self.path_of(fd) == self.path:
            self.hook = None
            hook()
        super().fsync(fd)


@pytest.mark.spec("L-1", "D-11")
def test_threads_sharing_one_disk_exclude_each_other(storage: Path) -> None:
    clock = ManualClock()
    env = HookEnv(clock, storage / DATA)
    outcome: list[object] = []
    with open_disk(storage, env) as disk:
        def other_thread() -> None:
            try:
                outcome.append(disk.list_dead_tasks())
            except BaseException as exc:  # noqa: BLE001 - reported to the main thread
                outcome.append(exc)

        def while_adding() -> None:  # runs inside add, which holds both locks
            thread = threading.Thread(target=other_thread)
            thread.start()
            thread.join(timeout=30)
            assert not thread.is_alive(), "a lock call blocked"

        env.hook = while_adding
        add(disk, "a")
        assert len(outcome) == 1 and isinstance(outcome[0], DeadTasksLockTimeout)
        assert clock.sleeps == pytest.approx(SLEEPS)  # it retried; flock on the shared fd alone would not
        assert listed(disk) == ["a"]


FAILURES: dict[str, tuple[str, str, Callable[[Disk], object]]] = {
    "add write EIO": ("write", DATA, lambda d: add(d, "new")),
    "list pread EIO": ("pread", DATA, lambda d: d.list_dead_tasks()),
    "find pread EIO": ("pread", DATA, lambda d: d.find_dead_task("a")),
    "remove write EIO": ("write", TMP, lambda d: d.remove_dead_tasks(["a"])),
    "remove rename EIO": ("rename", TMP, lambda d: d.remove_dead_tasks(["a"])),
}


@pytest.mark.spec("L-4", "D-8")
@pytest.mark.parametrize("op,name,operation", list(FAILURES.values()), ids=list(FAILURES))
def test_both_locks_are_released_after_an_operation_that_raised(
        storage: Path, op: str, name: str, operation: Callable[[Disk], object]) -> None:
    clock = ManualClock()
    env = FaultyEnv(clock)
    with open_disk(storage, env) as disk:
        add(disk, "a")
        add(disk, "b")
        env.inject(op, path=str(storage / name))
        with pytest.raises(OSError) as info:
            operation(disk)
        assert info.value.errno == errno.EIO
        assert lock_is_free(storage)  # the flock
        assert set(listed(disk)) <= {"a", "b", "new"}  # the process-local lock: no retry needed
        assert clock.sleeps == []


# ----------------------------------------------------------------------------- S-8 failures


DEAD_CALLS: dict[str, Callable[[Disk], object]] = {
    "add": lambda d: add(d, "later"),
    "list": lambda d: d.list_dead_tasks(),
    "find": lambda d: d.find_dead_task("a"),
    "remove": lambda d: d.remove_dead_tasks(["a"]),
}


def assert_broken_for_good(disk: Disk) -> None:
    for call in DEAD_CALLS.values():
        with pytest.raises(StorageBrokenError):
            call(disk)


@pytest.mark.spec("S-8", "D-8", "D-10")
@pytest.mark.parametrize("faults", [[(1, None)], [(1, 9), (2, None)], [(1, 0)]],
                         ids=["EIO", "short write then EIO", "write returns 0"])
def test_a_failed_dead_task_write_is_cut_back_and_the_store_stays_usable(
        storage: Path, faults: list[tuple[int, int | None]],
        caplog: pytest.LogCaptureFixture) -> None:
    env = FaultyEnv()
    with open_disk(storage, env) as disk:
        add(disk, "a")
        good = (storage / DATA).read_bytes()
        with (storage / DATA).open("ab") as handle:
            handle.write(b"torn")  # cut by the tail repair, before the failed write
        for nth, short_bytes in faults:
            env.inject("write", path=str(storage / DATA), nth=nth, short_bytes=short_bytes)
        with pytest.raises(OSError):
            add(disk, "b")
        assert (storage / DATA).read_bytes() == good
        add(disk, "c")
        with caplog.at_level(logging.WARNING, logger="deferq"):
            assert listed(disk) == ["c", "a"]
        assert messages(caplog, logging.WARNING) == []


@pytest.mark.spec("S-8", "A-7", "D-10")
def test_a_failed_dead_task_fsync_is_cut_back_and_breaks_the_store_for_good(
        storage: Path) -> None:
    env = FaultyEnv()
    with open_disk(storage, env) as disk:
        add(disk, "a")
        good = (storage / DATA).read_bytes()
        env.inject("fsync", path=str(storage / DATA))
        with pytest.raises(StorageBrokenError) as info:
            add(disk, "b")
        assert isinstance(info.value.__cause__, OSError)
        assert (storage / DATA).read_bytes() == good
        env.clear()
        assert_broken_for_good(disk)
        assert env.calls_of("fsync") == [] and env.calls_of("open") == []
        disk.add_task(b"still", task_id="still")  # the WAL has its own files
    with open_disk(storage) as disk:
        assert listed(disk) == ["a"]


@pytest.mark.spec("S-8")
def test_a_failed_cut_after_a_failed_dead_task_write_breaks_the_store(storage: Path) -> None:
    env = FaultyEnv()
    with open_disk(storage, env) as disk:
        add(disk, "a")
        data = str(storage / DATA)
        env.inject("write", path=data, short_bytes=9)
        env.inject("write", path=data, nth=2)
        env.inject("ftruncate", path=data)
        with pytest.raises(StorageBrokenError):
            add(disk, "b")
        assert_broken_for_good(disk)
    with open_disk(storage) as disk:  # the 9 stray bytes are a torn tail: skipped, then cut
        assert listed(disk) == ["a"]
        add(disk, "c")
        assert listed(disk) == ["c", "a"]


@pytest.mark.spec("S-8", "D-6", "D-9")
def test_a_failed_directory_fsync_after_a_compaction_rename_breaks_the_store(
        storage: Path) -> None:
    env = FaultyEnv()
    with open_disk(storage, env) as disk:
        add(disk, "a")
        add(disk, "b")
        env.inject("fsync_dir", path=str(storage))
        with pytest.raises(StorageBrokenError):
            disk.remove_dead_tasks(["a"])
        assert_broken_for_good(disk)
    with open_disk(storage) as disk:
        assert listed(disk) == ["b"]  # the rename itself happened


@pytest.mark.spec("S-8", "S-1", "D-6")
def test_a_failed_directory_fsync_after_recreating_the_data_file_breaks_the_store(
        storage: Path) -> None:
    env = FaultyEnv()
    with open_disk(storage, env) as disk:
        (storage / DATA).unlink()
        env.inject("fsync_dir", path=str(storage))
        with pytest.raises(StorageBrokenError):
            add(disk, "a")
        assert_broken_for_good(disk)


@pytest.mark.spec("S-8", "S-5")
def test_a_failed_fsync_of_the_staging_file_leaves_the_live_file_and_the_store_usable(
        storage: Path) -> None:
    env = FaultyEnv()
    with open_disk(storage, env) as disk:
        add(disk, "a")
        add(disk, "b")
        before = (storage / DATA).read_bytes()
        env.inject("fsync", path=str(storage / TMP))
        with pytest.raises(OSError) as info:
            disk.remove_dead_tasks(["a"])
        assert not isinstance(info.value, StorageBrokenError)
        assert (storage / DATA).read_bytes() == before
        assert not env.calls_of("rename")
        assert disk.remove_dead_tasks(["a"]) == 1
        assert listed(disk) == ["b"]


# ----------------------------------------------------------------------------- F-17 fields


class Outer:
    class CustomError(Exception):
        pass


def recurse(depth: int) -> None:
    if depth == 0:
        raise Outer.CustomError("deep")
    recurse(depth - 1)


@pytest.mark.spec("F-17", "F-48", "F-50")
def test_a_long_exception_message_is_clipped_with_a_truncation_marker(storage: Path) -> None:
    with open_disk(storage) as disk:
        disk.add_dead_task("long", b"", caught("m" * 100_000), task_class="T", attempts=1)
        disk.add_dead_task("fits", b"", caught("m" * EXCEPTION_MESSAGE_CHARS_MAX),
                           task_class="T", attempts=1)
        long, fits = disk.find_dead_task("long"), disk.find_dead_task("fits")
    assert long is not None and fits is not None
    assert len(long.exception_message) == EXCEPTION_MESSAGE_CHARS_MAX
    assert long.exception_message.endswith("...[truncated]")
    assert long.exception_message.startswith("m" * 1000)
    assert fits.exception_message == "m" * EXCEPTION_MESSAGE_CHARS_MAX


@pytest.mark.spec("F-17", "F-49")
def test_the_backtrace_keeps_the_20_frames_nearest_the_raise_outermost_first(
        storage: Path) -> None:
    try:
        recurse(30)
    except Outer.CustomError as exc:
        deep = exc
    try:
        recurse(1)
    except Outer.CustomError as exc:
        shallow = exc
    with open_disk(storage) as disk:
        disk.add_dead_task("deep", b"", deep, task_class="T", attempts=1)
        disk.add_dead_task("shallow", b"", shallow, task_class="T", attempts=1)
        deep_task, shallow_task = disk.find_dead_task("deep"), disk.find_dead_task("shallow")
    assert deep_task is not None and shallow_task is not None
    assert len(deep_task.backtrace) == 20
    assert all(re.fullmatch(r".+\.py:\d+:in recurse", f) for f in deep_task.backtrace)
    raise_line = recurse.__code__.co_firstlineno + 2
    assert deep_task.backtrace[-1].endswith(f":{raise_line}:in recurse")
    assert [f.rsplit(":in ", 1)[1] for f in shallow_task.backtrace] == [
        "test_the_backtrace_keeps_the_20_frames_nearest_the_raise_outermost_first",
        "recurse", "recurse"]
    assert deep_task.backtrace[-1] == shallow_task.backtrace[-1]


@pytest.mark.spec("F-17", "F-50")
def test_a_backtrace_frame_is_clipped_to_4096_characters(storage: Path) -> None:
    name = "f" * 5000
    namespace: dict[str, Any] = {}
    exec(f"def {name}():\n    raise ValueError('x')\n", namespace)  # noqa: S102 - a long name
    try:
        namespace[name]()
    except ValueError as exc:
        error = exc
    with open_disk(storage) as disk:
        disk.add_dead_task("t", b"", error, task_class="T", attempts=1)
        task = disk.find_dead_task("t")
    assert task is not None
    assert len(task.backtrace[-1]) == 4096 and task.backtrace[-1].endswith("...[truncated]")


@pytest.mark.spec("F-17", "F-47", "F-50")
def test_exception_class_is_module_and_qualname_or_the_bare_builtin_name(
        storage: Path) -> None:
    long_class = type("C" * 2000, (Exception,), {})
    errors: dict[str, BaseException] = {
        "builtin": ValueError("x"),
        "builtin subclass": FileNotFoundError(2, "gone"),
        "nested": Outer.CustomError("x"),
        "stdlib": json.JSONDecodeError("x", "doc", 0),
        "long": long_class("x"),
    }
    with open_disk(storage) as disk:
        for task_id, error in errors.items():
            disk.add_dead_task(task_id.replace(" ", "-"), b"", error, task_class="T",
                               attempts=1)
        names = {}
        for task_id in errors:
            task = disk.find_dead_task(task_id.replace(" ", "-"))
            assert task is not None
            names[task_id] = task.exception_class
    assert names["builtin"] == "ValueError"
    assert names["builtin subclass"] == "FileNotFoundError"
    assert names["nested"] == f"{Outer.CustomError.__module__}.Outer.CustomError"
    assert names["stdlib"] == "json.decoder.JSONDecodeError"
    assert len(names["long"]) == EXCEPTION_CLASS_CHARS_MAX
    assert names["long"].endswith("...[truncated]")
    assert names["long"].startswith(f"{long_class.__module__}.CCC")


@pytest.mark.spec("W-28", "F-51", "F-52")
def test_enqueued_at_is_the_ids_leading_integer_and_failed_at_the_wall_clock(
        storage: Path) -> None:
    clock = ManualClock(wall=1_700_000_123.9)
    cases = {"1700000001-42-7": 1_700_000_001, "plain": 0, "1234567890123-x": 1234567890123,
             "12x-1": 0, "999999999999": 999_999_999_999, f"{2**63}-x": 0}
    with open_disk(storage, RecordingEnv(clock)) as disk:
        for task_id in cases:
            add(disk, task_id)
        for task_id, enqueued_at in cases.items():
            task = disk.find_dead_task(task_id)
            assert task is not None
            assert (task.enqueued_at, task.failed_at) == (enqueued_at, 1_700_000_123)
            assert task.task_class == "app.Task" and task.context == b"ctx"


# ----------------------------------------------------------------------------- D-7 / D-13 handoff


@pytest.mark.spec("D-7", "D-13")
def test_a_task_handed_to_the_dead_store_is_dead_and_no_longer_pending_after_reopen(
        storage: Path) -> None:
    with open_disk(storage) as disk:
        task_id = disk.add_task(b"payload")
        other = disk.add_task(b"other")
        disk.add_dead_task(task_id, b"payload", caught(), task_class="app.Task", attempts=21)
    with open_disk(storage) as disk:  # stopped between the two steps: in both stores
        assert [t.task_id for t in disk.pending_tasks()] == [task_id, other]
        assert disk.find_dead_task(task_id) is not None
        disk.remove_task(task_id)
    with open_disk(storage) as disk:
        dead = disk.find_dead_task(task_id)
        assert dead is not None and dead.context == b"payload" and dead.attempts == 21
        assert [t.task_id for t in disk.pending_tasks()] == [other]


def _pages(disk: Disk, size: int, places: int) -> list[list[str]]:
    """Every page of ``size`` up to ``places`` (a page may be short, or empty, S-33)."""
    return [[t.id for t in disk.list_dead_tasks(offset=offset, limit=size)]
            for offset in range(0, places, size)]


@pytest.mark.spec("S-6", "S-33", "S-34", "R-@G", "D-14", "S-81")
def test_offset_pages_partition_the_decodable_tasks_whatever_undecodable_lines_sit_between(
        storage: Path) -> None:
    names = [f"t{n}" for n in range(9)]
    places: list[str | None] = []  # oldest first; None: an undecodable record's place
    with Disk(path=storage, fsync_frequency=0) as disk:
        for n, name in enumerate(names):
            disk.add_dead_task(name, b"", RuntimeError(name), task_class="T", attempts=1)
            places.append(name)
            if n % 3 != 2:  # undecodable records (valid frame, bad JSON) between the tasks
                with (storage / "deferred-dead_tasks-0").open("ab") as f:
                    f.write(frame(b'dead_task:bad%d:{"not":"a dead task"}' % n))
                places.append(None)
    places.reverse()
    newest_first = names[::-1]
    for size in range(1, 11):
        want = [[p for p in places[k:k + size] if p is not None]
                for k in range(0, len(places), size)]
        with Disk(path=storage, fsync_frequency=0) as disk:  # a fresh Disk pages by scan
            scanned = _pages(disk, size, len(places))
            assert disk.list_dead_tasks() == disk.list_dead_tasks()  # builds the index
            indexed = _pages(disk, size, len(places))  # then pages through the index (S-11)
        for pages in (scanned, indexed):
            assert pages == want, (size, pages)
            assert [name for page in pages for name in page] == newest_first, (size, pages)
    with Disk(path=storage, fsync_frequency=0) as disk:
        # Newest first: t8, bad7, t7, bad6, t6, ...: bad7 has a place of its own (S-33).
        assert [t.id for t in disk.list_dead_tasks(offset=0, limit=1)] == ["t8"]
        assert [t.id for t in disk.list_dead_tasks(offset=1, limit=1)] == []  # bad7's place
        assert [t.id for t in disk.list_dead_tasks(offset=1, limit=2)] == ["t7"]
        assert [t.id for t in disk.list_dead_tasks(offset=3, limit=2)] == ["t6"]  # bad6, t6
        assert [t.id for t in disk.list_dead_tasks(offset=len(places))] == []


@pytest.mark.spec("R-@K", "D-5", "S-6")
def test_a_dead_task_after_a_zero_filled_hole_is_listed_found_and_kept_by_compaction(
        storage: Path) -> None:
    def dead(name: str) -> bytes:
        return encode_dead(DeadTask(id=name, task_class="T", attempts=1, enqueued_at=0,
                                    failed_at=0, exception_class="E", exception_message=name,
                                    backtrace=(), context=b""))

    storage.mkdir()
    data = storage / "deferred-dead_tasks-0"
    # What a power loss leaves when a write's pages were dropped but its size was kept, and a
    # later writer appended and fsynced after them: a hole glued to the next record.
    data.write_bytes(dead("a") + b"\0" * 40 + dead("b"))
    with Disk(path=storage, fsync_frequency=0) as disk:
        assert [t.id for t in disk.list_dead_tasks()] == ["b", "a"]
        assert disk.find_dead_task("b") is not None
        disk.add_dead_task("c", b"", RuntimeError("c"), task_class="T", attempts=1)
        assert disk.remove_dead_tasks("c") == 1
        assert data.read_bytes() == dead("a") + dead("b")  # compaction kept b, not the hole


@pytest.mark.spec("S-9", "S-2")
def test_a_compaction_mark_left_by_a_dead_process_is_settled_before_the_next_write(
        storage: Path) -> None:
    env = RecordingEnv()
    with Disk(path=storage, env=env, fsync_frequency=0) as disk:
        lock = storage / "deferred-dead_tasks.lock"
        disk.add_dead_task("a", b"", RuntimeError("a"), task_class="T", attempts=1)
        assert disk.remove_dead_tasks("a") == 1
        assert lock.stat().st_size == 0  # a completed compaction clears its mark
        os.truncate(lock, 1)  # as if a process died between its rename and its dir fsync
        env.clear()
        disk.list_dead_tasks()
        assert env.calls_of("fsync_dir") == [] and lock.stat().st_size == 1  # reads leave it
        disk.add_dead_task("b", b"", RuntimeError("b"), task_class="T", attempts=1)
        assert lock.stat().st_size == 0
        assert env.index("fsync_dir") < env.index("write")  # durable name before the ack


@pytest.mark.spec("S-9")
def test_a_compaction_sets_its_mark_before_the_rename_and_clears_it_after_the_dir_fsync(
        storage: Path) -> None:
    env = RecordingEnv()
    with Disk(path=storage, env=env, fsync_frequency=0) as disk:
        disk.add_dead_task("a", b"", RuntimeError("a"), task_class="T", attempts=1)
        env.clear()
        assert disk.remove_dead_tasks("a") == 1
        ops = env.ops()
        marks = [i for i, op in enumerate(ops) if op == "ftruncate"]
        assert len(marks) == 2
        assert marks[0] < ops.index("rename") < env.index("fsync_dir") < marks[1]
