"""Property tests of ``add_dead_task``'s shortcut past ``dead_problem`` (F-17, C-7).

Goal: ``dead_task_for`` (the task ``Disk.add_dead_task`` stores) skips the full F-17 walk
when ``task_class`` is ASCII and the clock is past the epoch; the shortcut must never let
through a task that the walk would refuse, and must build the same task. Method: Hypothesis
draws the arguments that pass ``add_dead_task``'s own checks, with exceptions of any class
name, message and traceback (file names and function names of any text, lone surrogates
included, over-long ones too), any task class and any clock; the task is also built step by
step as before the shortcut, and ``dead_task_for`` must raise ``ValueError`` exactly when
``dead_problem`` refuses it, and otherwise return it.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from deferq._core.deadcodec import dead_problem
from deferq._core.limits import (
    BACKTRACE_FRAME_CHARS_MAX,
    EXCEPTION_CLASS_CHARS_MAX,
    EXCEPTION_MESSAGE_CHARS_MAX,
)
from deferq._core.taskid import id_seed
from deferq._core.types import DeadTask, dead_task_of
from deferq.backends._deadtask import (
    _clip,
    _safe_str,
    dead_task_for,
    exception_backtrace,
    exception_class_name,
)
from tests.property.test_codec_properties import task_ids

ANY_TEXT = st.text(max_size=12)  # lone surrogates included
LONG = st.integers(0, 3).map(lambda k: "é" * (k * BACKTRACE_FRAME_CHARS_MAX // 2))


@st.composite
def exceptions(draw: st.DrawFn) -> BaseException:
    """An exception raised through code compiled under a drawn file and function name."""
    name = draw(st.text(min_size=1, max_size=12) | st.just("C" * (EXCEPTION_CLASS_CHARS_MAX + 5)))
    try:
        cls = type(name, (RuntimeError,), {})
    except (UnicodeEncodeError, ValueError, TypeError):
        cls = RuntimeError
    message = draw(ANY_TEXT | st.just("m" * (EXCEPTION_MESSAGE_CHARS_MAX + 1)))
    filename = draw(ANY_TEXT) + draw(LONG)
    func = draw(st.sampled_from(["f", "g_é", "h" * 10]))
    depth = draw(st.integers(0, 3))
    source = f"def {func}(n, raise_it):\n    if n:\n        {func}(n - 1, raise_it)\n" \
             f"    raise_it()\n"
    namespace: dict[str, object] = {}
    try:
        exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - test-built code
    except (ValueError, UnicodeEncodeError, SyntaxError):
        exec(compile(source, "plain.py", "exec"), namespace)  # noqa: S102

    def raise_it() -> None:
        raise cls(message)

    try:
        namespace[func](depth, raise_it)  # type: ignore[operator]
    except RuntimeError as exc:
        return exc
    raise AssertionError("unreachable")


def built_step_by_step(task_id: str, context: bytes, exception: BaseException,
                       task_class: str, attempts: int, failed_at: int) -> DeadTask:
    """The task as ``add_dead_task`` built it before the shortcut (then checked in full)."""
    return dead_task_of(
        task_id, task_class, attempts, id_seed(task_id), failed_at,
        exception_class_name(exception),
        _clip(_safe_str(exception), EXCEPTION_MESSAGE_CHARS_MAX),
        exception_backtrace(exception), context)


@pytest.mark.spec("F-17", "C-7")
@settings(max_examples=300, deadline=None)
@given(task_id=task_ids, context=st.binary(max_size=16), exception=exceptions(),
       task_class=st.text(min_size=1, max_size=8) | st.just("app.Task"),
       attempts=st.integers(0, 2**40), failed_at=st.integers(-5, 2**40))
@example(task_id="a", context=b"", exception=RuntimeError("\ud800"), task_class="\udc00",
         attempts=0, failed_at=0)
@example(task_id="a", context=b"", exception=RuntimeError("x"), task_class="T",
         attempts=0, failed_at=-1)
def test_the_shortcut_past_dead_problem_never_lets_a_refused_task_through(
        task_id: str, context: bytes, exception: BaseException, task_class: str,
        attempts: int, failed_at: int) -> None:
    expected = built_step_by_step(task_id, context, exception, task_class, attempts,
                                  failed_at)
    problem = dead_problem(expected)
    if task_class.isascii() and failed_at >= 0:
        assert problem is None  # the claim the shortcut rests on
    if problem is None:
        assert dead_task_for(task_id, context, exception, task_class, attempts,
                             failed_at) == expected
    else:
        with pytest.raises(ValueError, match="cannot be stored"):
            dead_task_for(task_id, context, exception, task_class, attempts, failed_at)


@pytest.mark.spec("F-17", "C-7")
def test_a_lone_surrogate_in_task_class_or_a_clock_before_the_epoch_is_refused() -> None:
    exc = RuntimeError("x")
    with pytest.raises(ValueError, match="lone surrogates"):
        dead_task_for("a", b"", exc, "app.\ud800", 1, 0)
    with pytest.raises(ValueError, match="times must be >= 0"):
        dead_task_for("a", b"", exc, "app.Task", 1, -1)
