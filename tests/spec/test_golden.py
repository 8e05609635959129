"""The worked example of spec/format.md, kept byte for byte (F-14).

Goal: the bytes the spec shows, the golden files in tests/spec/golden/ and the bytes the codec writes
today are one and the same, so a change to the format cannot slip in without the spec, the golden files
and the version (F-15) changing together. Method: rebuild each example with the codec from the inputs the
spec lists and compare with the golden file byte for byte; compare the golden files with the fenced
blocks (text and ``hexdump -C``) that follow the ``golden`` markers in spec/format.md; then decode the
golden files back, by hand where the spec gives the rule (CRC, fields) and with the codec, and check they
give the inputs again.
"""

from __future__ import annotations

import base64
import json
import re
import zlib
from pathlib import Path

import pytest

from deferq._core.deadcodec import DeadLine, decode_dead_line, decode_dead_payload, encode_dead
from deferq._core.recovery import ForwardLines, WalReplay, live_fields
from deferq._core.types import DeadTask
from deferq._core.walcodec import WalAdd, WalRem, decode_wal_line, encode_add, encode_rem

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parent / "golden"
FORMAT_MD = ROOT / "spec" / "format.md"

# The inputs spec/format.md section 7 lists, in its order.
WAL_ADD_1 = ("1796206789-4242-1", None, b"hello")
WAL_ADD_2 = ("1796206789-4242-2", 2000000000, b'{"order": 42}')
WAL_REM_1 = "1796206789-4242-1"
DEAD_TASK = DeadTask(
    id="1796206789-4242-2",
    task_class="ChargeCard",
    attempts=21,
    enqueued_at=1796206789,
    failed_at=1796210389,
    exception_class="RuntimeError",
    exception_message="card declined (42 \u20ac)",
    backtrace=("app/tasks.py:12:in perform", "app/billing.py:88:in charge"),
    context=b'{"order": 42}',
)


def wal_example() -> bytes:
    return encode_add(*WAL_ADD_1) + encode_add(*WAL_ADD_2) + encode_rem(WAL_REM_1)


def golden(name: str) -> bytes:
    return (GOLDEN / name).read_bytes()


def spec_block(marker: str) -> str:
    """The fenced block that follows ``<!-- {marker} -->`` in spec/format.md, without the fences."""
    text = FORMAT_MD.read_text(encoding="utf-8")
    match = re.search(rf"<!-- {re.escape(marker)} -->\n```text\n(.*?)```\n", text, re.DOTALL)
    assert match is not None, f"spec/format.md has no block after <!-- {marker} -->"
    return match.group(1)


def hexdump_c(data: bytes) -> str:
    """What ``hexdump -C`` prints for ``data``, final offset line included."""
    out = []
    for start in range(0, len(data), 16):
        chunk = data[start:start + 16]
        left = " ".join(f"{b:02x}" for b in chunk[:8])
        right = " ".join(f"{b:02x}" for b in chunk[8:])
        text = "".join(chr(b) if 0x20 <= b < 0x7F else "." for b in chunk)
        out.append(f"{start:08x}  {left:<23}  {right:<23}  |{text}|\n")
    out.append(f"{len(data):08x}\n")
    return "".join(out)


# ----------------------------------------------------------------------------- codec == golden


@pytest.mark.spec("F-14", "F-2", "F-3", "F-6", "F-7", "F-57")
def test_codec_reproduces_the_wal_golden_file() -> None:
    assert wal_example() == golden("wal-example.bin")


@pytest.mark.spec("F-14", "F-2", "F-3", "F-10", "F-57")
def test_codec_reproduces_the_dead_task_golden_file() -> None:
    assert encode_dead(DEAD_TASK) == golden("dead-example.bin")


# ----------------------------------------------------------------------------- spec text == golden


@pytest.mark.spec("F-14")
@pytest.mark.parametrize("name", ["wal-example.bin", "dead-example.bin"])
def test_spec_shows_the_golden_bytes_as_text(name: str) -> None:
    assert spec_block(f"golden: {name}").encode("ascii") == golden(name)


@pytest.mark.spec("F-14")
@pytest.mark.parametrize(("name", "size"), [("wal-example.bin", 136), ("dead-example.bin", 64)])
def test_spec_hex_dump_matches_the_golden_bytes(name: str, size: int) -> None:
    data = golden(name)
    if name == "wal-example.bin":
        assert len(data) == size, "spec/format.md says the WAL example is 136 bytes"
    assert spec_block(f"golden-hexdump: {name} {size}") == hexdump_c(data[:size])


@pytest.mark.spec("F-14")
def test_spec_states_the_dead_example_size() -> None:
    assert len(golden("dead-example.bin")) == 339
    assert "Its output, 339 bytes" in FORMAT_MD.read_text(encoding="utf-8")


# ----------------------------------------------------------------------------- golden -> values


@pytest.mark.spec("F-2", "F-3")
@pytest.mark.parametrize("name", ["wal-example.bin", "dead-example.bin"])
def test_every_golden_line_is_framed_and_its_crc_covers_exactly_the_body(name: str) -> None:
    data = golden(name)
    assert data.endswith(b"\n")
    for line in data.split(b"\n")[:-1]:
        crc, sep, body = line[:8], line[8:9], line[9:]
        assert sep == b":"
        assert re.fullmatch(rb"[0-9a-f]{8}", crc)
        assert crc == b"%08x" % zlib.crc32(body)
        assert crc == f"{zlib.crc32(body) & 0xFFFFFFFF:08x}".encode("ascii")


@pytest.mark.spec("F-3")
def test_crc_parameters_give_the_standard_check_value() -> None:
    # CRC-32/ISO-HDLC's catalogued check value, as spec/format.md states it.
    assert b"%08x" % zlib.crc32(b"123456789") == b"cbf43926"
    assert b"%08x" % zlib.crc32(b"") == b"00000000"


@pytest.mark.spec("F-6", "F-7")
def test_wal_golden_lines_decode_to_their_inputs() -> None:
    lines = golden("wal-example.bin").split(b"\n")[:-1]
    assert [decode_wal_line(line) for line in lines] == [
        WalAdd("1796206789-4242-1", None, b"hello"),
        WalAdd("1796206789-4242-2", 2000000000, b'{"order": 42}'),
        WalRem("1796206789-4242-1"),
    ]
    # The fields by hand, as the grammar of F-6 and F-7 lays them out.
    op, task_id, when, payload = lines[1][9:].split(b":", 3)
    assert (op, task_id, when) == (b"add", b"1796206789-4242-2", b"2000000000")
    assert base64.b64decode(payload, validate=True) == b'{"order": 42}'
    assert lines[0][9:].split(b":", 3)[2] == b"0"  # no delay
    assert lines[2][9:] == b"rem:1796206789-4242-1"


@pytest.mark.spec("F-6", "F-7")
def test_replaying_the_wal_golden_file_leaves_the_delayed_task() -> None:
    splitter = ForwardLines()
    replay = WalReplay()
    for raw in splitter.feed(golden("wal-example.bin")):
        assert replay.apply(raw)
    assert splitter.finish() is None
    assert list(replay.live) == ["1796206789-4242-2"]
    assert live_fields(replay.live["1796206789-4242-2"])[0] == 2000000000
    assert replay.corrupt == 0


@pytest.mark.spec("F-10", "F-11")
def test_dead_golden_line_decodes_to_its_input() -> None:
    line = golden("dead-example.bin")[:-1]
    framed = decode_dead_line(line)
    assert isinstance(framed, DeadLine)
    assert framed.task_id == DEAD_TASK.id
    assert decode_dead_payload(framed) == DEAD_TASK


@pytest.mark.spec("F-10")
def test_dead_golden_json_is_compact_ascii_with_the_keys_in_order() -> None:
    line = golden("dead-example.bin")[:-1]
    op, task_id, payload = line[9:].split(b":", 2)
    assert (op, task_id) == (b"dead_task", DEAD_TASK.id.encode("ascii"))
    assert payload.isascii()
    assert b"\\u20ac" in payload
    obj = json.loads(payload)
    assert list(obj) == ["id", "task_class", "attempts", "enqueued_at", "failed_at",
                         "exception_class", "exception_message", "backtrace", "context"]
    assert json.dumps(obj, ensure_ascii=True, separators=(",", ":")).encode("ascii") == payload
    assert base64.b64decode(obj["context"], validate=True) == DEAD_TASK.context
