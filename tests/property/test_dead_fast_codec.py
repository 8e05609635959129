"""Property tests of the dead-task codec's fast paths against their definitions.

Goal: the fast paths taken on every dead-task add and read give exactly the answers of the
step-by-step code they stand in for (F-10, F-11, F-17, R-@G): ``encode_dead`` writes the
bytes of ``json.dumps``; ``decode_dead_record``'s fast decoder either declines or returns
what the exact decoder returns, for valid records and for every kind of damaged or
non-canonical payload; the canonical base64 check equals decode-and-re-encode;
``dead_task_of`` builds the same value as the keyword constructor; and the index's record
reader refuses a record whose bytes changed in place, so the read falls back to the scan
(S-10). Method: Hypothesis draws valid tasks (any text, ids, sizes) and payloads built
from them by splicing JSON fragments, flipping bytes and re-encoding variants.
"""

from __future__ import annotations

import binascii
import dataclasses
import json
import logging
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deferq._engine.deadindex import DeadIndex, RecordReader, StaleIndex
from deferq._core.b64 import canonical_base64_decode, decode_base64
from deferq._core.deadcodec import (
    DeadLine,
    _decode_dead_exact,
    _decode_dead_fast,
    _encode_dead_json,
    decode_dead_line,
    decode_dead_payload,
    decode_dead_record,
    encode_dead,
)
from deferq._core.frame import BadLine
from deferq._core.limits import (
    BACKTRACE_FRAME_CHARS_MAX,
    BACKTRACE_FRAMES_MAX,
    TASK_CLASS_BYTES_MAX,
)
from deferq._engine.osenv import OS_ENV
from deferq._core.types import DeadTask, dead_task_of
from deferq.backends import Disk
from tests.property.test_codec_properties import dead_tasks, task_ids

ASCII = st.characters(codec="ascii")
ascii_tasks = st.builds(
    DeadTask,
    id=st.text(st.characters(codec="ascii", exclude_characters=":\n\x00"), min_size=1,
               max_size=40),
    task_class=st.text(ASCII, min_size=1, max_size=24),
    attempts=st.integers(0, 2**63 - 1),
    enqueued_at=st.integers(0, 10**12 - 1),
    failed_at=st.integers(0, 2**40),
    exception_class=st.text(ASCII, max_size=24),
    exception_message=st.text(ASCII, max_size=40),
    backtrace=st.lists(st.text(ASCII, max_size=24), max_size=4).map(tuple),
    context=st.binary(max_size=40),
)
any_tasks = st.one_of(dead_tasks, ascii_tasks)

_FRAGMENTS = st.sampled_from([
    b"{", b"}", b"[", b"]", b"{}", b"[]", b":", b",", b'"', b"\\", b"\\u00e9", b"\\ud800",
    b"\\n", b" ", b"\t", b"\xef\xbb\xbf", b"\xc3\xa9", b"\xff", b"\x00", b"\x1f", b"1.0",
    b"1e3", b"-1", b"-0", b"01", b"true", b"null", b'"id"', b'"backtrace"', b'"context"',
    b'"x"', b'"QQ=="', b'"QR=="', b"0" * 30, b'"attempts":1,',
])


def payload_of(task: DeadTask) -> DeadLine:
    framed = decode_dead_line(encode_dead(task)[:-1])
    assert isinstance(framed, DeadLine)
    return framed


def agree(task_id: str, payload: bytes) -> None:
    """The fast decoder declines or agrees; the public decoder always equals the exact one."""
    exact = _decode_dead_exact(DeadLine(task_id, payload))
    fast = _decode_dead_fast(task_id, payload)
    assert fast is None or fast == exact, (payload, fast, exact)
    assert decode_dead_record(task_id, payload) == exact
    assert decode_dead_payload(DeadLine(task_id, payload)) == exact


@pytest.mark.spec("F-10")
@given(any_tasks, st.booleans())
def test_encode_dead_writes_exactly_the_bytes_of_json_dumps(task: DeadTask,
                                                            as_bool: bool) -> None:
    assert encode_dead(task) == _encode_dead_json(task)
    # Not exactly int (bool, a subclass): encode_dead hands the task to json.dumps.
    odd = dataclasses.replace(task, attempts=as_bool)
    assert encode_dead(odd) == _encode_dead_json(odd)


@pytest.mark.spec("F-11", "F-17", "R-@G")
@given(any_tasks)
def test_the_fast_decoder_takes_every_ascii_record_and_agrees_with_the_exact_one(
        task: DeadTask) -> None:
    framed = payload_of(task)
    assert decode_dead_record(framed.task_id, framed.payload) == task
    agree(framed.task_id, framed.payload)
    texts = (task.id, task.task_class, task.exception_class, task.exception_message,
             *task.backtrace)
    if all(text.isascii() for text in texts):
        assert _decode_dead_fast(framed.task_id, framed.payload) == task  # the fast path ran


@pytest.mark.spec("F-11", "R-@G")
@given(task=any_tasks, pieces=st.lists(_FRAGMENTS, max_size=6), cut=st.integers(0, 400),
       flip=st.integers(0, 10**6), value=st.integers(0, 255), other_id=task_ids)
def test_the_fast_decoder_never_accepts_what_the_exact_one_refuses_or_reads_differently(
        task: DeadTask, pieces: list[bytes], cut: int, flip: int, value: int,
        other_id: str) -> None:
    payload = payload_of(task).payload
    spliced = payload[:cut] + b"".join(pieces) + payload[cut:]
    flipped = bytearray(payload)
    flipped[flip % len(flipped)] = value
    for variant in (spliced, bytes(flipped), b"".join(pieces), payload + b" ",
                    b" " + payload, payload.replace(b",", b", ", 1),
                    payload.replace(b'{"id"', b'{"id":"x","id"', 1)):
        agree(task.id, variant)
    agree(other_id, payload)  # the JSON id is not the line's


@pytest.mark.spec("F-11", "F-17", "R-@G")
@pytest.mark.parametrize("field, value", [
    ("task_class", ""), ("task_class", "c" * (TASK_CLASS_BYTES_MAX + 1)),
    ("attempts", -1), ("enqueued_at", -5), ("failed_at", -1),
    ("backtrace", ["f"] * (BACKTRACE_FRAMES_MAX + 1)),
    ("backtrace", ["f" * (BACKTRACE_FRAME_CHARS_MAX + 1)]),
    ("backtrace", {}), ("backtrace", [{}]), ("backtrace", "frame"), ("attempts", 1.0),
    ("attempts", True), ("id", "b"), ("context", "QR=="), ("context", "QQ"),
    ("exception_message", "\ud800"),
])
def test_each_out_of_limit_or_mistyped_field_is_refused_by_both_decoders(
        field: str, value: object) -> None:
    task = DeadTask(id="a", task_class="job.T", attempts=1, enqueued_at=0, failed_at=1,
                    exception_class="E", exception_message="m", backtrace=("f",),
                    context=b"ctx")
    obj = json.loads(payload_of(task).payload)
    obj[field] = value
    payload = json.dumps(obj, separators=(",", ":")).encode()
    agree("a", payload)
    assert isinstance(decode_dead_record("a", payload), BadLine)


def _mutated_base64(data: bytes, at: int, value: int) -> bytes:
    raw = bytearray(binascii.b2a_base64(data, newline=False))
    raw[at % len(raw)] = value
    return bytes(raw)


@pytest.mark.spec("F-6", "F-11")
@given(st.one_of(st.binary(max_size=16),
                 st.binary(max_size=12).map(lambda b: binascii.b2a_base64(b, newline=False)),
                 st.builds(_mutated_base64, st.binary(min_size=1, max_size=12),
                           st.integers(0, 100), st.integers(0, 255))))
def test_the_canonical_base64_check_equals_decoding_and_re_encoding(raw: bytes) -> None:
    assert canonical_base64_decode(raw) == decode_base64(raw)


@pytest.mark.spec("F-10")
@given(any_tasks)
def test_dead_task_of_builds_the_same_immutable_value_as_the_constructor(
        task: DeadTask) -> None:
    built = dead_task_of(task.id, task.task_class, task.attempts, task.enqueued_at,
                         task.failed_at, task.exception_class, task.exception_message,
                         task.backtrace, task.context)
    assert type(built) is DeadTask
    assert built == task and hash(built) == hash(task) and repr(built) == repr(task)
    assert dataclasses.astuple(built) == dataclasses.astuple(task)
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.attempts = 0  # type: ignore[misc]


# ----------------------------------------------------------------------------- the record reader


def _dead(n: int) -> DeadTask:
    return DeadTask(id=f"t-{n}", task_class="job.T", attempts=1, enqueued_at=0,
                    failed_at=1, exception_class="E", exception_message="m" * n,
                    backtrace=("f",), context=bytes([n % 256]))


@pytest.mark.spec("S-10", "S-11", "S-48", "S-51")
@settings(max_examples=40, deadline=None)
@given(count=st.integers(1, 30), victim=st.integers(0, 10**6), at=st.integers(0, 10**6),
       value=st.integers(0, 255), ahead=st.integers(1, 40))
def test_the_record_reader_returns_each_payload_or_refuses_a_record_changed_in_place(
        tmp_path_factory: pytest.TempPathFactory, count: int, victim: int, at: int,
        value: int, ahead: int) -> None:
    path = tmp_path_factory.mktemp("reader") / "data"
    lines = [encode_dead(_dead(n)) for n in range(count)]
    path.write_bytes(b"".join(lines))
    fd = os.open(path, os.O_RDWR)
    try:
        stat = OS_ENV.fstat(fd)
        index = DeadIndex(stat, 0)
        index.extend(OS_ENV, fd, stat.size)
        victim %= count
        start = sum(map(len, lines[:victim]))
        line = lines[victim]
        changed = bytearray(line)
        changed[at % (len(line) - 1)] = value  # never the newline: lengths stay indexed
        os.pwrite(fd, bytes(changed), start)
        reader = RecordReader(index, OS_ENV, fd)
        for position in range(count - 1, -1, -1):
            want = decode_dead_line(lines[position][:-1])
            assert isinstance(want, DeadLine)
            now = decode_dead_line(bytes(changed)[:-1]) if position == victim else want
            if isinstance(now, DeadLine) and now.task_id == want.task_id:
                assert reader.read(position, ahead) == now.payload
            else:
                with pytest.raises(StaleIndex):
                    reader.read(position, ahead)
    finally:
        os.close(fd)


@pytest.mark.spec("S-10", "S-11", "S-7", "S-48", "S-51")
def test_a_listed_record_damaged_in_place_makes_the_list_fall_back_to_the_scan(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with Disk(path=str(tmp_path), fsync_frequency=0) as disk:
        for n in range(20):
            disk._dead.add(_dead(n))
        assert len(disk.list_dead_tasks()) == 20  # builds the index
        assert disk._dead._index is not None
        data = tmp_path / "deferred-dead_tasks-0"
        raw = bytearray(data.read_bytes())
        newest = raw.rindex(b"dead_task:t-18:")
        raw[newest + 30] ^= 0x01  # a flipped bit in the second newest record
        with open(data, "r+b") as out:
            out.write(raw)
        with caplog.at_level(logging.WARNING, logger="deferq"):
            page = disk.list_dead_tasks(limit=3)
        assert [task.id for task in page] == ["t-19", "t-17", "t-16"]
        assert disk._dead._index is None  # dropped (S-10), then the scan answered
        assert "Detected 1 corrupted" in caplog.text
