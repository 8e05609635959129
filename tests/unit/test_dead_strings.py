"""The strings and JSON dialect of dead-task records (spec/format.md F-30..F-33).

Goal: what a writer stores for text Python can hold but UTF-8 cannot (lone surrogates),
and which JSON a reader accepts, pinned by one example per rule on the engine's decoder
(both its fast path and its definition) and, for the writer, through ``Disk``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deferq._core.deadcodec import DeadLine, _decode_dead_exact, decode_dead_record, encode_dead
from deferq._core.frame import BadLine, LineFault
from deferq._core.types import DeadTask
from deferq.backends import Disk

TASK = DeadTask(id="t", task_class="T", attempts=21, enqueued_at=0, failed_at=5,
                exception_class="E", exception_message="card declined",
                backtrace=("a.py:1:in f",), context=b"ctx")
PAYLOAD = encode_dead(TASK).split(b":", 3)[3].rstrip(b"\n")


def verdict(payload: bytes) -> DeadTask | BadLine:
    """The decoder's answer, checked equal to the definition's (F-11)."""
    found = decode_dead_record("t", payload)
    assert found == _decode_dead_exact(DeadLine("t", payload))
    return found


def refused(payload: bytes) -> bool:
    return verdict(payload) == BadLine(LineFault.BAD_DEAD_PAYLOAD)


def test_the_payload_the_writer_builds_decodes() -> None:
    assert verdict(PAYLOAD) == TASK


@pytest.mark.spec("F-31")
def test_a_byte_order_mark_before_the_json_is_refused() -> None:
    assert refused(b"\xef\xbb\xbf" + PAYLOAD)


@pytest.mark.spec("F-31")
def test_an_encoded_surrogate_is_not_utf8() -> None:
    assert refused(PAYLOAD.replace(b"card", b"c\xed\xa0\x80rd"))


@pytest.mark.spec("F-32")
@pytest.mark.parametrize("number", [b"-0", b"-1", b"21.0", b"2e1", b"2E1", b"021", b"+21",
                                    b"NaN", b"Infinity"])
def test_an_integer_field_is_digits_only(number: bytes) -> None:
    assert refused(PAYLOAD.replace(b'"attempts":21', b'"attempts":' + number))


@pytest.mark.spec("F-32")
def test_json_whitespace_is_accepted_and_other_dialects_are_not() -> None:
    spaced = b" \t\r" + PAYLOAD.replace(b'":', b'" :\r\t').replace(b",", b" , ") + b"\r "
    assert verdict(spaced) == TASK
    assert refused(PAYLOAD[:-1] + b',"id":"t"}')  # a repeated key
    assert refused(PAYLOAD.replace(b"card declined", b"card\tdeclined"))  # a literal control
    assert refused(PAYLOAD.replace(b'"a.py:1:in f"]', b'"a.py:1:in f",]'))  # a trailing comma
    assert refused(PAYLOAD + b"/* */")


@pytest.mark.spec("F-33")
def test_an_escaped_pair_is_one_character_and_a_lone_half_is_refused() -> None:
    pair = verdict(PAYLOAD.replace(b"card", b"\\ud83d\\uDE00"))
    assert isinstance(pair, DeadTask) and pair.exception_message == "\U0001f600 declined"
    for broken in (b"\\ud83d", b"\\ude00", b"\\ude00\\ud83d", b"\\ud83d\\u0041"):
        assert refused(PAYLOAD.replace(b"card", broken))
        assert refused(PAYLOAD.replace(b"in f", b"in " + broken))


@pytest.mark.spec("F-33", "F-17")
def test_character_limits_count_code_points_after_unescaping() -> None:
    message = "\U0001f600" * 65_536  # 65,536 characters, 131,072 UTF-16 units
    at_limit = json.dumps({**json.loads(PAYLOAD), "exception_message": message},
                          separators=(",", ":")).encode()
    found = verdict(at_limit)
    assert isinstance(found, DeadTask) and found.exception_message == message
    assert refused(at_limit.replace(b'"exception_message":"', b'"exception_message":"x'))


@pytest.mark.spec("F-30")
def test_the_writer_stores_a_lone_surrogate_as_backslash_text(tmp_path: Path) -> None:
    def raising() -> None:
        raise ValueError("bad \ud800 byte")

    with Disk(path=tmp_path, fsync_frequency=0) as disk:
        try:
            raising()
        except ValueError as exc:
            disk.add_dead_task("t-1", b"", exc, task_class="T", attempts=1)
        found = disk.find_dead_task("t-1")
    assert found is not None and found.exception_message == "bad \\ud800 byte"
    raw = (tmp_path / "deferred-dead_tasks-0").read_bytes()
    assert b'"bad \\\\ud800 byte"' in raw
