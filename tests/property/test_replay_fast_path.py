"""The replay fast path gives exactly the strict replay's outcome (W-16, R-@A..R-@K, W-28).

Goal: ``FastWalReplay`` (the path every ``Disk`` open takes) must agree with ``WalReplay``
(the recovery table applied line by line) on every input, damaged or not: the same pending
tasks in the same order with the same lines and publish times, the same damage counts per
row of the table, the same largest seed (W-28) and the same number of valid records. Method:
Hypothesis draws files as mixes of valid ``add`` / ``rem`` records (ids that collide, seeds,
non-ASCII ids, publish times), damage of every kind (garbage, torn and truncated records,
zero-filled holes in front of records, empty lines, CRC-valid records whose body breaks one
rule of F-5/F-6/F-7, bit flips), an optional torn tail, and cuts each file into chunks at
arbitrary offsets; both replays read the same files in the same order. Over-long lines
(R-@E) are checked by dedicated examples, since they need more than 8 MiB each.

The fast path checks and applies whole chunks at once when every line of a chunk is valid
(W-16), so a second strategy draws mostly valid files (every padding length, ids with '=',
'-', '+', '/' or non-ASCII bytes, the longest ids and publish times) with at most a few
lines that are damage built to pass as many of the chunk checks as possible: CRC-valid
lines with a ':' moved between fields of two lines, wrong ops that start like "add" or
"rem", non-canonical padding, over-long fields by one byte. A counting subclass shows the
chunk path is really taken on valid chunks and left on damaged ones.
"""

from __future__ import annotations

import binascii

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deferq._core.b64 import canonical_base64, decode_base64
from deferq._core.fastreplay import FastWalReplay
from deferq._core.frame import frame
from deferq._core.limits import LINE_BYTES_MAX, TASK_ID_BYTES_MAX
from deferq._core.recovery import WalReplay
from deferq._core.taskid import decode_id, raw_id_ok
from deferq._core.walcodec import encode_add, encode_rem

IDS = st.one_of(
    st.sampled_from(["a", "b", "1790000000-42-1", "1790000001-42-1", "99-x", "7", "é-1", "ü"]),
    st.from_regex(r"[0-9]{1,14}(-[a-z0-9]{0,3}){0,2}", fullmatch=True),
    st.text(st.characters(blacklist_characters=":\n\x00", blacklist_categories=["Cs"]),
            min_size=1, max_size=6),
)
PUBLISH = st.one_of(st.none(), st.integers(1, 10 ** 20 - 1))
BAD_BODIES = st.one_of(
    st.sampled_from([
        b"", b"add", b"rem", b"add:", b"rem:", b"add:a", b"add:a:0", b"nop:a", b"ADD:a:0:",
        b"add::0:", b"add:a:00:", b"add:a:01:", b"add:a:-1:", b"add:a:1.5:", b"add:a: 1:",
        b"add:a:" + b"1" * 21 + b":", b"add:a:0:AB==", b"add:a:0:ABC=", b"add:a:0:A",
        b"add:a:0:AA=A", b"add:a:0:====", b"add:a:0:AA:A", b"add:a:0:AAA\xff", b"add:a:0: AAA",
        b"rem:a:b", b"rem:\xff", b"add:\xc3:0:", b"add:\xed\xa0\x80:0:",
        b"rem:" + b"x" * (TASK_ID_BYTES_MAX + 1), b"add:" + b"y" * (TASK_ID_BYTES_MAX + 1) + b":0:",
        b"rem:" + b"z" * TASK_ID_BYTES_MAX, b"add:" + "é".encode() * (TASK_ID_BYTES_MAX // 2) + b":0:",
    ]),
    st.binary(max_size=12).map(lambda b: b"add:a:0:" + binascii.b2a_base64(b, newline=False)
                               .replace(b"=", b"A", 1)),
    st.binary(max_size=20),
)


@st.composite
def record(draw: st.DrawFn) -> bytes:
    """One line (newline included) of a WAL file: valid or damaged in one of many ways."""
    kind = draw(st.sampled_from(["add", "add", "add", "rem", "rem", "garbage", "torn", "nul",
                                 "empty", "bad-body", "flip", "long-ok"]))
    task_id = draw(IDS)
    if kind == "add":
        return encode_add(task_id, draw(PUBLISH), draw(st.binary(max_size=40)))
    if kind == "rem":
        return encode_rem(task_id)
    if kind == "garbage":
        return draw(st.binary(max_size=40)).replace(b"\n", b"") + b"\n"
    if kind == "torn":
        line = encode_add(task_id, None, b"torn")
        return line[:draw(st.integers(0, len(line) - 1))] + b"\n"
    if kind == "nul":
        zeros = b"\0" * draw(st.integers(1, 30))
        after = draw(st.one_of(st.just(b""), st.just(encode_rem(task_id)[:-1]),
                               st.just(encode_add(task_id, None, b"z")[:-1])))
        before = draw(st.binary(max_size=10)).replace(b"\n", b"")
        return before + zeros + after + b"\n"
    if kind == "empty":
        return b"\n"
    if kind == "bad-body":
        return frame(draw(BAD_BODIES).replace(b"\n", b""))
    if kind == "flip":
        flipped = bytearray(encode_add(task_id, draw(PUBLISH), b"flip"))
        at = draw(st.integers(0, len(flipped) - 2))
        flipped[at] ^= 1 << draw(st.integers(0, 7))
        return bytes(flipped).replace(b"\n", b"") + b"\n"
    return encode_add(task_id, None, b"L" * draw(st.integers(0, 3000)))


@st.composite
def wal_file(draw: st.DrawFn) -> tuple[bytes, list[int]]:
    """A file's bytes (an optional torn tail last) and the offsets where its chunks end."""
    content = b"".join(draw(st.lists(record(), max_size=25)))
    content += draw(st.one_of(st.just(b""), st.binary(min_size=1, max_size=30),
                              st.just(encode_add("tail", None, b"t")[:-1]),
                              st.just(b"\0" * 7 + encode_rem("a")[:-1])))
    cuts = draw(st.lists(st.integers(0, len(content)), max_size=8))
    return content, sorted(set(cuts))


# Ids valid per F-5 that stress the chunk checks: bytes outside the base64 alphabet, '=',
# non-ASCII, the longest allowed, seeds of every length.
TRICKY_IDS = st.one_of(
    IDS,
    st.sampled_from(["a=b", "==", "x-=-y", "+/", "a b", "\r", "é=", "12-=", "0-0", "007-x",
                     "123456789012-1", "1234567890123-1", "1" * TASK_ID_BYTES_MAX,
                     "é" * (TASK_ID_BYTES_MAX // 2), "9" * 12, "-1"]),
)
# Contexts of 0 to 9 bytes give every padding (none, "=", "==") and both quantum ends.
CONTEXTS = st.binary(max_size=9)
# CRC-valid bodies that are damage (R-@D) but look almost right to whole-chunk checks.
NEAR_MISS = [
    b"add:12345:AAAA", b"add:7:0:5:AAAA",  # one ':' moved from one line to the next
    b"add:k:0:AA:A", b"add:k::AAAA", b"add::0:AAAA", b"rem:", b"rem:a:", b"rem:a:b:c",
    b"arm:k:0:", b"adx:k:0:", b"rom:k", b"rex:k", b"addd:k:0:", b"a", b"r", b"add",
    b"add:k:0:AB==", b"add:k:0:ABC=", b"add:k:0:A===", b"add:k:0:====", b"add:k:0:AA=A",
    b"add:k:0:AAA==AAA", b"add:k:0:AA==AAAA", b"add:k:0:AAAAA", b"add:k:0:AA",
    b"add:k:00:", b"add:k:01:", b"add:k:0x1:", b"add:k:" + b"1" * 21 + b":",
    b"add:k:-1:", b"add:k: 1:", b"add:k:\xd9\xa1:", b"add:k:0:AAA\xff",
    b"add:" + b"i" * (TASK_ID_BYTES_MAX + 1) + b":0:", b"rem:" + b"i" * (TASK_ID_BYTES_MAX + 1),
    b"add:\xff:0:", b"rem:\xc3", b"rem:\xed\xa0\x80", b"add:a\rb:0:AAAA=",
]
NEAR_MISS_BODIES = st.sampled_from(NEAR_MISS)


@st.composite
def valid_record(draw: st.DrawFn) -> bytes:
    task_id = draw(TRICKY_IDS)
    if draw(st.booleans()):
        return encode_add(task_id, draw(st.one_of(PUBLISH, st.just(10 ** 20 - 1))), draw(CONTEXTS))
    return encode_rem(task_id)


@st.composite
def near_miss_record(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["body", "body", "body", "crc", "header", "record"]))
    if kind == "body":
        return frame(draw(NEAR_MISS_BODIES))
    line = draw(valid_record())
    if kind == "crc":  # a valid body under the CRC of another body (R-@C)
        return frame(b"rem:other")[:9] + line[9:]
    if kind == "header":  # the right CRC value, spelled wrong (R-@B)
        return line[:8].upper() + line[8:] if line[:8] != line[:8].upper() else b"x" + line[1:]
    return draw(record())


@st.composite
def mostly_valid_file(draw: st.DrawFn) -> tuple[bytes, list[int]]:
    """A file of valid records with at most a few near misses; chunks cut anywhere."""
    lines = draw(st.lists(valid_record(), min_size=1, max_size=40))
    for _ in range(draw(st.integers(0, 2))):
        lines.insert(draw(st.integers(0, len(lines))), draw(near_miss_record()))
    content = b"".join(lines)
    if draw(st.booleans()):
        cuts = list(range(draw(st.integers(1, 64)), len(content), draw(st.integers(8, 400))))
    else:
        cuts = draw(st.lists(st.integers(0, len(content)), max_size=4))
    return content, sorted(set(cuts))


def chunks(content: bytes, cuts: list[int]) -> list[bytes]:
    edges = [0, *cuts, len(content)]
    return [content[a:b] for a, b in zip(edges, edges[1:]) if b > a]


def assert_same_outcome(files: list[tuple[bytes, list[int]]]) -> None:
    strict = WalReplay()
    fast = FastWalReplay()
    for content, cuts in files:
        strict.apply_file(chunks(content, cuts))
        fast.apply_file(chunks(content, cuts))
    got = fast.result()
    assert list(got.live.items()) == list(strict.live.items())  # order, lines, publish times
    assert got.faults == strict.faults
    assert got.seed_max == strict.seed_max
    assert got.records == strict.records


@pytest.mark.spec("W-16", "R-@A", "R-@B", "R-@C", "R-@D", "R-@F", "R-@I", "R-@J", "R-@K", "W-28",
                  "W-53")
@settings(max_examples=600, deadline=None)
@given(st.lists(wal_file(), min_size=1, max_size=3))
def test_the_fast_path_replays_any_files_exactly_like_the_strict_replay(
        files: list[tuple[bytes, list[int]]]) -> None:
    assert_same_outcome(files)


@pytest.mark.spec("W-16", "R-@A", "R-@B", "R-@C", "R-@D", "R-@I", "R-@J", "W-28", "F-5", "F-6",
                  "F-7", "W-53")
@settings(max_examples=800, deadline=None)
@given(st.lists(mostly_valid_file(), min_size=1, max_size=2))
def test_whole_chunk_checks_accept_exactly_the_valid_chunks(
        files: list[tuple[bytes, list[int]]]) -> None:
    assert_same_outcome(files)


class CountingReplay(FastWalReplay):
    """Counts the lines that went through the per-line loop instead of the chunk path."""

    def __init__(self) -> None:
        super().__init__()
        self.per_line = 0

    def _apply_lines(self, lines: list[bytes], clean: bool) -> None:
        self.per_line += len(lines)
        super()._apply_lines(lines, clean)


@pytest.mark.spec("W-16", "W-53")
def test_valid_chunks_take_the_chunk_path_and_damaged_ones_leave_it() -> None:
    adds = [encode_add(f"1790000000-42-{i}", None if i % 3 else i + 1, b"c" * (i % 7))
            for i in range(300)]  # contexts of 0 to 6 bytes: every padding
    removes = [encode_rem(f"1790000000-42-{i}") for i in range(0, 300, 2)]
    valid = b"".join(adds + removes + [encode_add("é=-+/", 5, b""), encode_rem("nope")])
    replay = CountingReplay()
    replay.apply_file([valid])
    assert replay.per_line == 0
    damaged = valid + frame(b"add:12345:AAAA") + frame(b"add:7:0:5:AAAA")
    replay = CountingReplay()
    replay.apply_file([damaged])
    assert replay.per_line == valid.count(b"\n") + 2
    assert_same_outcome([(damaged, [])])


@pytest.mark.spec("W-16", "R-@D", "F-5", "F-6", "F-7", "W-53")
@pytest.mark.parametrize("neighbour", ["ascii-2", "é-2"])  # a non-ASCII id changes the id checks
@pytest.mark.parametrize("body", NEAR_MISS)
def test_each_near_miss_inside_a_valid_chunk_is_damage_like_in_the_strict_replay(
        body: bytes, neighbour: str) -> None:
    before = (encode_add("1790000000-42-1", None, b"ctx") + encode_rem("a=b")
              + encode_add("k", 7, b""))
    after = (encode_rem("k") + encode_add(neighbour, 1, b"xy")
             + encode_add("1790000001-42-3", None, b""))
    content = before + frame(body) + after
    assert_same_outcome([(content, [])])
    assert_same_outcome([(content, [len(before) // 2, len(before) + 3])])
    replay = CountingReplay()
    replay.apply_file([content])
    assert replay.per_line == content.count(b"\n")  # the chunk path refused the whole chunk


@pytest.mark.spec("W-16", "R-@E", "R-@F", "W-53")
@pytest.mark.parametrize("where", ["one chunk", "split", "torn tail", "after valid"])
def test_over_long_lines_are_counted_like_the_strict_replay(where: str) -> None:
    long = b"x" * (LINE_BYTES_MAX + 5)
    valid = encode_add("k", None, b"v") + encode_rem("nope") + encode_add("1700000000-1-1", 5, b"")
    content = {
        "one chunk": valid + long + b"\n" + valid,
        "split": valid + long + b"\n" + valid,
        "torn tail": valid + long,
        "after valid": valid + b"\0" * 10 + long + b"\n" + encode_add("m", None, b"m"),
    }[where]
    cuts = [] if where == "one chunk" else list(range(65536, len(content), 65536 * 7))
    assert_same_outcome([(content, cuts), (valid, [3])])


@pytest.mark.spec("W-16", "F-5", "F-6", "W-53")
@settings(max_examples=400, deadline=None)
@given(st.one_of(st.binary(max_size=24),
                 st.binary(max_size=18).map(lambda b: binascii.b2a_base64(b, newline=False)),
                 st.from_regex(rb"[A-Za-z0-9+/=]{0,12}", fullmatch=True)))
def test_the_raw_byte_checks_agree_with_the_decoders(raw: bytes) -> None:
    assert canonical_base64(raw) == (decode_base64(raw) is not None)
    assert raw_id_ok(raw) == (decode_id(raw) is not None)
