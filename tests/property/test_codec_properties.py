"""Property tests of the record codec (src/deferq/_core/: frame, walcodec, deadcodec, names;
F-3, F-4, F-6, F-7, F-10, F-11).

Goal: the codec is a bijection on valid records, and damage to a valid line is never read
as a valid record. Method: Hypothesis draws arbitrary valid ids, contexts, publish times
and dead-task fields; we check decode(encode(x)) == x, then flip every bit and change every
byte (by a drawn amount) of the encoded line, and cut it at every length, and run each
damaged result through the real reader path (``ForwardLines`` + decoder). CRC-32 detects
every error burst of at most 32 bits in the body, and any change to the header breaks
either its syntax or its value, so no single-byte damage can survive.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deferq._core.deadcodec import (
    DeadLine,
    dead_problem,
    decode_dead_line,
    decode_dead_payload,
    encode_dead,
)
from deferq._core.frame import BadLine
from deferq._core.limits import TASK_ID_BYTES_MAX
from deferq._core.names import (
    dead_data_name,
    dead_lock_name,
    dead_tmp_name,
    is_wal_file_name,
    wal_file_name,
)
from deferq._core.walcodec import WalAdd, WalRem, decode_wal_line, encode_add, encode_rem
from deferq.backends._options import check_prefix
from deferq._core.recovery import ForwardLines, WalReplay
from deferq._core.types import DeadTask

Record = WalAdd | WalRem | DeadTask

# Valid ids: UTF-8 encodable (no surrogates), no ':', newline or NUL, 1..256 bytes.
ID_CHARS = st.characters(codec="utf-8", exclude_characters=":\n\x00")
task_ids = st.one_of(
    st.text(ID_CHARS, min_size=1, max_size=TASK_ID_BYTES_MAX // 4),
    st.text(st.characters(codec="ascii", exclude_characters=":\n\x00"),
            min_size=TASK_ID_BYTES_MAX - 2, max_size=TASK_ID_BYTES_MAX),
    st.builds(lambda seed, pid, n: f"{seed}-{pid}-{n}", st.integers(0, 10**12),
              st.integers(1, 2**22), st.integers(1, 10**6)),
)
contexts = st.binary(max_size=32)
publish_ats = st.none() | st.integers(1, 2**63 - 1)
# Text fields: any characters except surrogates (refused by F-17, see the last test).
texts = st.text(st.characters(codec="utf-8"), max_size=24)
wal_records = st.one_of(
    st.builds(WalAdd, task_ids, publish_ats, contexts),
    st.builds(WalRem, task_ids),
)
dead_tasks = st.builds(
    DeadTask,
    id=task_ids,
    task_class=st.text(st.characters(codec="utf-8"), min_size=1, max_size=24),
    attempts=st.integers(0, 2**63 - 1),
    enqueued_at=st.integers(0, 2**63 - 1),
    failed_at=st.integers(0, 2**40),
    exception_class=texts,
    exception_message=texts,
    backtrace=st.lists(texts, max_size=3).map(tuple),
    context=contexts,
)
records: st.SearchStrategy[Record] = st.one_of(wal_records, dead_tasks)


def encode(record: Record) -> bytes:
    if isinstance(record, WalAdd):
        return encode_add(record.task_id, record.publish_at, record.context)
    if isinstance(record, WalRem):
        return encode_rem(record.task_id)
    return encode_dead(record)


def decode_line(line: bytes, dead: bool) -> Record | BadLine:
    """Decode one line (without its newline) as its file's reader does."""
    if not dead:
        return decode_wal_line(line)
    framed = decode_dead_line(line)
    return framed if isinstance(framed, BadLine) else decode_dead_payload(framed)


def valid_records(data: bytes, dead: bool) -> list[Record]:
    """Every valid record a reader finds in ``data`` (complete lines only; R-@F)."""
    splitter = ForwardLines()
    found: list[Record] = []
    for raw in splitter.feed(data):
        if raw.data is not None:
            decoded = decode_line(raw.data, dead)
            if not isinstance(decoded, BadLine):
                found.append(decoded)
    return found


def check_round_trip(record: Record) -> bytes:
    line = encode(record)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert decode_line(line[:-1], isinstance(record, DeadTask)) == record
    return line


@pytest.mark.slow
@pytest.mark.spec("F-6", "F-7", "F-2")
@given(wal_records)
def test_wal_records_round_trip(record: WalAdd | WalRem) -> None:
    check_round_trip(record)


@pytest.mark.slow
@pytest.mark.spec("F-10", "F-11")
@given(dead_tasks)
def test_dead_records_round_trip(task: DeadTask) -> None:
    line = check_round_trip(task)
    assert line.split(b":", 3)[3].isascii()  # the JSON after crc, op and id


@pytest.mark.slow
@pytest.mark.spec("F-3", "F-4", "R-@B", "R-@C")
@given(records, st.integers(1, 255))
def test_every_single_bit_flip_and_byte_change_is_detected(record: Record, delta: int) -> None:
    line = encode(record)
    dead = isinstance(record, DeadTask)
    for index in range(len(line)):
        for mask in (1 << (index % 8), delta):
            damaged = bytearray(line)
            damaged[index] ^= mask
            assert valid_records(bytes(damaged), dead) == [], (index, mask)


@pytest.mark.slow
@pytest.mark.spec("F-4", "R-@F")
@given(records)
def test_truncating_a_valid_line_never_yields_a_valid_record(record: Record) -> None:
    line = encode(record)
    dead = isinstance(record, DeadTask)
    for length in range(len(line)):
        cut = line[:length]
        # As a torn tail (no newline): never a record, always counted torn.
        assert valid_records(cut, dead) == []
        # Even if a later write supplied a newline, the cut line is not a record.
        assert isinstance(decode_line(cut, dead), BadLine) or length == len(line) - 1, length
        if not dead and length:
            state = WalReplay()
            splitter = ForwardLines()
            for raw in splitter.feed(cut):
                state.apply(raw)
            tail = splitter.finish()
            assert tail is not None and not state.apply(tail)
            assert state.records == 0 and state.live == {}


@pytest.mark.spec("F-4", "R-@C", "R-@B")
@pytest.mark.parametrize("record", [
    WalAdd("t-1", 17, b"\x00a"),
    WalRem("\u00e9x"),
    pytest.param(DeadTask(id="1-2-3", task_class="T", attempts=1, enqueued_at=1, failed_at=2,
                          exception_class="E", exception_message="m", backtrace=("f:1:in g",),
                          context=b"c"), marks=pytest.mark.slow),
])
def test_every_possible_single_byte_change_of_a_small_line_is_detected(record: Record) -> None:
    line = encode(record)
    dead = isinstance(record, DeadTask)
    for index in range(len(line)):
        for value in range(256):
            if value != line[index]:
                damaged = line[:index] + bytes([value]) + line[index + 1:]
                assert valid_records(damaged, dead) == [], (index, value)


def normalized_prefix(text: str) -> str | None:
    try:
        return check_prefix(text)
    except ValueError:
        return None


prefixes = st.text(st.sampled_from("ab0-._x\u00e9 "), min_size=1, max_size=10).map(
    normalized_prefix).filter(lambda prefix: prefix is not None).map(str)


@pytest.mark.slow
@pytest.mark.spec("F-1", "F-9")
@given(prefixes, prefixes, st.integers(0, 10**8 - 1), st.integers(0, 10**10 - 1),
       st.integers(0, 2**32 - 1))
def test_file_names_of_one_prefix_are_never_claimed_by_another(
        prefix: str, other: str, date: int, pid: int, rand: int) -> None:
    name = wal_file_name(prefix, f"{date:08d}", pid, rand)
    assert is_wal_file_name(prefix, name)
    assert is_wal_file_name(other, name) == (other == prefix)
    for dead_name in (dead_data_name(prefix), dead_lock_name(prefix), dead_tmp_name(prefix)):
        assert not is_wal_file_name(prefix, dead_name)
        assert not is_wal_file_name(other, dead_name)


@pytest.mark.spec("F-11", "F-17")
def test_text_with_lone_surrogates_is_refused_by_the_codec_limits() -> None:
    """JSON would join a lone high and low surrogate into one character on decode, so the
    format refuses text that is not UTF-8 encodable (the backend escapes it first)."""
    task = DeadTask(id="a", task_class="T", attempts=0, enqueued_at=0, failed_at=0,
                    exception_class="E", exception_message="\ud83d\ude00",
                    backtrace=(), context=b"")
    assert dead_problem(task) == "text fields must be encodable as UTF-8 (no lone surrogates)"


def _reference_decode_payload(line: DeadLine) -> DeadTask | BadLine:
    """The payload decoder as first written (``json.loads``, a hook per call), refusing a BOM
    (F-31: ``json.loads`` of a ``str`` does) and signed integers (F-32)."""
    import json

    from deferq._core import frame as _frame

    def unique(pairs: list[tuple[str, object]]) -> dict[str, object]:
        obj = dict(pairs)
        if len(obj) != len(pairs):
            raise ValueError("duplicate key")
        return obj

    def natural(text: str) -> int:
        if text.startswith("-"):
            raise ValueError("signed")
        return int(text)

    try:
        obj: object = json.loads(line.payload.decode("utf-8", "surrogatepass"),
                                 object_pairs_hook=unique, parse_int=natural)
    except (ValueError, RecursionError):
        return BadLine(_frame.LineFault.BAD_DEAD_PAYLOAD)
    # From here both decoders share the field checks: feed the parsed object back as
    # canonical JSON through the real decoder.
    return decode_dead_payload(DeadLine(line.task_id, json.dumps(obj).encode("utf-8")))


_PAYLOAD_PIECES = st.sampled_from([
    b"\xef\xbb\xbf", b"{", b"}", b'"id"', b":", b",", b'"a"', b"1", b"[", b"]", b"\xed\xa0\x80",
    b"\xc3\xa9", b"\\ud800", b" ", b'"context"', b"null", b"\xff", b"-0", b"-",
])


@pytest.mark.spec("F-11", "F-31", "F-32", "R-@G")
@given(task=dead_tasks, pieces=st.lists(_PAYLOAD_PIECES, max_size=12), cut=st.integers(0, 40),
       prefix_bom=st.booleans())
def test_payload_decoder_accepts_and_refuses_exactly_what_json_loads_of_the_bytes_does(
        task: DeadTask, pieces: list[bytes], cut: int, prefix_bom: bool) -> None:
    framed = decode_dead_line(encode_dead(task)[:-1])
    assert isinstance(framed, DeadLine)
    payloads = [framed.payload, b"".join(pieces),
                framed.payload[:cut] + b"".join(pieces) + framed.payload[cut:]]
    for payload in payloads:
        if prefix_bom:
            payload = b"\xef\xbb\xbf" + payload
        line = DeadLine(framed.task_id, payload)
        assert decode_dead_payload(line) == _reference_decode_payload(line)
