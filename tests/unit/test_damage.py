"""Bad input on disk: every kind of damage gets the result spec/recovery.md gives it (R-@A..R-@G, D-5).

Goal: garbage, zero fill, truncation at any byte, bit flips, over-long lines,
non-UTF-8 bytes, well-framed nonsense and unusable storage paths are each
handled as the recovery table says. Nothing valid is lost, damage is counted
in the warning log, and a bad path gives a clear ``OSError``. Method: write a
tasks-WAL file (named per F-1) or the dead-task data file by hand with the
codec, place the damage at an exact byte, then open ``Disk`` (WAL replay) or
list the dead tasks (backward reader) and compare with what the valid records
alone would give. Read errors (EIO) are not damage: they must propagate.
"""

from __future__ import annotations

import logging
import os
import random
import re
from pathlib import Path

import pytest

from deferq._core.deadcodec import encode_dead
from deferq._core.frame import frame
from deferq._core.limits import LINE_BYTES_MAX
from deferq._core.names import wal_file_name
from deferq._core.types import DeadTask
from deferq._core.walcodec import encode_add, encode_rem
from deferq.backends import Disk
from tests.fsenv import FaultyEnv

PREFIX = "deferred-"
WAL_NAME = wal_file_name(PREFIX, "20240101", 1, 1)
DATA = "deferred-dead_tasks-0"
BIG = int(8.5 * 1024 * 1024)  # over LINE_BYTES_MAX (8 MiB)
WAL_COUNT = re.compile(r"Detected (\d+) corrupted deferred task record")
DEAD_COUNT = re.compile(r"Detected (\d+) corrupted dead-lettered task record")


def open_disk(storage: Path) -> Disk:
    return Disk(path=storage, prefix=PREFIX, fsync_frequency=0)


def add(task_id: str) -> bytes:
    return encode_add(task_id, None, task_id.encode())


def dead(task_id: str) -> bytes:
    return encode_dead(DeadTask(
        id=task_id, task_class="app.Task", attempts=1, enqueued_at=0, failed_at=1_700_000_000,
        exception_class="ValueError", exception_message="boom", backtrace=(),
        context=task_id.encode()))


def reported(caplog: pytest.LogCaptureFixture, pattern: re.Pattern[str]) -> int:
    """The damaged-line count of the warning log (0 without a warning); at most one warning."""
    counts = [int(m.group(1)) for r in caplog.records
              if r.levelno == logging.WARNING and (m := pattern.search(r.getMessage()))]
    assert len(counts) <= 1, counts
    return counts[0] if counts else 0


def replay(storage: Path, content: bytes, caplog: pytest.LogCaptureFixture) -> tuple[list[str], int]:
    """Make ``content`` the only WAL file, open a Disk on it; return (pending ids, damage reported)."""
    storage.mkdir(exist_ok=True)
    for path in storage.iterdir():
        if path.name.startswith(f"{PREFIX}0-"):
            path.unlink()
    (storage / WAL_NAME).write_bytes(content)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="deferq"), open_disk(storage) as disk:
        pending = [t.task_id for t in disk.pending_tasks()]
    return pending, reported(caplog, WAL_COUNT)


def copied_records(storage: Path) -> bytes:
    """The records of the fresh copy adoption wrote (W-3), after its seed marker (W-28).

    The adopted file itself must be gone (W-4): the copy is the only WAL file.
    """
    (wal,) = [p for p in storage.iterdir() if p.name.startswith(f"{PREFIX}0-")]
    assert wal.name != WAL_NAME
    marker, _, rest = wal.read_bytes().rstrip(b"\0").partition(b"\n")  # R-@L
    assert re.fullmatch(rb"[0-9a-f]{8}:rem:[0-9]+-[0-9]+-0", marker), marker
    return rest


def read_dead(storage: Path, content: bytes, caplog: pytest.LogCaptureFixture,
              disk: Disk | None = None) -> tuple[list[str], int]:
    """Make ``content`` the dead-task data file and list it; return (ids newest first, damage).

    Every operation opens the data file by path (S-3), so an open ``disk`` may be reused.
    """
    storage.mkdir(exist_ok=True)
    if disk is None:
        with open_disk(storage) as fresh:
            return read_dead(storage, content, caplog, fresh)
    (storage / DATA).write_bytes(content)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="deferq"):
        listed = [t.id for t in disk.list_dead_tasks()]
    return listed, reported(caplog, DEAD_COUNT)


def garbage(seed: int, size: int) -> bytes:
    """Deterministic random bytes ending in a newline (so the next record starts a line)."""
    return random.Random(seed).randbytes(size) + b"\n"


# ----------------------------------------------------------------------------- garbage, zeros


@pytest.mark.spec("D-5", "R-@A", "R-@B", "R-@C")
@pytest.mark.parametrize("seed", range(5))
def test_garbage_between_records_is_skipped_and_every_record_survives(
        storage: Path, seed: int, caplog: pytest.LogCaptureFixture) -> None:
    junk = garbage(seed, 700)
    pending, damage = replay(storage, add("a") + junk + add("b") + junk + add("c"), caplog)
    assert pending == ["a", "b", "c"] and damage >= 2
    listed, damage = read_dead(storage, dead("a") + junk + dead("b") + junk + dead("c"), caplog)
    assert listed == ["c", "b", "a"] and damage >= 2


@pytest.mark.spec("D-5", "R-@L", "F-46", "W-60", "W-61")
def test_a_zero_filled_wal_file_replays_as_empty_and_is_replaced_by_an_empty_copy(
        storage: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Zeros at the end of a WAL file are space reserved for records (W-25), whether the
    # records never came or a power loss kept the reserved size without them: no damage.
    pending, damage = replay(storage, b"\0" * 4096, caplog)
    assert pending == [] and damage == 0
    assert copied_records(storage) == b""


@pytest.mark.spec("D-5", "R-@F")
def test_a_zero_filled_dead_task_file_lists_nothing_and_the_next_add_starts_it_afresh(
        storage: Path, caplog: pytest.LogCaptureFixture) -> None:
    listed, damage = read_dead(storage, b"\0" * 4096, caplog)
    assert listed == [] and damage == 1
    with open_disk(storage) as disk:
        disk.add_dead_task("a", b"", ValueError("x"), task_class="T", attempts=1)
        assert [t.id for t in disk.list_dead_tasks()] == ["a"]
    assert (storage / DATA).read_bytes().count(b"\n") == 1


@pytest.mark.spec("D-5", "R-@B", "R-@F", "R-@K", "R-@L")
def test_zero_filled_regions_and_tails_lose_only_themselves(
        storage: Path, caplog: pytest.LogCaptureFixture) -> None:
    zeros = b"\0" * 512
    # In a WAL file the zeros after the last record are reserved space (R-@L): only the
    # zero-filled line between the records is damage (R-@K). In the dead-task file both are.
    pending, damage = replay(storage, add("a") + zeros + b"\n" + add("b") + zeros, caplog)
    assert pending == ["a", "b"] and damage == 1
    pending, damage = replay(storage, add("a") + b"torn" + zeros, caplog)
    assert pending == ["a"] and damage == 1  # a torn tail stays one, zeros or not (R-@F)
    listed, damage = read_dead(storage, dead("a") + zeros + b"\n" + dead("b") + zeros, caplog)
    assert listed == ["b", "a"] and damage == 2


# ----------------------------------------------------------------------------- truncation


@pytest.mark.slow
@pytest.mark.spec("D-5", "R-@F")
def test_a_wal_cut_at_any_byte_of_its_last_record_keeps_every_earlier_record(
        storage: Path, caplog: pytest.LogCaptureFixture) -> None:
    head = add("a") + encode_rem("a") + add("b") + add("c")
    last = add("d")
    for cut in range(len(last) + 1):
        pending, damage = replay(storage, head + last[:cut], caplog)
        whole = cut == len(last)
        assert pending == ["b", "c"] + (["d"] if whole else []), cut
        assert damage == (0 if cut in (0, len(last)) else 1), cut


@pytest.mark.slow
@pytest.mark.spec("D-5", "R-@F")
def test_a_dead_task_file_cut_at_any_byte_of_its_last_record_keeps_every_earlier_record(
        storage: Path, caplog: pytest.LogCaptureFixture) -> None:
    head = dead("a") + dead("b")
    last = dead("c")
    with open_disk(storage) as disk:
        for cut in range(len(last) + 1):
            listed, damage = read_dead(storage, head + last[:cut], caplog, disk)
            whole = cut == len(last)
            assert listed == (["c"] if whole else []) + ["b", "a"], cut
            assert damage == (0 if cut in (0, len(last)) else 1), cut


# ----------------------------------------------------------------------------- bit flips


def flips(record: bytes) -> list[bytes]:
    """The record with one bit flipped, for every byte but its newline (the line boundary)."""
    out = []
    for index in range(len(record) - 1):
        for bit in (0x01, 0x20):
            changed = bytearray(record)
            changed[index] ^= bit
            out.append(bytes(changed))
    return out


@pytest.mark.slow
@pytest.mark.spec("D-5", "R-@B", "R-@C", "A-9")
def test_a_bit_flip_anywhere_in_the_middle_wal_record_loses_only_that_record(
        storage: Path, caplog: pytest.LogCaptureFixture) -> None:
    for damaged in flips(add("bb")):
        pending, damage = replay(storage, add("a") + damaged + add("c"), caplog)
        assert pending == ["a", "c"], damaged
        assert damage >= 1, damaged


@pytest.mark.slow
@pytest.mark.spec("D-5", "R-@B", "R-@C", "A-9")
def test_a_bit_flip_anywhere_in_the_middle_dead_task_record_loses_only_that_record(
        storage: Path, caplog: pytest.LogCaptureFixture) -> None:
    with open_disk(storage) as disk:
        for damaged in flips(dead("bb")):
            listed, damage = read_dead(storage, dead("a") + damaged + dead("c"), caplog, disk)
            assert listed == ["c", "a"], damaged
            assert damage >= 1, damaged


# ----------------------------------------------------------------------------- over-long lines


@pytest.mark.slow
@pytest.mark.spec("D-5", "R-@E")
def test_an_over_long_wal_line_is_skipped_even_with_a_valid_crc(
        storage: Path, caplog: pytest.LogCaptureFixture) -> None:
    huge = encode_add("huge", None, b"h" * (BIG * 3 // 4))  # a valid frame, ~8.5 MiB long
    assert len(huge) > LINE_BYTES_MAX
    plain = b"x" * BIG + b"\n"
    pending, damage = replay(storage, add("a") + huge + add("b") + plain + add("c"), caplog)
    assert pending == ["a", "b", "c"] and damage == 2


@pytest.mark.spec("D-5", "R-@E", "R-@F")
def test_an_over_long_torn_wal_tail_is_left_behind_at_adoption(
        storage: Path, caplog: pytest.LogCaptureFixture) -> None:
    pending, damage = replay(storage, add("a") + b"t" * BIG, caplog)
    assert pending == ["a"] and damage == 1
    assert copied_records(storage) == add("a")


@pytest.mark.spec("D-5", "R-@E")
def test_an_over_long_dead_task_line_is_skipped_by_list_and_find(
        storage: Path, caplog: pytest.LogCaptureFixture) -> None:
    body = dead("huge")[9:-1].replace(b'"context":"aHVnZQ=="',
                                      b'"context":"' + b"A" * BIG + b'"')
    huge = frame(body)
    assert len(huge) > LINE_BYTES_MAX
    listed, damage = read_dead(storage, dead("a") + huge + dead("b"), caplog)
    assert listed == ["b", "a"] and damage == 1
    with open_disk(storage) as disk:
        assert disk.find_dead_task("huge") is None
        assert disk.find_dead_task("a") is not None


# ----------------------------------------------------------------------------- bytes that parse badly


@pytest.mark.spec("D-5", "R-@B", "R-@D")
def test_non_utf8_bytes_are_damage_not_a_crash(
        storage: Path, caplog: pytest.LogCaptureFixture) -> None:
    wal_bad = [b"\xff\xfe\xfd\n", frame(b"add:\xff\xfe:0:"), frame(b"rem:\xc3")]
    pending, damage = replay(storage, add("a") + b"".join(wal_bad) + add("b"), caplog)
    assert pending == ["a", "b"] and damage == 3
    dead_bad = [b"\xff\xfe\xfd\n", frame(b"dead_task:\xff:{}")]
    listed, damage = read_dead(storage, dead("a") + b"".join(dead_bad) + dead("b"), caplog)
    assert listed == ["b", "a"] and damage == 2


@pytest.mark.spec("R-@G")
def test_non_utf8_bytes_inside_a_dead_task_payload_are_logged_and_skipped(
        storage: Path, caplog: pytest.LogCaptureFixture) -> None:
    bad = frame(b'dead_task:x:{"id":"\xff"}')
    listed, damage = read_dead(storage, dead("a") + bad + dead("b"), caplog)
    assert listed == ["b", "a"] and damage == 0
    assert any(r.levelno == logging.ERROR and "with id x" in r.getMessage()
               for r in caplog.records)


WELL_FRAMED_NONSENSE = {
    "unknown op": b"upd:x:0:",
    "no fields": b"add",
    "missing payload": b"add:x:0",
    "publish_at leading zero": b"add:x:01:",
    "publish_at negative": b"add:x:-1:",
    "publish_at 21 digits": b"add:x:123456789012345678901:",
    "bad base64": b"add:x:0:abc",
    "non-canonical base64": b"add:x:0:YR==",
    "empty id": b"add::0:",
    "rem empty id": b"rem:",
    "rem extra field": b"rem:x:y",
    "dead op in a wal": b"dead_task:x:{}",
}


@pytest.mark.spec("D-5", "R-@D")
@pytest.mark.parametrize("body", list(WELL_FRAMED_NONSENSE.values()),
                         ids=list(WELL_FRAMED_NONSENSE))
def test_a_wal_line_with_a_valid_crc_but_a_body_that_does_not_parse_is_skipped(
        storage: Path, body: bytes, caplog: pytest.LogCaptureFixture) -> None:
    pending, damage = replay(storage, add("a") + frame(body) + add("b"), caplog)
    assert pending == ["a", "b"] and damage == 1


@pytest.mark.spec("D-5", "R-@D")
@pytest.mark.parametrize("body", [b"task:x:{}", b"dead_task:x", b"dead_task::{}",
                                  b"add:x:0:", b"dead_task:q:b:{}"],
                         ids=["unknown op", "no payload", "empty id", "wal op", "colon in id"])
def test_a_dead_task_line_with_a_valid_crc_but_a_body_that_does_not_parse_is_skipped(
        storage: Path, body: bytes, caplog: pytest.LogCaptureFixture) -> None:
    listed, damage = read_dead(storage, dead("a") + frame(body) + dead("b"), caplog)
    assert listed == ["b", "a"]
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert damage + len(errors) == 1  # an id with a ':' frames as id "q" with a bad payload


# ----------------------------------------------------------------------------- storage paths


@pytest.mark.spec("C-11")
def test_a_missing_directory_is_created(tmp_path: Path) -> None:
    storage = tmp_path / "not" / "there" / "yet"
    with open_disk(storage) as disk:
        disk.add_task(b"x", task_id="x")
    assert storage.is_dir()


def test_a_read_only_directory_gives_a_permission_error(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("running as root: permission bits do not stop root's writes")
    storage = tmp_path / "storage"
    storage.mkdir(mode=0o500)
    try:
        with pytest.raises(PermissionError):
            open_disk(storage)
    finally:
        storage.chmod(0o700)


def test_a_storage_path_below_a_regular_file_gives_a_clear_oserror(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_bytes(b"keep me")
    with pytest.raises(OSError) as info:
        open_disk(blocker / "storage")
    assert isinstance(info.value, (NotADirectoryError, FileExistsError))
    assert blocker.read_bytes() == b"keep me"


def test_a_storage_path_that_is_a_regular_file_gives_a_clear_oserror(tmp_path: Path) -> None:
    blocker = tmp_path / "storage"
    blocker.write_bytes(b"keep me")
    with pytest.raises(OSError) as info:
        open_disk(blocker)
    assert isinstance(info.value, (NotADirectoryError, FileExistsError))
    assert str(blocker) in str(info.value)
    assert blocker.read_bytes() == b"keep me"


# ----------------------------------------------------------------------------- reporting


@pytest.mark.spec("D-5", "S-7")
def test_unreadable_lines_are_reported_by_count_in_one_warning(
        storage: Path, caplog: pytest.LogCaptureFixture) -> None:
    damaged = b"junk\n" + frame(b"upd:x") + b"00000000:add:z:0:\n"
    _, damage = replay(storage, add("a") + damaged + add("b") + b"torn", caplog)
    assert damage == 4
    message = next(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert message.startswith("Detected 4 corrupted deferred task record(s) in ")
    assert WAL_NAME in message
    _, damage = read_dead(storage, dead("a") + damaged + dead("b") + b"torn", caplog)
    assert damage == 4
    message = next(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert message.startswith("Detected 4 corrupted dead-lettered task record(s) in ")


def test_a_read_error_is_not_damage_it_propagates_and_leaves_the_files_alone(
        storage: Path) -> None:
    storage.mkdir()
    content = add("a") + add("b")
    (storage / WAL_NAME).write_bytes(content)
    env = FaultyEnv()
    env.inject("pread", path=str(storage / WAL_NAME))
    with pytest.raises(OSError):
        Disk(path=storage, prefix=PREFIX, fsync_frequency=0, env=env)
    assert (storage / WAL_NAME).read_bytes() == content
    with open_disk(storage) as disk:  # nothing was left locked or half-merged
        assert [t.task_id for t in disk.pending_tasks()] == ["a", "b"]
        (storage / DATA).write_bytes(dead("x"))
    env = FaultyEnv()
    with Disk(path=storage, prefix=PREFIX, fsync_frequency=0, env=env) as disk:
        env.inject("pread", path=str(storage / DATA))
        with pytest.raises(OSError):
            disk.list_dead_tasks()
        assert [t.id for t in disk.list_dead_tasks()] == ["x"]
