"""Property tests of the line splitters and of WAL replay over prefixes (src/deferq/_core/recovery.py).

Goal: ``ForwardLines`` and ``BackwardLines`` split any file the way ``bytes.split(b"\\n")``
does, whatever the chunking, and a WAL cut anywhere (a crash mid-append, A-5) replays to
the state of a prefix of its records: the torn last record is dropped, never misread
(R-@F). Method: Hypothesis draws byte files biased toward newlines, chunk boundaries and a
small line limit; the expected lines come from ``bytes.split``. For logs it draws add/rem
records over a few ids, encodes them, and replays every prefix (plus optional zero fill)
against a plain list-based model of the pending set.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deferq._core.frame import LineFault
from deferq._core.recovery import (
    BackwardLines,
    ChunkLines,
    ForwardLines,
    RawLine,
    WalReplay,
    capped_line,
    line_body,
    live_fields,
)
from deferq._core.taskid import id_seed
from deferq._core.walcodec import encode_add, encode_rem

files = st.one_of(
    st.binary(max_size=64),
    st.lists(st.sampled_from([b"\n", b"a", b"bc", b"\x00", b"defgh", b"\n\n"]),
             max_size=24).map(b"".join),
)
line_limits = st.one_of(st.integers(0, 8), st.just(1 << 20))


def seen(lines: list[RawLine]) -> list[tuple[int, bool, object]]:
    """What a reader makes of each line (``line_body``): a splitter may hand a zero-filled
    hole on as one NUL (R-@K), so lines compare by outcome, not by their bytes."""
    return [(raw.offset, raw.complete, line_body(raw)) for raw in lines]


def expected_lines(data: bytes, line_bytes_max: int) -> list[RawLine]:
    """The lines of ``data`` by ``bytes.split``: all complete but the non-empty last piece,
    each cut at its last NUL before its length is checked (R-@K before R-@E)."""
    pieces = data.split(b"\n")
    out: list[RawLine] = []
    offset = 0
    for index, piece in enumerate(pieces):
        last = index == len(pieces) - 1
        if last and not piece:
            break
        out.append(RawLine(offset, piece, complete=False) if last
                   else capped_line(offset, piece, line_bytes_max))
        offset += len(piece) + 1
    return out


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *sorted(cuts), len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:])]


@st.composite
def chunked_files(draw: st.DrawFn) -> tuple[bytes, list[bytes]]:
    data = draw(files)
    cuts = draw(st.lists(st.integers(0, len(data)), max_size=8))
    return data, split_at(data, cuts)


def forward(chunks: list[bytes], line_bytes_max: int, start: int = 0) -> list[RawLine]:
    splitter = ForwardLines(start, line_bytes_max)
    out = [raw for chunk in chunks for raw in splitter.feed(chunk)]
    tail = splitter.finish()
    return out if tail is None else [*out, tail]


def chunk_lines(chunks: list[bytes], line_bytes_max: int, start: int = 0) -> list[RawLine]:
    """The lines ``ChunkLines`` hands a fast path: the spanning line, then the chunk's own
    lines (over-long ones as None, as a fast path checks them), then the torn tail."""
    splitter = ChunkLines(start, line_bytes_max)
    out: list[RawLine] = []
    for chunk in chunks:
        base = splitter.offset
        pos, end, spanning = splitter.feed(chunk)
        assert splitter.offset == base + len(chunk)
        assert 0 <= pos <= end <= len(chunk) and (end == 0 or chunk[end - 1:end] == b"\n")
        assert b"\n" not in chunk[end:]
        if spanning is not None:
            out.append(spanning)
        while pos < end:
            newline = chunk.index(b"\n", pos)
            piece = chunk[pos:newline]
            out.append(capped_line(base + pos, piece, line_bytes_max))
            pos = newline + 1
    if splitter.torn:
        # A fast path only counts the tail: its offset is where the held line starts.
        out.append(RawLine(splitter.line_start, None, complete=False))
    return out


def backward(chunks: list[bytes], line_bytes_max: int) -> list[RawLine]:
    splitter = BackwardLines(sum(map(len, chunks)), line_bytes_max)
    out = [raw for chunk in reversed(chunks) for raw in splitter.feed(chunk)]
    return out + splitter.finish()


@pytest.mark.spec("R-@E", "R-@F", "R-@K")
@given(chunked_files(), line_limits, st.integers(0, 1000))
def test_chunk_lines_hand_the_fast_paths_the_lines_of_bytes_split(
        file: tuple[bytes, list[bytes]], line_bytes_max: int, start: int) -> None:
    """Every complete line once, in order, at its offset, over-long ones without data; the
    torn tail reported (its bytes are never needed: every fast path only counts it)."""
    data, chunks = file
    want = [RawLine(start + raw.offset, raw.data if raw.complete else None, raw.complete,
                    raw.holed) for raw in expected_lines(data, line_bytes_max)]
    assert seen(chunk_lines(chunks, line_bytes_max, start)) == seen(want)


@pytest.mark.slow
@pytest.mark.spec("R-@E", "R-@F")
@given(chunked_files(), line_limits)
def test_forward_lines_split_like_bytes_split(file: tuple[bytes, list[bytes]],
                                              line_bytes_max: int) -> None:
    data, chunks = file
    assert seen(forward(chunks, line_bytes_max)) == seen(expected_lines(data, line_bytes_max))


@pytest.mark.slow
@pytest.mark.spec("R-@E", "R-@F")
@given(chunked_files(), line_limits)
def test_backward_lines_are_the_forward_lines_reversed(file: tuple[bytes, list[bytes]],
                                                       line_bytes_max: int) -> None:
    data, chunks = file
    assert seen(backward(chunks, line_bytes_max)) == seen(expected_lines(data, line_bytes_max)[::-1])


@pytest.mark.slow
@given(chunked_files(), st.integers(0, 10**9))
def test_forward_offsets_shift_by_the_start_offset(file: tuple[bytes, list[bytes]],
                                                   start: int) -> None:
    data, chunks = file
    shifted = [RawLine(raw.offset + start, raw.data, raw.complete, raw.holed)
               for raw in expected_lines(data, 1 << 20)]
    assert seen(forward(chunks, 1 << 20, start)) == seen(shifted)


# ----------------------------------------------------------------------------- prefixes of a log

IDS = ("a", "b", "c", "1700000000-1-1", "1800000000-2-5", "\u00e9")
ops = st.one_of(
    st.tuples(st.just("add"), st.sampled_from(IDS), st.none() | st.integers(1, 10**6),
              st.binary(max_size=6)),
    st.tuples(st.just("rem"), st.sampled_from(IDS), st.none(), st.just(b"")),
)
Op = tuple[str, str, int | None, bytes]


def encode_op(op: Op) -> bytes:
    kind, task_id, publish_at, context = op
    return encode_add(task_id, publish_at, context) if kind == "add" else encode_rem(task_id)


def model_state(applied: list[Op]) -> list[tuple[str, int | None, bytes]]:
    """Pending tasks in order: a re-add replaces in place (R-@J), a rem of a stranger is a no-op."""
    pending: list[tuple[str, int | None, bytes]] = []
    for kind, task_id, publish_at, context in applied:
        index = next((i for i, task in enumerate(pending) if task[0] == task_id), None)
        if kind == "rem":
            if index is not None:
                del pending[index]
        elif index is None:
            pending.append((task_id, publish_at, context))
        else:
            pending[index] = (task_id, publish_at, context)
    return pending


@pytest.mark.slow
@pytest.mark.spec("R-@F", "R-@I", "R-@J", "D-4")
@given(st.lists(ops, max_size=6), st.integers(0, 12), st.integers(1, 40))
def test_every_prefix_of_a_log_replays_to_a_prefix_of_its_records(
        log_ops: list[Op], zeros: int, chunk_bytes: int) -> None:
    lines = [encode_op(op) for op in log_ops]
    log = b"".join(lines)
    ends = [sum(map(len, lines[:n + 1])) for n in range(len(lines))]
    for cut in range(len(log) + 1):
        data = log[:cut] + bytes(zeros)
        complete = sum(1 for end in ends if end <= cut)
        state = WalReplay()
        chunks = [data[i:i + chunk_bytes] for i in range(0, len(data), chunk_bytes)]
        for raw in forward(chunks, 1 << 20):
            state.apply(raw)
        expected = model_state(log_ops[:complete])
        got = [(task_id, live_fields(line), line) for task_id, line in state.live.items()]
        assert got == [(t, (p, c), encode_add(t, p, c)) for t, p, c in expected]
        assert state.records == complete
        torn = len(data) > (ends[complete - 1] if complete else 0)
        assert state.faults == ({LineFault.TORN_TAIL: 1} if torn else {})
        # W-28: every valid record's id counts (rem markers carry the seed across rotation).
        assert state.seed_max == max((id_seed(op[1]) for op in log_ops[:complete]), default=0)
