"""Unit tests of the record codec and file names (src/deferq/_core/: frame, taskid,
walcodec, deadcodec, names; spec/format.md).

Goal: every validity rule of F-4..F-17 and every file-name rule of F-1/F-9 is pinned by
an example at and just past its boundary, and every damaged line maps to the right row
of the recovery table (R-@B, R-@C, R-@D, R-@G). Method: build lines with the codec's own
``frame`` (so the CRC is valid and only the rule under test is broken) or by hand, and
compare the decoder's result with the expected record or ``BadLine`` fault. Lines are
passed without their newline, as the splitters hand them over.
"""

from __future__ import annotations

import json
import zlib

import pytest

from deferq._core.deadcodec import (
    DEAD_FIELDS,
    DeadLine,
    dead_problem,
    decode_dead_line,
    decode_dead_payload,
    encode_dead,
)
from deferq._core.frame import BadLine, LineFault, crc_hex, frame, unframe
from deferq._core.limits import (
    BACKTRACE_FRAME_CHARS_MAX,
    BACKTRACE_FRAMES_MAX,
    CONTEXT_BYTES_MAX,
    DEAD_STORAGE_VERSION,
    EXCEPTION_CLASS_CHARS_MAX,
    EXCEPTION_MESSAGE_CHARS_MAX,
    TASK_CLASS_BYTES_MAX,
    TASK_ID_BYTES_MAX,
    WAL_STORAGE_VERSION,
)
from deferq._core.names import (
    dead_data_name,
    dead_lock_name,
    dead_tmp_name,
    is_wal_file_name,
    to_base36,
    wal_file_name,
    wal_glob_prefix,
)
from deferq._core.taskid import check_task_id, id_seed, task_id_problem
from deferq._core.types import DeadTask
from deferq._core.walcodec import WalAdd, WalRem, decode_wal_line, encode_add, encode_rem

PREFIX = "deferred-"
BAD_HEADER = BadLine(LineFault.BAD_HEADER)
CRC_MISMATCH = BadLine(LineFault.CRC_MISMATCH)
BAD_BODY = BadLine(LineFault.BAD_BODY)
BAD_DEAD_PAYLOAD = BadLine(LineFault.BAD_DEAD_PAYLOAD)


def strip(line: bytes) -> bytes:
    """A complete line without its newline, as a splitter yields it."""
    assert line.endswith(b"\n")
    return line[:-1]


def framed(body: bytes) -> bytes:
    """A line with a valid CRC over ``body``, without its newline."""
    return strip(frame(body))


def dead_task(**changes: object) -> DeadTask:
    fields: dict[str, object] = {
        "id": "1700000000-42-7",
        "task_class": "app.jobs.SendMail",
        "attempts": 3,
        "enqueued_at": 1700000000,
        "failed_at": 1700000100,
        "exception_class": "app.errors.SmtpDown",
        "exception_message": "connection refused",
        "backtrace": ("app/jobs.py:10:in perform", "app/smtp.py:99:in send"),
        "context": b"\x00\x01payload\xff",
    }
    fields.update(changes)
    return DeadTask(**fields)  # type: ignore[arg-type]


def dead_json(task_id: str = "a", **changes: object) -> dict[str, object]:
    """The JSON object of a valid dead-task record, with ``changes`` applied."""
    obj: dict[str, object] = {
        "id": task_id,
        "task_class": "T",
        "attempts": 1,
        "enqueued_at": 0,
        "failed_at": 5,
        "exception_class": "ValueError",
        "exception_message": "boom",
        "backtrace": ["f.py:1:in g"],
        "context": "QUJD",
    }
    obj.update(changes)
    return obj


def decode_payload(payload: bytes, task_id: str = "a") -> DeadTask | BadLine:
    """Frame a dead-task body around ``payload`` and decode it all the way."""
    line = decode_dead_line(framed(b"dead_task:" + task_id.encode() + b":" + payload))
    assert isinstance(line, DeadLine)
    return decode_dead_payload(line)


def compact(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


# ----------------------------------------------------------------------------- framing (F-2, F-3)


@pytest.mark.spec("F-3")
def test_crc_is_zlib_crc32_over_the_body_as_eight_lowercase_hex_digits() -> None:
    assert crc_hex(b"") == b"00000000"
    assert crc_hex(b"123456789") == b"cbf43926"  # the CRC-32/ISO-HDLC check value
    body = b"rem:abc"
    assert crc_hex(body) == f"{zlib.crc32(body):08x}".encode()


@pytest.mark.spec("F-2", "F-3")
def test_frame_is_crc_colon_body_newline() -> None:
    assert frame(b"rem:x") == crc_hex(b"rem:x") + b":rem:x\n"


@pytest.mark.spec("F-2")
def test_unframe_returns_the_body_of_a_valid_line() -> None:
    assert unframe(framed(b"anything")) == b"anything"
    assert unframe(framed(b"")) == b""


@pytest.mark.spec("F-4", "R-@B")
@pytest.mark.parametrize("line", [
    b"",
    b"0000000",
    b"00000000",  # header without its ':'
    b"00000000;",
    b"0000000:x",  # seven hex digits
    b"DEADBEEF:x",  # uppercase hex is not the format
    b"0000000g:x",
    b" 0000000:x",
    b"+0000000:x",
    b"000000000:x",  # nine digits: byte 8 is not ':'
    b"\x00\x00\x00\x00\x00\x00\x00\x00\x00",  # zero fill
])
def test_line_without_a_hex_header_and_colon_is_a_bad_header(line: bytes) -> None:
    assert unframe(line) == BAD_HEADER
    assert decode_wal_line(line) == BAD_HEADER
    assert decode_dead_line(line) == BAD_HEADER


@pytest.mark.spec("F-4", "R-@B")
def test_uppercase_crc_of_a_valid_body_is_a_bad_header() -> None:
    body = b"rem:a"
    line = crc_hex(body).upper() + b":" + body
    assert crc_hex(body) != crc_hex(body).upper()  # the CRC has a letter, so case matters here
    assert decode_wal_line(line) == BAD_HEADER


@pytest.mark.spec("F-4", "R-@C")
def test_crc_mismatch_is_detected_for_wal_and_dead_lines() -> None:
    good = framed(b"rem:a")
    wrong = b"%08x" % ((int(good[:8], 16) + 1) % 2**32) + good[8:]
    assert decode_wal_line(wrong) == CRC_MISMATCH
    dead = strip(encode_dead(dead_task()))
    assert decode_dead_line(dead[:-1] + b"X") == CRC_MISMATCH


@pytest.mark.spec("F-3", "R-@C")
def test_crc_covers_exactly_the_body_bytes() -> None:
    # The CRC of the whole line (or of body plus newline) is not what the header holds.
    body = b"rem:a"
    assert decode_wal_line(b"%08x:" % zlib.crc32(body + b"\n") + body) == CRC_MISMATCH
    assert decode_wal_line(b"%08x:" % zlib.crc32(b":" + body) + body) == CRC_MISMATCH


@pytest.mark.spec("F-4")
def test_a_newline_inside_a_body_is_never_a_valid_record() -> None:
    assert unframe(framed(b"rem:a") + b"\n") != b"rem:a"
    assert isinstance(unframe(crc_hex(b"rem:a\nb") + b":rem:a\nb"), BadLine)


# ----------------------------------------------------------------------------- WAL records (F-6, F-7)


@pytest.mark.spec("F-6")
@pytest.mark.parametrize(("publish_at", "context"), [
    (None, b""),
    (None, b"\x00\xff\n:"),
    (1, b"x"),
    (1700000000, b"ab"),
    (2**63 - 1, b"abc"),
])
def test_add_record_round_trips(publish_at: int | None, context: bytes) -> None:
    line = encode_add("t-1", publish_at, context)
    assert line.count(b"\n") == 1 and line.endswith(b"\n")
    assert decode_wal_line(strip(line)) == WalAdd("t-1", publish_at, context)


@pytest.mark.spec("F-6")
def test_add_record_layout_is_add_id_publish_at_base64() -> None:
    assert strip(encode_add("id", None, b"ABC"))[9:] == b"add:id:0:QUJD"
    assert strip(encode_add("id", 17, b""))[9:] == b"add:id:17:"
    assert strip(encode_add("é", 5, b"\xfb\xef\xff"))[9:] == b"add:\xc3\xa9:5:++//"


@pytest.mark.spec("F-7")
def test_rem_record_round_trips_and_is_rem_id() -> None:
    line = encode_rem("caf\u00e9-1")
    assert strip(line)[9:] == "rem:caf\u00e9-1".encode()
    assert decode_wal_line(strip(line)) == WalRem("caf\u00e9-1")


@pytest.mark.spec("F-6", "F-7", "F-5")
def test_longest_valid_id_round_trips() -> None:
    task_id = "\u00e9" * (TASK_ID_BYTES_MAX // 2)
    assert len(task_id.encode()) == TASK_ID_BYTES_MAX
    assert decode_wal_line(strip(encode_rem(task_id))) == WalRem(task_id)
    assert decode_wal_line(strip(encode_add(task_id, None, b""))) == WalAdd(task_id, None, b"")


@pytest.mark.spec("F-4", "R-@D")
@pytest.mark.parametrize("body", [
    b"",
    b"add",
    b"rem",
    b"ADD:a:0:",
    b"del:a",
    b"dead_task:a:{}",  # a dead-task body is not a WAL record
    b"add:a",
    b"add:a:0",
    b"add::0:",
    b"rem:",
    b"rem:a:b",  # the id would contain ':'
    b"add:a:0:QQ==:x",
    b"rem:a\x00b",
    b"add:a\x00:0:",
])
def test_valid_crc_with_malformed_wal_body_is_bad_body(body: bytes) -> None:
    assert decode_wal_line(framed(body)) == BAD_BODY


@pytest.mark.spec("F-6", "R-@D")
@pytest.mark.parametrize("publish_at", [
    b"", b"00", b"01", b"-1", b"+1", b" 1", b"1 ", b"1.0", b"1e3", b"0x1", b"\xef\xbc\x91",
    b"1" * 21,
])
def test_non_canonical_publish_at_is_bad_body(publish_at: bytes) -> None:
    assert decode_wal_line(framed(b"add:a:" + publish_at + b":")) == BAD_BODY


@pytest.mark.spec("F-6", "F-19", "R-@D", "F-56")
def test_publish_at_is_read_up_to_2_to_the_63_minus_1_and_twenty_nines_are_a_bad_body() -> None:
    largest = b"%d" % (2**63 - 1)
    assert decode_wal_line(framed(b"add:a:" + largest + b":")) == WalAdd("a", 2**63 - 1, b"")
    assert decode_wal_line(framed(b"add:a:" + b"9" * 20 + b":")) == BAD_BODY
    assert decode_wal_line(framed(b"add:a:%d:" % 2**63)) == BAD_BODY


@pytest.mark.spec("F-6", "R-@D")
@pytest.mark.parametrize("payload", [
    b"QQ", b"QQ=", b"QQ===", b"QR==", b"QUJ=", b"Q Q==", b"-_==", b"QQ==QQ==", b"=", b"Q",
    b"QUJD\r",
])
def test_non_canonical_base64_context_is_bad_body(payload: bytes) -> None:
    assert decode_wal_line(framed(b"add:a:0:" + payload)) == BAD_BODY


@pytest.mark.spec("F-5", "R-@D")
@pytest.mark.parametrize("raw_id", [
    b"\xff",
    b"\xc0\x80",  # overlong encoding of NUL
    b"\xed\xa0\x80",  # an encoded surrogate is not UTF-8
    b"a\xe9",
    b"x" * (TASK_ID_BYTES_MAX + 1),
    b"\xc3\xa9" * 128 + b"a",  # 257 bytes
])
def test_invalid_id_bytes_are_bad_body(raw_id: bytes) -> None:
    assert decode_wal_line(framed(b"rem:" + raw_id)) == BAD_BODY
    assert decode_wal_line(framed(b"add:" + raw_id + b":0:")) == BAD_BODY
    assert decode_dead_line(framed(b"dead_task:" + raw_id + b":{}")) == BAD_BODY


# ----------------------------------------------------------------------------- task ids (F-5)


@pytest.mark.spec("F-5")
@pytest.mark.parametrize("task_id", [
    "a", "1700000000-1-1", "x" * TASK_ID_BYTES_MAX, "\U0001f600" * (TASK_ID_BYTES_MAX // 4),
    " ", "\t", "-", "a/b", "\r",
])
def test_valid_task_ids_are_accepted(task_id: str) -> None:
    assert task_id_problem(task_id) is None
    assert check_task_id(task_id) == task_id


@pytest.mark.spec("F-5")
@pytest.mark.parametrize(("task_id", "problem"), [
    ("", "empty"),
    ("a:b", "':'"),
    (":", "':'"),
    ("a\nb", "'\\n'"),
    ("a\x00", "'\\x00'"),
    ("x" * (TASK_ID_BYTES_MAX + 1), "bytes"),
    ("\u00e9" * 128 + "a", "bytes"),  # 257 bytes of UTF-8 in 129 characters
    ("a\ud800", "UTF-8"),
    ("\udcff", "UTF-8"),
])
def test_invalid_task_ids_are_rejected_with_value_error(task_id: str, problem: str) -> None:
    found = task_id_problem(task_id)
    assert found is not None and problem in found
    with pytest.raises(ValueError, match="invalid task_id"):
        check_task_id(task_id)


@pytest.mark.spec("F-5")
@pytest.mark.parametrize("task_id", [None, 1, b"abc", ["a"], 1.5])
def test_non_str_task_id_is_rejected_with_value_error(task_id: object) -> None:
    assert task_id_problem(task_id) is not None
    with pytest.raises(ValueError, match="must be a str"):
        check_task_id(task_id)


def test_check_task_id_names_the_argument() -> None:
    with pytest.raises(ValueError, match="invalid id ''"):
        check_task_id("", argument="id")


# ----------------------------------------------------------------------------- id seeds (W-28, F-17)


@pytest.mark.spec("W-28", "F-51")
@pytest.mark.parametrize(("task_id", "seed"), [
    ("1700000000-42-1", 1700000000),
    ("0-1-1", 0),
    ("7-x", 7),
    ("007-x", 7),
    ("9" * 12 + "-1-1", 10**12 - 1),
    ("1" * 13 + "-1-1", int("1" * 13)),  # every seed a 64-bit reader holds counts (W-28)
    (f"{2**63 - 1}-x", 2**63 - 1),
    (f"{2**63}-x", 0),  # above what a 64-bit reader holds: not a seed
    ("9" * 19 + "-x", 0),
    ("9" * 20 + "-x", 0),
    ("abc", 0),
    ("-5", 0),
    ("12abc-1", 0),
    ("+12-1", 0),
    (" 12-1", 0),
    ("1.5-1", 0),
    ("\u0661\u0662-1", 0),  # Arabic-Indic digits are not ASCII digits
    ("\u00b2-1", 0),  # superscript two passes str.isdigit but is not ASCII
    ("\uff11-1", 0),  # fullwidth one
])
def test_id_seed_is_the_leading_run_of_ascii_digits_up_to_2_to_the_63_minus_1(
        task_id: str, seed: int) -> None:
    assert id_seed(task_id) == seed


@pytest.mark.spec("W-28")
def test_id_seed_of_an_id_without_a_dash_reads_the_whole_id() -> None:
    # Implemented reading of "before the first '-'": with no '-', the whole id is the head.
    assert id_seed("123") == 123
    assert id_seed("1" * 20) == 0


# ----------------------------------------------------------------------------- dead-task records (F-10, F-11)


@pytest.mark.spec("F-10", "F-11")
def test_dead_record_round_trips() -> None:
    task = dead_task()
    line = decode_dead_line(strip(encode_dead(task)))
    assert isinstance(line, DeadLine) and line.task_id == task.id
    assert decode_dead_payload(line) == task


@pytest.mark.spec("F-10")
def test_dead_record_layout_is_compact_ascii_json_with_keys_in_order() -> None:
    task = dead_task(id="\u00e9-1", exception_message="caf\u00e9 \u2603 \U0001f600",
                     context=b"ABC", backtrace=())
    line = strip(encode_dead(task))
    assert line[9:].startswith("dead_task:\u00e9-1:".encode())
    payload = line.split(b":", 3)[3]
    assert payload.isascii()
    assert b", " not in payload and b": " not in payload
    obj = json.loads(payload)
    assert tuple(obj) == DEAD_FIELDS
    assert obj["context"] == "QUJD" and obj["backtrace"] == []
    assert b"\\u00e9" in payload and b"\\ud83d\\ude00" in payload


@pytest.mark.spec("F-10", "F-11")
def test_dead_record_with_empty_context_and_unicode_fields_round_trips() -> None:
    task = dead_task(context=b"", task_class="\u00e9", exception_message="",
                     exception_class="builtins_free\u2603", backtrace=("\u00e9:1:in f",))
    line = decode_dead_line(strip(encode_dead(task)))
    assert isinstance(line, DeadLine)
    assert decode_dead_payload(line) == task


@pytest.mark.spec("F-10", "R-@D")
@pytest.mark.parametrize("body", [
    b"dead_task:a",
    b"dead_task",
    b"dead:a:{}",
    b"DEAD_TASK:a:{}",
    b"add:a:0:",
    b"rem:a",
    b"dead_task::{}",
    b"dead_task:a\x00:{}",
])
def test_dead_line_with_malformed_frame_body_is_bad_body(body: bytes) -> None:
    assert decode_dead_line(framed(body)) == BAD_BODY


@pytest.mark.spec("F-10")
def test_wal_reader_rejects_a_dead_task_line() -> None:
    assert decode_wal_line(strip(encode_dead(dead_task()))) == BAD_BODY


@pytest.mark.spec("F-11")
def test_dead_payload_decodes_from_its_json_object() -> None:
    assert decode_payload(compact(dead_json())) == DeadTask(
        id="a", task_class="T", attempts=1, enqueued_at=0, failed_at=5,
        exception_class="ValueError", exception_message="boom", backtrace=("f.py:1:in g",),
        context=b"ABC")


@pytest.mark.spec("F-11")
def test_dead_payload_need_not_be_compact_or_ascii_to_decode() -> None:
    # F-11 (the reader's rule) asks for keys, order and types, not for F-10's spelling.
    spaced = json.dumps(dead_json(exception_message="caf\u00e9"), ensure_ascii=False).encode()
    decoded = decode_payload(spaced)
    assert isinstance(decoded, DeadTask) and decoded.exception_message == "caf\u00e9"


def _reordered() -> dict[str, object]:
    obj = dead_json()
    return {"task_class": obj.pop("task_class"), **obj}


def _without(key: str) -> dict[str, object]:
    obj = dead_json()
    del obj[key]
    return obj


@pytest.mark.spec("F-11", "R-@G")
@pytest.mark.parametrize("obj", [
    pytest.param(_reordered(), id="wrong-key-order"),
    pytest.param({**dead_json(), "extra": 1}, id="extra-key"),
    pytest.param(_without("backtrace"), id="missing-key"),
    pytest.param(dead_json(id="b"), id="id-mismatch"),
    pytest.param(dead_json(task_class=1), id="task_class-int"),
    pytest.param(dead_json(task_class=None), id="task_class-null"),
    pytest.param(dead_json(attempts=True), id="attempts-bool"),
    pytest.param(dead_json(attempts=1.0), id="attempts-float"),
    pytest.param(dead_json(attempts="1"), id="attempts-str"),
    pytest.param(dead_json(enqueued_at=False), id="enqueued_at-bool"),
    pytest.param(dead_json(failed_at=None), id="failed_at-null"),
    pytest.param(dead_json(exception_class=["E"]), id="exception_class-list"),
    pytest.param(dead_json(exception_message=0), id="exception_message-int"),
    pytest.param(dead_json(backtrace="f.py:1:in g"), id="backtrace-str"),
    pytest.param(dead_json(backtrace=["ok", 1]), id="backtrace-int-frame"),
    pytest.param(dead_json(backtrace=[None]), id="backtrace-null-frame"),
    pytest.param(dead_json(context=None), id="context-null"),
    pytest.param(dead_json(context="QQ"), id="context-unpadded"),
    pytest.param(dead_json(context="QR=="), id="context-noncanonical-bits"),
    pytest.param(dead_json(context="-_=="), id="context-urlsafe"),
    pytest.param(dead_json(context="QU\u00e9D"), id="context-non-ascii"),
    pytest.param(dead_json(attempts=-1), id="attempts-negative"),
    pytest.param(dead_json(failed_at=-1), id="failed_at-negative"),
    pytest.param(dead_json(task_class=""), id="task_class-empty"),
    pytest.param(dead_json(backtrace=["f"] * (BACKTRACE_FRAMES_MAX + 1)), id="backtrace-21"),
])
def test_invalid_dead_payload_is_bad_dead_payload(obj: dict[str, object]) -> None:
    assert decode_payload(compact(obj)) == BAD_DEAD_PAYLOAD


@pytest.mark.spec("F-11", "R-@G")
@pytest.mark.parametrize("payload", [
    b"", b"{", b"[]", b"null", b"1", b'"x"', b"{}", b"NaN", b"\xff", b"[" * 100_000,
    b"{" + b'"a":{' * 50_000,
    compact(dead_json()).replace(b'"failed_at":5', b'"failed_at":5e0'),  # exponent: not an int
])
def test_unparsable_or_non_object_dead_payload_is_bad_dead_payload(payload: bytes) -> None:
    assert decode_payload(payload) == BAD_DEAD_PAYLOAD


@pytest.mark.spec("F-11", "R-@G")
def test_dead_payload_with_a_duplicated_key_is_bad_dead_payload() -> None:
    text = compact(dead_json(task_id="a"))
    assert decode_payload(text[:-1] + b',"id":"a"}') == BAD_DEAD_PAYLOAD
    # A duplicate cannot smuggle a different id past the id check either.
    assert decode_payload(b'{"id":"b",' + text[1:-1] + b"}") == BAD_DEAD_PAYLOAD


@pytest.mark.spec("F-11", "F-17", "R-@G")
def test_dead_payload_fields_past_their_limits_are_bad_dead_payload() -> None:
    over = [
        dead_json(task_class="x" * (TASK_CLASS_BYTES_MAX + 1)),
        dead_json(exception_class="E" * (EXCEPTION_CLASS_CHARS_MAX + 1)),
        dead_json(exception_message="m" * (EXCEPTION_MESSAGE_CHARS_MAX + 1)),
        dead_json(backtrace=["f" * (BACKTRACE_FRAME_CHARS_MAX + 1)]),
    ]
    for obj in over:
        assert decode_payload(compact(obj)) == BAD_DEAD_PAYLOAD
    at = [
        dead_json(task_class="x" * TASK_CLASS_BYTES_MAX),
        dead_json(exception_class="E" * EXCEPTION_CLASS_CHARS_MAX),
        dead_json(exception_message="m" * EXCEPTION_MESSAGE_CHARS_MAX),
        dead_json(backtrace=["f" * BACKTRACE_FRAME_CHARS_MAX] * BACKTRACE_FRAMES_MAX),
    ]
    for obj in at:
        assert isinstance(decode_payload(compact(obj)), DeadTask)


# ----------------------------------------------------------------------------- dead-task limits (F-17)


@pytest.mark.spec("F-17")
def test_dead_problem_accepts_every_field_at_its_limit() -> None:
    task = dead_task(
        task_class="\u00e9" * (TASK_CLASS_BYTES_MAX // 2),
        attempts=0, enqueued_at=0, failed_at=0,
        exception_class="E" * EXCEPTION_CLASS_CHARS_MAX,
        exception_message="m" * EXCEPTION_MESSAGE_CHARS_MAX,
        backtrace=("f" * BACKTRACE_FRAME_CHARS_MAX,) * BACKTRACE_FRAMES_MAX,
        context=bytes(CONTEXT_BYTES_MAX),
    )
    assert dead_problem(task) is None


@pytest.mark.spec("F-17", "F-5", "F-8")
@pytest.mark.parametrize(("changes", "problem"), [
    ({"id": ""}, "id"),
    ({"id": "a:b"}, "id"),
    ({"task_class": ""}, "task_class"),
    ({"task_class": "x" * (TASK_CLASS_BYTES_MAX + 1)}, "task_class"),
    ({"task_class": "\u00e9" * (TASK_CLASS_BYTES_MAX // 2) + "x"}, "task_class"),  # 1025 bytes
    ({"attempts": -1}, "attempts"),
    ({"enqueued_at": -1}, "times"),
    ({"failed_at": -1}, "times"),
    ({"exception_class": "E" * (EXCEPTION_CLASS_CHARS_MAX + 1)}, "exception_class"),
    ({"exception_message": "m" * (EXCEPTION_MESSAGE_CHARS_MAX + 1)}, "exception_message"),
    ({"backtrace": ("f",) * (BACKTRACE_FRAMES_MAX + 1)}, "frames"),
    ({"backtrace": ("f" * (BACKTRACE_FRAME_CHARS_MAX + 1),)}, "backtrace frames"),
    ({"context": bytes(CONTEXT_BYTES_MAX + 1)}, "context"),
])
def test_dead_problem_names_the_field_past_its_limit(changes: dict[str, object],
                                                     problem: str) -> None:
    found = dead_problem(dead_task(**changes))
    assert found is not None and problem in found


# ----------------------------------------------------------------------------- file names (F-1, F-9, F-15)


@pytest.mark.spec("F-1", "F-15")
def test_wal_file_name_follows_the_pattern() -> None:
    assert WAL_STORAGE_VERSION == "0"
    assert wal_glob_prefix(PREFIX) == "deferred-0-"
    assert wal_file_name(PREFIX, "20240131", 4242, 0) == "deferred-0-20240131-4242-0"
    assert wal_file_name("jobs-", "20000101", 9_999_999_999, 2**32 - 1) == (
        "jobs-0-20000101-9999999999-1z141z3")


@pytest.mark.spec("F-1")
def test_to_base36_is_lowercase_without_padding() -> None:
    assert [to_base36(n) for n in (0, 1, 35, 36, 2**32 - 1)] == ["0", "1", "z", "10", "1z141z3"]


@pytest.mark.spec("F-1", "F-34")
@pytest.mark.parametrize("name", [
    "deferred-0-20240131-1-0",
    "deferred-0-20240131-4242-1a2b3c",
    "deferred-0-00000000-0-0",
    "deferred-0-20240131-1234567890-zzzzzz",
    "deferred-0-20240131-1-1z141z3",  # 2**32 - 1
])
def test_exact_wal_file_names_are_recognized(name: str) -> None:
    assert is_wal_file_name(PREFIX, name)


@pytest.mark.spec("F-1", "F-15", "F-34")
@pytest.mark.parametrize("name", [
    "deferred-1-20240131-4242-1a2b3c",  # another storage version
    "deferred-00-20240131-4242-1a2b3c",
    "other-0-20240131-4242-1a2b3c",  # another prefix
    "xdeferred-0-20240131-4242-1a2b3c",
    "deferred-0-2024013-4242-1a2b3c",  # 7-digit date
    "deferred-0-202401311-4242-1a2b3c",  # 9-digit date
    "deferred-0-2024O131-4242-1a2b3c",
    "deferred-0-\u0662\u0660\u0662\u0664\u0660\u0661\u0663\u0661-4242-1a2b3c",
    "deferred-0-20240131--1a2b3c",  # empty pid
    "deferred-0-20240131-12345678901-1a2b3c",  # 11-digit pid
    "deferred-0-20240131-\u0664\u0662-1a2b3c",  # non-ASCII digits
    "deferred-0-20240131-+42-1a2b3c",
    "deferred-0-20240131-4242-",  # empty rand
    "deferred-0-20240131-4242-12345678",  # 8 base36 chars
    "deferred-0-20240131-4242-1A2B3C",  # uppercase
    "deferred-0-20240131-4242-1z141z4",  # 2**32
    "deferred-0-20240131-4242-ab_c",
    "deferred-0-20240131-4242-1a2b3c.tmp",
    "deferred-0-20240131-4242-1a2b3c-x",
    "deferred-0-20240131-4242",
    "deferred-0-20240131-4242-1a2b3c ",
    " deferred-0-20240131-4242-1a2b3c",
    "deferred-0-20240131-4242-\u00e9",
    "deferred-0-",
    "",
])
def test_near_miss_wal_file_names_are_rejected(name: str) -> None:
    assert not is_wal_file_name(PREFIX, name)


@pytest.mark.spec("F-9", "F-15")
def test_dead_store_file_names() -> None:
    assert DEAD_STORAGE_VERSION == "0"
    assert dead_data_name(PREFIX) == "deferred-dead_tasks-0"
    assert dead_lock_name(PREFIX) == "deferred-dead_tasks.lock"
    assert dead_tmp_name(PREFIX) == "deferred-dead_tasks-0.tmp"


@pytest.mark.spec("F-9", "F-1")
@pytest.mark.parametrize("prefix", [PREFIX, "a-", "0-", "x-0-20240131-1-", "-a-", "q.-"])
def test_dead_store_names_never_match_the_wal_pattern(prefix: str) -> None:
    names = (dead_data_name(prefix), dead_lock_name(prefix), dead_tmp_name(prefix))
    for name in names:
        for other in (prefix, PREFIX, "a-", "0-", "x-", "x-0-20240131-1-"):
            assert not is_wal_file_name(other, name), (other, name)
