"""Unit tests of the line splitters, tail repair and WAL replay (src/deferq/_core/recovery.py).

Goal: pin the edge cases of splitting files into lines (empty file, lone newline, no
newline, empty lines, chunk boundaries on newlines, over-long lines R-@E, torn tails
R-@F), where tail repair cuts, and how ``WalReplay`` applies the recovery table
(R-@A..R-@F, R-@I, R-@J). Method: feed hand-made byte strings in chosen chunkings to
``ForwardLines`` and ``BackwardLines`` and compare with the expected ``RawLine`` values;
drive ``WalReplay`` with encoded records and damaged lines and inspect its state.
"""

from __future__ import annotations

import pytest

from deferq._core.deadcodec import encode_dead
from deferq._core.frame import LineFault, frame
from deferq._core.recovery import (
    RECOVERY_TABLE,
    BackwardLines,
    ForwardLines,
    RawLine,
    WalReplay,
    live_fields,
    tail_cut,
)
from deferq._core.types import DeadTask
from deferq._core.walcodec import encode_add, encode_rem


def chunked(data: bytes, size: int) -> list[bytes]:
    return [data[i:i + size] for i in range(0, len(data), size)] or [b""]


def forward(data: bytes, size: int = 4096, *, line_bytes_max: int = 1 << 20,
            start_offset: int = 0) -> list[RawLine]:
    splitter = ForwardLines(start_offset, line_bytes_max)
    out: list[RawLine] = []
    for chunk in chunked(data, size):
        out.extend(splitter.feed(chunk))
    tail = splitter.finish()
    if tail is not None:
        out.append(tail)
    return out


def backward(data: bytes, size: int = 4096, *, line_bytes_max: int = 1 << 20) -> list[RawLine]:
    """Lines newest first, as BackwardLines yields them."""
    splitter = BackwardLines(len(data), line_bytes_max)
    out: list[RawLine] = []
    for chunk in reversed(chunked(data, size)):
        out.extend(splitter.feed(chunk))
    out.extend(splitter.finish())
    return out


def both(data: bytes, size: int = 4096, *, line_bytes_max: int = 1 << 20) -> list[RawLine]:
    """Split forward and backward, check they agree, return the lines in file order."""
    lines = forward(data, size, line_bytes_max=line_bytes_max)
    assert list(reversed(backward(data, size, line_bytes_max=line_bytes_max))) == lines
    return lines


def replay(data: bytes) -> WalReplay:
    state = WalReplay()
    for raw in forward(data, 7):
        state.apply(raw)
    return state


def pending(state: WalReplay) -> list[tuple[str, int | None]]:
    return [(task_id, live_fields(line)[0]) for task_id, line in state.live.items()]


# ----------------------------------------------------------------------------- splitters


@pytest.mark.parametrize("size", [1, 2, 3, 100])
def test_empty_file_has_no_lines(size: int) -> None:
    assert both(b"", size) == []
    assert ForwardLines().finish() is None
    assert BackwardLines(0).finish() == []


def test_a_lone_newline_is_one_empty_complete_line() -> None:
    assert both(b"\n") == [RawLine(0, b"")]


@pytest.mark.spec("R-@F")
@pytest.mark.parametrize("size", [1, 2, 3, 100])
def test_file_without_newline_is_one_torn_tail(size: int) -> None:
    assert both(b"abc", size) == [RawLine(0, b"abc", complete=False)]


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 100])
def test_empty_lines_in_the_middle_are_kept_with_their_offsets(size: int) -> None:
    assert both(b"a\n\n\nbc\n", size) == [
        RawLine(0, b"a"), RawLine(2, b""), RawLine(3, b""), RawLine(4, b"bc")]
    assert both(b"\nab\n", size) == [RawLine(0, b""), RawLine(1, b"ab")]


@pytest.mark.parametrize("size", [1, 2, 3, 4, 6, 9])
def test_chunk_boundaries_at_newlines_split_nothing_wrongly(size: int) -> None:
    data = b"ab\ncd\nef\n"  # with size 3 every chunk ends exactly at a newline
    assert both(data, size) == [RawLine(0, b"ab"), RawLine(3, b"cd"), RawLine(6, b"ef")]


def test_chunks_starting_with_a_newline_are_split_correctly() -> None:
    assert both(b"ab\ncd", 2) == [RawLine(0, b"ab"), RawLine(3, b"cd", complete=False)]


@pytest.mark.spec("R-@F")
def test_torn_tail_follows_the_complete_lines() -> None:
    assert both(b"ab\ncd\nef", 2) == [
        RawLine(0, b"ab"), RawLine(3, b"cd"), RawLine(6, b"ef", complete=False)]


@pytest.mark.spec("R-@F")
def test_zero_fill_tail_is_a_torn_tail() -> None:
    # The splitter hands a hole on as one NUL (R-@K): a torn tail is skipped whatever it holds.
    assert both(b"ab\n\x00\x00\x00", 2) == [RawLine(0, b"ab"), RawLine(3, b"\x00", False)]


def test_forward_offsets_start_at_the_given_offset() -> None:
    assert forward(b"a\nbc", start_offset=100) == [RawLine(100, b"a"), RawLine(102, b"bc", False)]


@pytest.mark.spec("R-@E")
@pytest.mark.parametrize("size", [1, 2, 3, 5, 100])
def test_line_longer_than_the_limit_is_marked_over_long(size: int) -> None:
    data = b"abcd\nabcde\nxy\n"
    assert both(data, size, line_bytes_max=4) == [
        RawLine(0, b"abcd"), RawLine(5, None), RawLine(11, b"xy")]


@pytest.mark.spec("R-@E", "R-@F")
@pytest.mark.parametrize("size", [1, 2, 3, 100])
def test_over_long_torn_tail_is_torn_without_data(size: int) -> None:
    assert both(b"ab\n" + b"x" * 9, size, line_bytes_max=4) == [
        RawLine(0, b"ab"), RawLine(3, None, complete=False)]


@pytest.mark.spec("R-@E")
def test_over_long_lines_hold_no_more_than_the_limit() -> None:
    # D-14's bound: an over-long line's bytes are dropped as soon as they pass the limit.
    splitter = ForwardLines(0, 4)
    assert splitter.feed(b"x" * 3) == []
    assert splitter.feed(b"x" * 1000) == []
    assert splitter._lines._parts == []  # noqa: SLF001 - the bound is internal state by nature
    assert splitter.feed(b"x\nok\n") == [RawLine(0, None), RawLine(1005, b"ok")]


def test_backward_finish_before_the_start_of_the_file_is_a_programmer_error() -> None:
    splitter = BackwardLines(10)
    splitter.feed(b"abc\n")
    with pytest.raises(AssertionError):
        splitter.finish()


# ----------------------------------------------------------------------------- tail repair


@pytest.mark.spec("R-@F")
@pytest.mark.parametrize(("chunk", "offset", "cut"), [
    (b"ab\ncd", 0, 3),
    (b"ab\ncd\n", 0, 6),
    (b"ab\ncd\n", 100, 106),
    (b"\n", 7, 8),
    (b"\x00\x00", 0, None),
    (b"", 0, None),
    (b"abc", 50, None),
])
def test_tail_cut_is_just_after_the_last_newline_of_the_chunk(
        chunk: bytes, offset: int, cut: int | None) -> None:
    assert tail_cut(chunk, offset) == cut


# ----------------------------------------------------------------------------- WAL replay


def test_recovery_table_has_the_labels_of_the_spec_in_order() -> None:
    assert [rule.label for rule in RECOVERY_TABLE] == [f"R-@{c}" for c in "ABCDEFGHIJKL"]
    labels = {rule.label for rule in RECOVERY_TABLE}
    assert {fault.value for fault in LineFault} <= labels


@pytest.mark.spec("R-@A")
def test_replay_applies_valid_add_and_rem_records_in_order() -> None:
    data = encode_add("a", None, b"1") + encode_add("b", 5, b"2") + encode_rem("a")
    state = replay(data)
    assert pending(state) == [("b", 5)]
    assert state.live["b"] == encode_add("b", 5, b"2")
    assert live_fields(state.live["b"]) == (5, b"2")
    assert state.records == 3 and state.faults == {} and state.corrupt == 0


@pytest.mark.spec("R-@I")
def test_rem_of_an_unknown_id_is_a_no_op() -> None:
    state = WalReplay()
    assert state.apply(RawLine(0, encode_add("a", None, b"")[:-1]))
    assert state.apply(RawLine(0, encode_rem("zzz")[:-1]))  # a valid record, applied as a no-op
    assert pending(state) == [("a", None)]
    assert state.records == 2 and state.corrupt == 0


@pytest.mark.spec("R-@I")
def test_rem_of_an_already_removed_id_is_a_no_op() -> None:
    state = replay(encode_add("a", None, b"") + encode_rem("a") + encode_rem("a"))
    assert pending(state) == [] and state.records == 3


@pytest.mark.spec("R-@J")
def test_re_add_replaces_the_task_and_keeps_its_position() -> None:
    data = (encode_add("a", None, b"old") + encode_add("b", None, b"")
            + encode_add("a", 9, b"new"))
    state = replay(data)
    assert pending(state) == [("a", 9), ("b", None)]
    assert state.live["a"] == encode_add("a", 9, b"new")


@pytest.mark.spec("R-@J", "R-@A")
def test_add_after_rem_goes_to_the_end() -> None:
    data = (encode_add("a", None, b"") + encode_add("b", None, b"") + encode_rem("a")
            + encode_add("a", None, b""))
    assert [task_id for task_id, _ in pending(replay(data))] == ["b", "a"]


@pytest.mark.spec("W-28")
def test_seed_max_counts_only_valid_records() -> None:
    # Valid add and rem records count (rotation writes a rem marker carrying the seed);
    # damaged, over-long and torn lines never do.
    damaged = bytearray(encode_add("9000000000-1-1", None, b""))
    damaged[12] ^= 1
    data = (encode_add("1700000000-1-1", None, b"") + encode_add("x-1", None, b"")
            + bytes(damaged) + encode_add("1600000000-1-1", None, b"")
            + encode_add("7000000000-1-1", None, b"")[:-1])  # torn: does not count
    assert replay(data).seed_max == 1700000000
    marker = encode_rem("1800000000-1-0")  # a rem of an unknown id: a no-op, but its seed counts
    assert replay(encode_add("1700000000-1-1", None, b"") + marker).seed_max == 1800000000
    state = WalReplay()
    state.apply(RawLine(0, None))
    state.apply(RawLine(0, b"99999999999-1-1"))
    assert state.seed_max == 0


@pytest.mark.spec("R-@B", "R-@C", "R-@D", "R-@E", "R-@F")
def test_faults_are_counted_by_kind_and_skipped() -> None:
    crc_bad = bytearray(encode_add("c", None, b""))
    crc_bad[-2] ^= 0x20
    dead = encode_dead(DeadTask(id="d", task_class="T", attempts=0, enqueued_at=0, failed_at=0,
                                exception_class="E", exception_message="", backtrace=(),
                                context=b""))
    state = WalReplay()
    lines = [
        RawLine(0, encode_add("a", None, b"")[:-1]),
        RawLine(0, b"not a record"),  # R-@B
        RawLine(0, b""),  # R-@B
        RawLine(0, bytes(crc_bad)[:-1]),  # R-@C
        RawLine(0, dead[:-1]),  # R-@D: a dead-task body in a WAL
        RawLine(0, frame(b"add:x:01:")[:-1]),  # R-@D
        RawLine(0, None),  # R-@E
        RawLine(0, encode_add("b", None, b"")[:-1]),
        RawLine(0, encode_add("t", None, b"")[:-1], complete=False),  # R-@F
    ]
    results = [state.apply(raw) is not None for raw in lines]
    assert results == [True, False, False, False, False, False, False, True, False]
    assert state.faults == {
        LineFault.BAD_HEADER: 2, LineFault.CRC_MISMATCH: 1, LineFault.BAD_BODY: 2,
        LineFault.OVERLONG: 1, LineFault.TORN_TAIL: 1}
    assert state.corrupt == 7 and state.records == 2
    assert pending(state) == [("a", None), ("b", None)]


@pytest.mark.spec("R-@E", "R-@F")
def test_over_long_torn_tail_counts_as_torn() -> None:
    state = WalReplay()
    assert not state.apply(RawLine(0, None, complete=False))
    assert state.faults == {LineFault.TORN_TAIL: 1}


@pytest.mark.spec("R-@F")
def test_a_complete_record_torn_only_of_its_newline_is_dropped() -> None:
    state = replay(encode_add("a", None, b"") + encode_add("b", None, b"")[:-1])
    assert pending(state) == [("a", None)]
    assert state.faults == {LineFault.TORN_TAIL: 1}


@pytest.mark.spec("D-5", "R-@C")
def test_a_damaged_record_does_not_hide_the_records_around_it() -> None:
    middle = bytearray(encode_add("b", None, b"payload"))
    middle[15] ^= 0xFF
    data = encode_add("a", None, b"") + bytes(middle) + encode_add("c", None, b"")
    state = replay(data)
    assert [task_id for task_id, _ in pending(state)] == ["a", "c"]
    assert state.corrupt == 1


@pytest.mark.spec("R-@K", "D-5")
def test_a_zero_filled_hole_glued_before_a_record_is_cut_and_the_record_is_read() -> None:
    state = WalReplay()
    record = encode_add("a", None, b"x")[:-1]
    assert state.apply(RawLine(0, b"\0" * 23 + record)) == record
    assert state.apply(RawLine(0, b"\0" * 5)) is None  # a hole and nothing after it
    assert state.apply(RawLine(0, b"junk\0" + b"not a record")) is None  # hole, then R-@B
    assert state.faults == {LineFault.NUL_HOLE: 3, LineFault.BAD_HEADER: 1}
    assert pending(state) == [("a", None)]
