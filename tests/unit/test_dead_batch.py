"""Runs of dead-task lines checked at once (S-40).

Goal: ``check_run`` vouches for a run only when every line in it is exactly what the
line-by-line check accepts, with the same id and payload, and does vouch for a run of
clean records (else the fast path would be dead code); the scan that uses it returns, for
any offset and limit, exactly what the per-process index returns on the same file.
Method: Hypothesis builds runs of valid lines and of lines damaged in the ways that sit
closest to a valid one (one changed header digit, upper-case hex, a non-ASCII or empty or
over-long id, a NUL, another tag, a missing colon); the oracle is ``decode_dead_line`` on
each line. The scan test writes real files with superseded ids and damage and reads them
with a small block size, so each block holds a run of several lines.
"""

from __future__ import annotations

import logging
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from deferq._core.deadbatch import check_run
from deferq._core.deadcodec import decode_dead_line, encode_dead
from deferq._core.frame import BadLine
from deferq._core.limits import TASK_ID_BYTES_MAX
from deferq._core.recovery import RawLine
from deferq._core.types import DeadTask
from deferq._engine import deadstream
from deferq._engine.deadstore import DeadTaskStore
from deferq._engine.osenv import OS_ENV
from tests.unit.test_dead_stream import DamageLog

PREFIX = "deferred-"


def dead(task_id: str, message: str = "gave up") -> DeadTask:
    return DeadTask(id=task_id, task_class="job.T", attempts=3, enqueued_at=1, failed_at=2,
                    exception_class="ValueError", exception_message=message, backtrace=("f",),
                    context=b"ctx")


def framed(body: bytes) -> bytes:
    return b"%08x:" % zlib.crc32(body) + body


def line_of(kind: str, n: int, ids: int = 5) -> bytes:
    """One line without its newline: a clean record, or one near miss of the run check."""
    good = encode_dead(dead(f"id-{n % ids}", f"m{n}"))[:-1]
    if kind == "record":
        return good
    if kind == "digit":  # a header digit changed: the CRC no longer matches
        return (b"0" if good[:1] != b"0" else b"1") + good[1:]
    if kind == "upper":  # the same CRC in upper case: not the frame's lowercase hex (F-3)
        return good[:8].upper() + good[8:] if good[:8] != good[:8].upper() else b"X" + good[1:]
    if kind == "nonascii":
        return framed("dead_task:id-é:{}".encode())
    if kind == "emptyid":
        return framed(b"dead_task::{}")
    if kind == "longid":
        return framed(b"dead_task:" + b"x" * (TASK_ID_BYTES_MAX + 1) + b":{}")
    if kind == "maxid":
        return framed(b"dead_task:" + b"y" * TASK_ID_BYTES_MAX + b":{\"a\": 1}")
    if kind == "nul":
        return good[:30] + b"\0" + good[31:]
    if kind == "tag":
        return framed(b"add:id-1:{}")
    if kind == "nocolon":
        return framed(b"dead_task:id-1")
    if kind == "empty":
        return b""
    if kind == "twolines":  # its CRC covers a newline and the next line: two damaged lines
        return framed(b"dead_task:id-3:{}\nnot a record")
    assert kind == "undecodable"  # a valid frame: the run vouches for it, decoding fails
    return framed(b"dead_task:id-2:{not json")


KINDS = ["record", "digit", "upper", "nonascii", "emptyid", "longid", "maxid", "nul", "tag",
         "nocolon", "empty", "twolines", "undecodable"]


@pytest.mark.spec("S-40")
@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 50)), min_size=1, max_size=8),
       st.binary(max_size=40).filter(lambda b: b"\n" not in b),
       st.binary(max_size=40).filter(lambda b: b"\n" not in b))
@example([("record", 1), ("twolines", 1), ("record", 2)], b"", b"")
@example([("record", 1), ("upper", 7), ("record", 2)], b"x", b"")
@example([("maxid", 1), ("record", 3)], b"", b"0badc0de:dead_task:x:")
def test_a_run_is_vouched_for_only_when_each_line_decodes_to_the_same_id_and_payload(
        kinds: list[tuple[str, int]], before: bytes, after: bytes) -> None:
    # ``before`` ends a line begun in an older block, ``after`` starts one ending later.
    block = before + b"\n" + b"\n".join(line_of(kind, n) for kind, n in kinds) + b"\n" + after
    lines = block.split(b"\n")[1:-1]
    got = check_run(block)
    exact = [decode_dead_line(line) for line in lines]
    if all(not isinstance(e, BadLine) and e.task_id.isascii() for e in exact) and all(
            b"\0" not in part for part in (before, after)):
        assert got is not None, "a run of clean records must take the fast path"
    if got is not None:
        ids, payloads = got
        assert [(i.decode("ascii"), p) for i, p in zip(ids, payloads, strict=True)] == [
            (e.task_id, e.payload) for e in exact if not isinstance(e, BadLine)]
        assert len(ids) == len(lines)


@pytest.mark.spec("S-40")
def test_a_run_whose_last_newline_starts_a_record_like_fragment_still_ends_there() -> None:
    good = [encode_dead(dead(f"t{i}")) for i in range(3)]
    block = good[0][-10:] + good[1] + good[2][:40]  # the last piece looks like a record head
    got = check_run(block)
    assert got is not None
    assert [i.decode() for i in got[0]] == ["t1"]
    assert b"\n" not in got[1][0]


def read_page(storage: Path, limit: int, offset: int, way: str) -> tuple[list[str], int]:
    handler = DamageLog()
    logging.getLogger("deferq").addHandler(handler)
    store = DeadTaskStore(OS_ENV, str(storage), PREFIX)
    try:
        if way == "index":
            store.list_tasks(None, 0)  # S-11: builds the index
            handler.records.clear()
            tasks = store.list_tasks(limit, offset)
        elif way == "scan":
            tasks = store.list_tasks(limit, offset)
            assert store._index is None
        else:
            tasks = list(store.iter_tasks(offset, limit))  # S-33: limit counts places
    finally:
        store.close()
        logging.getLogger("deferq").removeHandler(handler)
    return [t.id for t in tasks], handler.damage()


@pytest.mark.spec("S-40", "S-6", "S-31", "S-7", "R-@H", "S-83")
@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["record"] * 8 + ["digit", "undecodable", "nul"]),
                          st.integers(0, 400)), min_size=1, max_size=120),
       st.integers(0, 130), st.integers(1, 20))
def test_the_scan_with_runs_returns_what_the_index_returns_at_any_offset(
        kinds: list[tuple[str, int]], offset: int, limit: int) -> None:
    data = b"".join(line_of(kind, n, ids=150) + b"\n" for kind, n in kinds)
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
        mp.setattr(deadstream, "READ_CHUNK_BYTES", 1024)  # several lines per block
        mp.setattr(deadstream, "DEAD_READ_STEP_BYTES", 2048)
        storage = Path(tmp) / "s"
        storage.mkdir()
        (storage / f"{PREFIX}dead_tasks-0").write_bytes(data)
        want = read_page(storage, limit, offset, "index")
        assert read_page(storage, limit, offset, "scan") == want
        assert read_page(storage, limit, offset, "stream")[0] == want[0]


@pytest.mark.spec("S-40", "S-31", "S-84")
def test_a_deep_page_over_clean_records_checks_whole_runs_not_lines(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / f"{PREFIX}dead_tasks-0").write_bytes(
        b"".join(encode_dead(dead(f"t{i}")) for i in range(2000)))
    one_by_one: list[int] = []
    real = deadstream._lines

    def counting(lines: list[bytes | RawLine], clean: bool,
                 tally: deadstream.Tally) -> Iterator[DeadTask]:
        one_by_one.append(len(lines))
        return real(lines, clean, tally)
    monkeypatch.setattr(deadstream, "_lines", counting)
    store = DeadTaskStore(OS_ENV, str(tmp_path), PREFIX)
    try:
        page = store.list_tasks(5, 1900)
    finally:
        store.close()
    assert [t.id for t in page] == [f"t{i}" for i in range(99, 94, -1)]
    # Only the lines that span two blocks and the file's first line go one by one.
    blocks = len(b"".join(encode_dead(dead(f"t{i}")) for i in range(2000))) // 65536 + 1
    assert one_by_one and all(n == 1 for n in one_by_one) and len(one_by_one) <= blocks + 1


@pytest.mark.spec("S-40", "S-6", "R-@H", "S-84")
def test_a_skipped_run_counts_each_new_id_once_and_ids_met_not_at_all(tmp_path: Path) -> None:
    # Newest first: t0..t9 twice (the second time superseded), then ten older ids.
    ids = [f"o{i}" for i in range(10)] + [f"t{i}" for i in range(10)] * 2
    (tmp_path / f"{PREFIX}dead_tasks-0").write_bytes(
        b"".join(encode_dead(dead(i, f"m{n}")) for n, i in enumerate(ids)))
    store = DeadTaskStore(OS_ENV, str(tmp_path), PREFIX)
    try:  # one block, one run of 30 lines: an offset of 30 skips it whole, 12 does not
        assert store.list_tasks(30, 30) == []
        assert [t.id for t in store.list_tasks(3, 12)] == ["o7", "o6", "o5"]
        assert [t.id for t in list(store.iter_tasks(12))][:3] == ["o7", "o6", "o5"]
    finally:
        store.close()
    with pytest.MonkeyPatch.context() as mp:  # runs of a few lines, each skipped whole
        mp.setattr(deadstream, "READ_CHUNK_BYTES", 700)
        store = DeadTaskStore(OS_ENV, str(tmp_path), PREFIX)
        try:
            assert [t.id for t in store.list_tasks(3, 12)] == ["o7", "o6", "o5"]
        finally:
            store.close()
