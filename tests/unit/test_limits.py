"""Unit tests of the limits module (src/deferq/_core/limits.py; L-2 and the limit relations).

Goal: the dead-task lock back-off is exactly L-2's schedule, and the relations between
limits that the engine relies on hold, including that the largest dead-task record the
format allows fits in one line. Method: evaluate ``lock_sleep_s`` for every attempt and
sum the sleeps; build the worst-case dead task (every field at its F-17 limit, characters
chosen to maximize JSON escaping) and measure its encoded line.
"""

from __future__ import annotations

import pytest

from deferq._core import limits
from deferq._core.deadcodec import DeadLine, decode_dead_line, decode_dead_payload, encode_dead
from deferq._core.types import DeadTask


@pytest.mark.spec("L-2")
def test_lock_sleep_grows_by_ten_ms_per_attempt_up_to_a_tenth_of_a_second() -> None:
    sleeps = [limits.lock_sleep_s(attempt) for attempt in range(1, 21)]
    expected = [0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.09] + [0.1] * 11
    assert sleeps == pytest.approx(expected)
    assert all(limits.LOCK_SLEEP_STEP_S <= s <= limits.LOCK_SLEEP_MAX_S for s in sleeps)


@pytest.mark.spec("L-2")
def test_at_most_twenty_attempts_with_nineteen_sleeps_of_about_one_and_a_half_seconds() -> None:
    assert limits.LOCK_ATTEMPTS_MAX == 20
    total = sum(limits.lock_sleep_s(attempt) for attempt in range(1, limits.LOCK_ATTEMPTS_MAX))
    assert total == pytest.approx(1.45)


@pytest.mark.spec("F-5", "F-8", "F-17")
def test_format_limits_have_their_specified_values() -> None:
    assert limits.TASK_ID_BYTES_MAX == 256
    assert limits.TASK_CLASS_BYTES_MAX == 1024
    assert limits.CONTEXT_BYTES_MAX == 4 * 1024 * 1024
    assert limits.EXCEPTION_CLASS_CHARS_MAX == 1024
    assert limits.EXCEPTION_MESSAGE_CHARS_MAX == 65_536
    assert limits.BACKTRACE_FRAMES_MAX == 20
    assert limits.BACKTRACE_FRAME_CHARS_MAX == 4096
    assert limits.LINE_BYTES_MAX == 8 * 1024 * 1024


def test_engine_and_configuration_limits_have_their_specified_values() -> None:
    assert limits.WAL_SIZE_LIMIT_BYTES == 2_000_000
    assert limits.WAL_SIZE_INCREASE_RATIO == 1.5
    assert (limits.DEFAULT_PATH, limits.DEFAULT_PREFIX) == ("storage", "deferred-")
    assert limits.DEFAULT_FSYNC_FREQUENCY_S == 0.5
    assert limits.FSYNC_FREQUENCY_MAX_S == 3600
    assert (limits.FILE_MODE, limits.DIR_MODE) == (0o600, 0o700)
    assert limits.TAIL_SCAN_CHUNK_BYTES == 8192


def test_chunks_relate_to_ids_and_lines() -> None:
    # A tail scan chunk holds any id, and a read chunk never exceeds the line bound.
    assert limits.TASK_ID_BYTES_MAX < limits.TAIL_SCAN_CHUNK_BYTES
    assert limits.READ_CHUNK_BYTES <= limits.LINE_BYTES_MAX
    assert limits.WRITE_BATCH_BYTES <= limits.LINE_BYTES_MAX


@pytest.mark.spec("F-4", "F-8", "F-17")
def test_the_largest_dead_task_record_fits_in_a_line() -> None:
    # Worst case for JSON escaping: an astral character is one Python character but
    # twelve output bytes (a \\uXXXX\\uXXXX surrogate pair); a control character in a
    # byte-limited field is one UTF-8 byte but six output bytes.
    astral = "\U0001f600"
    task = DeadTask(
        id="\x01" * limits.TASK_ID_BYTES_MAX,
        task_class="\x01" * limits.TASK_CLASS_BYTES_MAX,
        attempts=10**18,
        enqueued_at=10**12 - 1,
        failed_at=10**18,
        exception_class=astral * limits.EXCEPTION_CLASS_CHARS_MAX,
        exception_message=astral * limits.EXCEPTION_MESSAGE_CHARS_MAX,
        backtrace=(astral * limits.BACKTRACE_FRAME_CHARS_MAX,) * limits.BACKTRACE_FRAMES_MAX,
        context=b"\xff" * limits.CONTEXT_BYTES_MAX,
    )
    line = encode_dead(task)
    assert len(line) <= limits.LINE_BYTES_MAX
    framed = decode_dead_line(line[:-1])
    assert isinstance(framed, DeadLine)
    assert decode_dead_payload(framed) == task
