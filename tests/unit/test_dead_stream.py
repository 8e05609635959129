"""The dead-task store's newest-first scan and its stepped reads (S-6, S-27..S-31, L-6).

Goal: the scan behind ``list_dead_tasks`` and the operators' stepped read return exactly
what the per-process index returns on the same file, damage included, whatever the block
boundaries (S-27, S-31); a stepped read holds the locks only inside steps of bounded size
and never while its caller works (S-27, L-6); it reads a snapshot (S-28); under a
concurrent compaction it returns each id at most once and every task present throughout
exactly once, and gives up after a bounded number of restarts (S-29); it holds ids, not
records (S-30); a deep page decodes only its own records (S-31).
Method: real files in a temporary directory; Hypothesis builds data files of valid,
superseded and damaged lines, and the block size is shrunk to a few bytes so that lines
span blocks; a second ``Disk`` on the same directory is another process (A-8); a store
subclass records the bytes read inside each hold of the locks.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import logging
import re
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deferq._core.deadcodec import decode_dead_record, encode_dead
from deferq._core.errors import DeadTasksLockTimeout
from deferq._core.limits import DEAD_READ_RESTARTS_MAX, DEAD_READ_STEP_BYTES, READ_CHUNK_BYTES
from deferq._core.types import DeadTask
from deferq._engine import deadstream
from deferq._engine.deadstore import DeadTaskStore
from deferq._engine.osenv import OS_ENV, OsEnv
from deferq.backends import Disk

PREFIX = "deferred-"
DATA = "deferred-dead_tasks-0"


def dead(task_id: str, message: str = "gave up") -> DeadTask:
    return DeadTask(id=task_id, task_class="job.T", attempts=3, enqueued_at=1, failed_at=2,
                    exception_class="ValueError", exception_message=message, backtrace=("f",),
                    context=b"ctx-" + task_id.encode())


def write_store(storage: Path, data: bytes) -> None:
    storage.mkdir(parents=True, exist_ok=True)
    (storage / DATA).write_bytes(data)


def damage_logged(caplog: pytest.LogCaptureFixture) -> int:
    found = [int(m.group(1)) for r in caplog.records
             if (m := re.match(r"Detected (\d+) corrupted", r.getMessage()))]
    assert len(found) <= 1, "damage is reported once per read (S-7)"
    return found[0] if found else 0


def read_three_ways(storage: Path, caplog: pytest.LogCaptureFixture
                    ) -> list[tuple[list[str], int]]:
    """(ids, damage) of the index, the scan and the stepped read on one file."""
    out = []
    for way in ("index", "scan", "stream"):
        caplog.clear()
        store = DeadTaskStore(OS_ENV, str(storage), PREFIX)
        try:
            if way == "index":
                tasks = store.list_tasks(None, 0)  # S-11: an unlimited list builds the index
                assert store._index is not None
            elif way == "scan":
                tasks = store.list_tasks(10**9, 0)
                assert store._index is None
            else:
                tasks = list(store.iter_tasks())
        finally:
            store.close()
        out.append(([t.id for t in tasks], damage_logged(caplog)))
    return out


LINE_KINDS = st.sampled_from(["record", "record", "record", "flip", "garbage", "empty",
                              "hole", "zeros", "undecodable"])


def build_file(kinds: list[tuple[str, int]], torn: bool) -> bytes:
    out = []
    for kind, n in kinds:
        line = encode_dead(dead(f"id-{n % 7}", message=f"m{n}"))
        if kind == "flip":
            line = line[:12] + bytes([line[12] ^ 1]) + line[13:]
        elif kind == "garbage":
            line = b"not a record at all\n"
        elif kind == "empty":
            line = b"\n"
        elif kind == "hole":
            line = b"\0" * (n % 5 + 1) + line
        elif kind == "zeros":
            line = b"\0" * (n % 9 + 1) + b"\n"
        elif kind == "undecodable":
            body = f"dead_task:id-{n % 7}:{{not json".encode()
            line = b"%08x:" % __import__("zlib").crc32(body) + body + b"\n"
        out.append(line)
    data = b"".join(out)
    return data + (b"0badc0de:dead_task:torn" if torn else b"")


@pytest.mark.spec("S-27", "S-31", "S-6", "S-7", "S-12", "R-@H", "R-@K", "S-60")
@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(LINE_KINDS, st.integers(0, 40)), max_size=25), st.booleans(),
       st.sampled_from([5, 17, 64, 300]))
def test_the_scan_and_the_stepped_read_agree_with_the_index_on_any_file(
        kinds: list[tuple[str, int]], torn: bool, block: int) -> None:
    data = build_file(kinds, torn)
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
        mp.setattr(deadstream, "READ_CHUNK_BYTES", block)
        mp.setattr(deadstream, "DEAD_READ_STEP_BYTES", 2 * block)
        storage = Path(tmp) / "s"
        write_store(storage, data)
        handler = DamageLog()
        logging.getLogger("deferq").addHandler(handler)
        try:
            results = []
            for way in ("index", "scan", "stream"):
                handler.records.clear()
                store = DeadTaskStore(OS_ENV, str(storage), PREFIX)
                try:
                    tasks = (store.list_tasks(None, 0) if way == "index"
                             else store.list_tasks(10**9, 0) if way == "scan"
                             else list(store.iter_tasks()))
                finally:
                    store.close()
                results.append(([t.id for t in tasks], handler.damage()))
        finally:
            logging.getLogger("deferq").removeHandler(handler)
        assert results[1] == results[0] and results[2] == results[0], results


class DamageLog(logging.Handler):
    """The records logged under ``deferq``, and the one damage count they report (S-7)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def damage(self) -> int:
        found = [int(m.group(1)) for r in self.records
                 if (m := re.match(r"Detected (\d+) corrupted", r.getMessage()))]
        assert len(found) <= 1
        return found[0] if found else 0


@pytest.mark.spec("S-27", "S-6", "R-@E", "S-60")
def test_an_over_long_line_is_one_damaged_line_to_the_stepped_read(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from deferq._core.limits import LINE_BYTES_MAX
    data = (encode_dead(dead("a")) + b"x" * (LINE_BYTES_MAX + 10) + b"\n"
            + encode_dead(dead("b")))
    write_store(tmp_path / "s", data)
    results = read_three_ways(tmp_path / "s", caplog)
    assert results == [(["b", "a"], 1)] * 3


# ----------------------------------------------------------------------------- S-27, L-6


class CountingStore(DeadTaskStore):
    """Records the bytes read by pread inside each hold of the locks."""

    holds: list[int]

    @contextlib.contextmanager
    def _locked(self, operation: str) -> Iterator[None]:
        with super()._locked(operation):
            env = self._env
            assert isinstance(env, PreadCounter)
            before = env.read
            try:
                yield
            finally:
                self.holds.append(env.read - before)


class PreadCounter(OsEnv):
    read = 0

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        data = super().pread(fd, size, offset)
        self.read += len(data)
        return data


@pytest.mark.spec("S-27", "S-30", "L-6", "S-59", "S-58")
@pytest.mark.slow
def test_a_stepped_read_holds_the_locks_only_for_bounded_steps_and_never_while_the_caller_works(
        tmp_path: Path) -> None:
    records = [encode_dead(dead(f"t{i}", message="x" * 2000)) for i in range(3000)]
    write_store(tmp_path / "s", b"".join(records))  # about 6.5 MB
    store = CountingStore(PreadCounter(), str(tmp_path / "s"), PREFIX)
    store.holds = []
    other = Disk(path=tmp_path / "s", prefix=PREFIX, fsync_frequency=0)
    try:
        count = 0
        for task in store.iter_tasks():
            count += 1
            if count % 500 == 0:  # the caller works: another process adds meanwhile (L-6)
                assert store._lock.local.acquire(blocking=False)
                store._lock.local.release()
                other.add_dead_task(f"new{count}", b"c", ValueError("x"), task_class="T",
                                    attempts=1)
        assert count == 3000 and task.id == "t0"
        checks = 2 * READ_CHUNK_BYTES  # the snapshot's end and last bytes (S-28)
        assert max(store.holds) <= DEAD_READ_STEP_BYTES + checks
        # The first step: the snapshot's end, its newest chunk; then steps grow from there.
        assert store.holds[0] <= 2 * READ_CHUNK_BYTES
        assert store.holds[1] <= 2 * READ_CHUNK_BYTES + checks
        assert len(store.holds) >= 6
    finally:
        other.close()
        store.close()


# ----------------------------------------------------------------------------- S-28, S-29


@pytest.mark.spec("S-28", "S-63", "S-61")
def test_a_stepped_read_returns_its_snapshot_not_records_appended_after_it(
        tmp_path: Path) -> None:
    with Disk(path=tmp_path, prefix=PREFIX, fsync_frequency=0) as disk:
        for i in range(50):
            disk._dead.add(dead(f"old{i}"))
        with open(tmp_path / DATA, "ab") as f:
            f.write(b"0badc0de:torn")  # a torn tail at the snapshot: counted once, not read
        stream = disk._dead.iter_tasks()
        first = next(stream)
        disk._dead.add(dead("old3", message="newer"))  # cuts the tail, appends
        disk._dead.add(dead("late"))
        rest = list(stream)
    ids = [first.id, *(t.id for t in rest)]
    assert ids == [f"old{i}" for i in reversed(range(50))]
    assert all(t.exception_message == "gave up" for t in rest)


@pytest.mark.spec("S-29", "S-28", "S-62", "S-64")
def test_under_a_concurrent_compaction_each_id_comes_once_and_every_survivor_comes(
        tmp_path: Path) -> None:
    ids = [f"t{i}" for i in range(400)]
    write_store(tmp_path, b"".join(encode_dead(dead(i, message="y" * 1500)) for i in ids))
    reader = DeadTaskStore(OS_ENV, str(tmp_path), PREFIX)
    other = Disk(path=tmp_path, prefix=PREFIX, fsync_frequency=0)
    try:
        stream = reader.iter_tasks()
        got = [t.id for t in itertools.islice(stream, 100)]
        removed = {"t399", "t200", "t10", "t5"}  # one already returned, three not yet
        assert other.remove_dead_tasks(removed) == 4  # a compaction: a new inode
        other.add_dead_task("added", b"c", ValueError("x"), task_class="T", attempts=1)
        got += [t.id for t in stream]
    finally:
        other.close()
        reader.close()
    assert len(got) == len(set(got))
    survivors = set(ids) - removed
    assert survivors <= set(got)
    assert set(got) - survivors <= {"t399", "added"}


@pytest.mark.spec("S-29", "S-75")
def test_a_read_that_keeps_meeting_compactions_gives_up_with_a_clear_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deadstream, "READ_CHUNK_BYTES", 4096)  # about one record per step
    monkeypatch.setattr(deadstream, "DEAD_READ_STEP_BYTES", 4096)
    ids = [f"t{i}" for i in range(200)]
    write_store(tmp_path, b"".join(encode_dead(dead(i, message="z" * 3000)) for i in ids))
    reader = DeadTaskStore(OS_ENV, str(tmp_path), PREFIX)
    other = Disk(path=tmp_path, prefix=PREFIX, fsync_frequency=0)
    try:
        stream = reader.iter_tasks()
        with pytest.raises(DeadTasksLockTimeout, match="compacted"):
            for n, _ in enumerate(stream):
                if n % 2 == 0:
                    other.add_dead_task(f"x{n}", b"c", ValueError("x"), task_class="T",
                                        attempts=1)
                    other.remove_dead_tasks(f"x{n}")
        assert n < 200 and DEAD_READ_RESTARTS_MAX == 8
    finally:
        other.close()
        reader.close()


# ----------------------------------------------------------------------------- S-31


@pytest.mark.spec("S-31", "S-6", "S-33", "S-80")
def test_a_deep_page_decodes_only_its_own_records(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    write_store(tmp_path, b"".join(encode_dead(dead(f"t{i}")) for i in range(1000)))
    decoded: list[str] = []
    real = decode_dead_record

    def counting(task_id: str, payload: bytes) -> object:
        decoded.append(task_id)
        return real(task_id, payload)
    monkeypatch.setattr("deferq._engine.deadstream.decode_dead_record", counting)
    with Disk(path=tmp_path, prefix=PREFIX, fsync_frequency=0) as disk:
        page = disk.list_dead_tasks(limit=5, offset=900)
    assert [t.id for t in page] == [f"t{i}" for i in range(99, 94, -1)]
    # S-33: the offset counts frames, so no skipped payload is decoded.
    assert decoded == [t.id for t in page]


def _framed(body: bytes) -> bytes:
    return b"%08x:" % zlib.crc32(body) + body + b"\n"


def _places_file() -> tuple[bytes, list[str | None]]:
    """A store whose latest records include undecodable ones, with a superseded record of
    each kind and a damaged line that must not supersede; and its places, newest first
    (None: an undecodable latest record, S-33)."""
    bad = b'{"not":"a dead task"}'
    lines: list[tuple[bytes, str | None]] = []  # (line, its place or None), oldest first
    for n in range(40):
        name = f"t{n}"
        if n % 10 == 3:  # an undecodable record superseded by a decodable one: not a place
            lines.append((_framed(b"dead_task:%s:%s" % (name.encode(), bad)), "superseded"))
        if n % 10 == 6:  # a decodable record superseded by an undecodable one
            lines.append((encode_dead(dead(name, "old")), "superseded"))
            lines.append((_framed(b"dead_task:%s:%s" % (name.encode(), bad)), None))
            continue
        lines.append((encode_dead(dead(name)), name))
        if n % 4 == 1:  # an undecodable latest record of its own id
            lines.append((_framed(b"dead_task:u%d:%s" % (n, bad)), None))
        if n % 10 == 8:  # a damaged line (CRC) of the same id: it supersedes nothing (R-@H)
            line = encode_dead(dead(name, "newer but damaged"))
            head = b"0" * 8 if line[:8] != b"0" * 8 else b"1" * 8
            lines.append((head + line[8:], "damaged"))
    data = b"".join(line for line, _ in lines)
    places = [p for _, p in reversed(lines) if p not in ("superseded", "damaged")]
    return data, places


@pytest.mark.spec("S-33", "S-34", "S-31", "S-40", "S-27", "R-@G", "R-@H", "S-82", "S-81", "S-83")
@pytest.mark.parametrize("chunk", [READ_CHUNK_BYTES, 600])
def test_pages_over_undecodable_latest_records_partition_the_listing_on_every_read_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int) -> None:
    monkeypatch.setattr(deadstream, "READ_CHUNK_BYTES", chunk)  # 600: runs of a few lines
    data, places = _places_file()
    write_store(tmp_path, data)
    listing = [p for p in places if p is not None]
    assert len(listing) < len(places) and "t8" in listing and "t6" not in listing
    whole_runs: list[bool] = []
    real_run = deadstream._checked_run

    def run(ids: list[bytes], payloads: list[bytes],
            tally: deadstream.Tally) -> Iterator[DeadTask]:
        whole_runs.append(len(ids) <= tally.skip)
        return real_run(ids, payloads, tally)
    monkeypatch.setattr(deadstream, "_checked_run", run)
    scan = DeadTaskStore(OS_ENV, str(tmp_path), PREFIX)
    indexed = DeadTaskStore(OS_ENV, str(tmp_path), PREFIX)
    try:
        assert [t.id for t in indexed.list_tasks(None, 0)] == listing  # builds its index
        for size in range(1, 11):
            pages: list[list[str]] = []
            for offset in range(0, len(places), size):
                want = [p for p in places[offset:offset + size] if p is not None]
                scan._drop_index()  # else scans that read the whole file build one (S-11)
                got = [t.id for t in scan.list_tasks(size, offset)]
                assert scan._index is None, "the scan path, not an index"
                assert got == want, (size, offset)
                assert [t.id for t in indexed.list_tasks(size, offset)] == want, (size, offset)
                assert [t.id for t in scan.iter_tasks(offset, size)] == want, (size, offset)
                pages.append(got)
            assert [name for page in pages for name in page] == listing, size
    finally:
        scan.close()
        indexed.close()
    if chunk < len(data):  # one block holding a damaged line is never one run
        assert any(whole_runs), "no run was skipped whole (S-40): the block skip went untested"



# ----------------------------------------------------------------------------- S-32


@pytest.mark.spec("S-32", "S-78", "S-79")
def test_a_read_only_view_creates_writes_and_fsyncs_nothing_and_refuses_to_change_the_store(
        tmp_path: Path) -> None:
    from deferq._engine.env import OpenFlag
    from tests.fsenv import RecordingEnv, snapshot
    with Disk(path=tmp_path, prefix=PREFIX, fsync_frequency=0) as disk:
        disk.add_dead_task("a", b"c", ValueError("x"), task_class="T", attempts=1)
    before = snapshot(tmp_path)
    env = RecordingEnv()
    store = DeadTaskStore(env, str(tmp_path), PREFIX, read_only=True)
    try:
        assert [t.id for t in store.iter_tasks()] == ["a"]
        assert [t.id for t in store.list_tasks(10, 0)] == ["a"]
        assert store.find("a") is not None
        with pytest.raises(RuntimeError, match="read-only"):
            store.remove({"a"})
        with pytest.raises(RuntimeError, match="read-only"):
            store.add(dead("b"))
    finally:
        store.close()
    opens = env.calls_of("open")
    assert opens and all(c.flags == OpenFlag.READ for c in opens), opens
    assert env.calls_of("flock")  # S-79: it locks its reads like any reader
    assert not [c for c in env.calls if "fsync" in c.op or c.op in ("write", "ftruncate")]
    assert snapshot(tmp_path) == before


@pytest.mark.spec("S-32", "S-76")
def test_reading_commands_read_a_store_without_dead_task_files_as_empty_and_create_none(
        tmp_path: Path) -> None:
    from deferq._cli import main
    with Disk(path=tmp_path, prefix=PREFIX, fsync_frequency=0) as disk:
        disk.add_task(b"payload")
    for name in os.listdir(tmp_path):
        if "dead_tasks" in name:
            os.unlink(tmp_path / name)
    names = sorted(os.listdir(tmp_path))
    assert main(["dead", "list", "--path", str(tmp_path)]) == 0
    assert main(["stats", "--path", str(tmp_path)]) == 0
    assert main(["dead", "show", "nope", "--path", str(tmp_path)]) == 3
    assert sorted(os.listdir(tmp_path)) == names


@pytest.mark.spec("S-32", "S-77")
def test_a_copied_store_without_its_lock_file_is_refused_naming_it(tmp_path: Path) -> None:
    """A reading command cannot lock such a store, and creates nothing to do so."""
    from deferq._cli.dead import DeadStoreView
    from deferq._cli.store import EXIT_NO_STORE, CommandError
    write_store(tmp_path, encode_dead(dead("a")))
    names = sorted(os.listdir(tmp_path))
    with pytest.raises(CommandError, match="lock file") as refused:
        DeadStoreView(str(tmp_path), PREFIX, read_only=True)
    assert refused.value.status == EXIT_NO_STORE
    assert sorted(os.listdir(tmp_path)) == names
