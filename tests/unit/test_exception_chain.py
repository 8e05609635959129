"""A dead task keeps its exception's chain in its backtrace (spec/format.md F-18).

Goal: ``__cause__`` and ``__context__`` reach the dead record as Python prints them, bounded,
in a shape every dead-task reader already parses (an array of at most 20 strings, F-11).
Method: real exceptions raised and chained through real frames, stored with a real ``Disk``
and read back; the chain's lines are recognised by their prefixes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from deferq._core.deadcodec import DeadLine, decode_dead_line, decode_dead_payload, encode_dead
from deferq._core.limits import BACKTRACE_FRAMES_MAX, CHAIN_EXCEPTIONS_MAX, CHAIN_FRAMES_MAX
from deferq._core.types import DeadTask
from deferq.backends import Disk
from deferq.backends._deadtask import exception_backtrace


def _raise(exc: BaseException) -> None:
    raise exc


def _caught(build: object) -> BaseException:
    try:
        assert callable(build)
        build()
    except BaseException as exc:  # noqa: BLE001 - the exception under test
        return exc
    raise AssertionError("unreachable")  # pragma: no cover


def _explicit() -> None:
    try:
        _raise(KeyError("card"))
    except KeyError as exc:
        raise RuntimeError("charge failed") from exc


def _implicit() -> None:
    try:
        _raise(ConnectionError("reset"))
    except ConnectionError:
        raise ValueError("bad reply")  # noqa: B904 - the implicit context is the point


def _suppressed() -> None:
    try:
        _raise(ConnectionError("reset"))
    except ConnectionError:
        raise ValueError("bad reply") from None


def _headers(backtrace: tuple[str, ...]) -> list[str]:
    return [line for line in backtrace if line.startswith(("[cause] ", "[context] "))]


@pytest.mark.spec("F-18", "F-53")
def test_a_cause_follows_the_exceptions_own_frames_with_its_header_and_frames(
        tmp_path: Path) -> None:
    exc = _caught(_explicit)
    with Disk(path=tmp_path) as disk:
        disk.add_dead_task("a", b"", exc, task_class="T", attempts=1)
        task = disk.find_dead_task("a")
    assert task is not None
    trace = task.backtrace
    header = trace.index("[cause] KeyError: 'card'")
    assert trace[header - 1].endswith(":in _explicit")  # the raise of RuntimeError
    assert [line.rsplit(":in ", 1)[1] for line in trace[header + 1:]] == ["_explicit", "_raise"]
    assert trace[0].endswith(":in _caught")


@pytest.mark.spec("F-18")
def test_an_implicit_context_is_kept_and_a_suppressed_one_is_not() -> None:
    implicit = exception_backtrace(_caught(_implicit))
    assert _headers(implicit) == ["[context] ConnectionError: reset"]
    assert implicit[-1].endswith(":in _raise")
    suppressed = exception_backtrace(_caught(_suppressed))
    assert _headers(suppressed) == []
    assert suppressed[-1].endswith(":in _suppressed")


def _chain_of(length: int) -> BaseException:
    def nest(level: int) -> None:
        if level == 0:
            _raise(OSError("level 0"))
        try:
            nest(level - 1)
        except OSError as exc:
            raise OSError(f"level {level}") from exc
    return _caught(lambda: nest(length))


def _deep(depth: int, exc: BaseException) -> None:
    if depth == 0:
        raise exc
    _deep(depth - 1, exc)


@pytest.mark.spec("F-18", "F-53", "F-54")
def test_the_chain_is_bounded_and_leaves_the_own_frames_the_rest_of_the_twenty_lines() -> None:
    top = OSError("top")
    top.__cause__ = _chain_of(CHAIN_EXCEPTIONS_MAX + 3)
    deep = _caught(lambda: _deep(40, top))
    trace = exception_backtrace(deep)
    assert len(trace) == BACKTRACE_FRAMES_MAX
    assert _headers(trace) == [f"[cause] OSError: level {n}"
                               for n in range(CHAIN_EXCEPTIONS_MAX + 3, 3, -1)]
    tail = CHAIN_EXCEPTIONS_MAX * (1 + CHAIN_FRAMES_MAX)
    own = trace[:BACKTRACE_FRAMES_MAX - tail]
    assert all(line.endswith(":in _deep") for line in own)
    # The record is what every reader of F-11 decodes: at most 20 strings.
    task = DeadTask(id="a", task_class="T", attempts=0, enqueued_at=0, failed_at=0,
                    exception_class="E", exception_message="", backtrace=trace, context=b"")
    framed = decode_dead_line(encode_dead(task)[:-1])
    assert isinstance(framed, DeadLine)
    assert decode_dead_payload(framed) == task


@pytest.mark.spec("F-18", "F-53")
def test_a_chain_that_loops_ends_and_a_long_header_is_clipped() -> None:
    first, second = ValueError("x" * 10_000), KeyError("k")
    first.__context__, second.__context__ = second, first
    trace = exception_backtrace(first)
    assert len(_headers(trace)) == 1
    assert trace == ("[context] KeyError: 'k'",)
    third = RuntimeError("boom")
    third.__cause__ = first
    [header, again] = _headers(exception_backtrace(third))
    assert len(header) == 4096 and header.endswith("...[truncated]")
    assert again == "[context] KeyError: 'k'"
