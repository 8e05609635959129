"""The dead task a backend stores for a task that gave up: the exception's class, message and
backtrace with its chain, clipped to the format's limits (spec/format.md F-10, F-17, F-18).

Rules: pure functions of the exception and the arguments (already checked by the caller);
the result satisfies F-17 or a ``ValueError`` says which limit it breaks.
"""

from __future__ import annotations

from deferq._core.deadcodec import dead_problem
from deferq._core.limits import (
    BACKTRACE_FRAME_CHARS_MAX,
    BACKTRACE_FRAMES_MAX,
    CHAIN_EXCEPTIONS_MAX,
    CHAIN_FRAMES_MAX,
    EXCEPTION_CLASS_CHARS_MAX,
    EXCEPTION_MESSAGE_CHARS_MAX,
    INT_FIELD_MAX,
    TASK_CLASS_BYTES_MAX,
)
from deferq._core.taskid import id_seed
from deferq._core.types import DeadTask, dead_task_of

_TRUNCATED = "...[truncated]"


def _clip(text: str, limit: int) -> str:
    """Escape lone surrogates (F-17 text is UTF-8) and cut to ``limit`` characters."""
    if not text.isascii():  # ASCII (the usual case) has no surrogates to escape
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else text[: limit - len(_TRUNCATED)] + _TRUNCATED


def task_class_name(text: str) -> str:
    """``text`` as a dead task's ``task_class`` (F-17, Q-31): lone surrogates escaped, and cut to
    ``TASK_CLASS_BYTES_MAX`` UTF-8 bytes at a character boundary, marked as cut.

    For a name read from a record that could not be loaded: any text it holds is stored,
    so such a task is always dead-lettered with its reason and never stays pending.
    """
    safe = text if text.isascii() else text.encode("utf-8", "backslashreplace").decode("utf-8")
    data = safe.encode("utf-8")
    if len(data) <= TASK_CLASS_BYTES_MAX:
        return safe or "<empty>"
    keep = data[:TASK_CLASS_BYTES_MAX - len(_TRUNCATED)].decode("utf-8", "ignore")
    return keep + _TRUNCATED


def exception_class_name(exception: BaseException) -> str:
    """``module.QualName``, or just the name for builtins (F-10)."""
    cls = type(exception)
    module = cls.__module__
    name = cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"
    return _clip(name, EXCEPTION_CLASS_CHARS_MAX)


def exception_backtrace(exception: BaseException) -> tuple[str, ...]:
    """The backtrace of F-17 and F-18: the frames nearest the raise, outermost first, then
    for each exception of its chain a header line and that exception's frames nearest its
    raise, at most BACKTRACE_FRAMES_MAX lines in all."""
    chain = _chain(exception)
    if not chain:  # the usual case: no cause, no context
        return _frames(exception, BACKTRACE_FRAMES_MAX)
    tail: list[str] = []
    for label, link in chain:
        # Implements F-18: "[cause] " or "[context] ", then the class and message.
        tail.append(_clip(f"[{label}] {exception_class_name(link)}: {_safe_str(link)}",
                          BACKTRACE_FRAME_CHARS_MAX))
        tail.extend(_frames(link, CHAIN_FRAMES_MAX))
    return _frames(exception, BACKTRACE_FRAMES_MAX - len(tail)) + tuple(tail)


def _chain(exception: BaseException) -> list[tuple[str, BaseException]]:
    """The exceptions chained to ``exception`` as Python prints them, nearest first: its
    ``__cause__``, else its ``__context__`` unless suppressed; at most CHAIN_EXCEPTIONS_MAX,
    and each exception once (a chain can loop)."""
    seen = {id(exception)}
    chain: list[tuple[str, BaseException]] = []
    current = exception
    while len(chain) < CHAIN_EXCEPTIONS_MAX:
        if current.__cause__ is not None:
            label, link = "cause", current.__cause__
        elif current.__context__ is not None and not current.__suppress_context__:
            label, link = "context", current.__context__
        else:
            break
        if id(link) in seen:
            break
        seen.add(id(link))
        chain.append((label, link))
        current = link
    return chain


def _frames(exception: BaseException, count: int) -> tuple[str, ...]:
    """The ``count`` frames of ``exception``'s traceback nearest the raise, outermost first."""
    # The traceback chain walked by hand (what traceback.walk_tb yields, without its
    # generator; no source-line lookups as extract_tb does): part of every give-up.
    links = []
    tb = exception.__traceback__
    while tb is not None:
        links.append(tb)
        tb = tb.tb_next
    frames = []
    for tb in links[-count:] if count > 0 else ():
        code = tb.tb_frame.f_code
        text = f"{code.co_filename}:{tb.tb_lineno}:in {code.co_name}"
        frames.append(text if len(text) <= BACKTRACE_FRAME_CHARS_MAX and text.isascii()
                      else _clip(text, BACKTRACE_FRAME_CHARS_MAX))
    return tuple(frames)


def dead_task_for(task_id: str, context: bytes, exception: BaseException, task_class: str,
                  attempts: int, failed_at: int, enqueued_at: int | None = None) -> DeadTask:
    """The dead task ``Disk.add_dead_task`` stores, checked against F-17.

    ``enqueued_at`` is when the task was first enqueued, as the caller knows it; None
    stores the id's seed instead (F-17), which is all a caller without it can give.

    The arguments passed ``add_dead_task``'s checks (a valid id, a context and a
    non-empty ``task_class`` within their limits, ``attempts`` >= 0).

    Raises:
        ValueError: the task breaks an F-17 limit (a lone surrogate in ``task_class``,
            a clock before the epoch).
    """
    task = dead_task_of(  # DeadTask(id=task_id, task_class=task_class, ...), cheaper (F-10)
        task_id, task_class, attempts, id_seed(task_id) if enqueued_at is None else enqueued_at,
        failed_at,
        exception_class_name(exception),
        _clip(_safe_str(exception), EXCEPTION_MESSAGE_CHARS_MAX),
        exception_backtrace(exception), context)
    # F-17 holds by construction when task_class is ASCII and the clock is past the epoch:
    # the id, context, task_class and attempts were checked by the caller, enqueued_at is
    # id_seed's (>= 0), and the exception's class, message and frames are cut to their
    # limits with every lone surrogate escaped (_clip, exception_backtrace); a property
    # test checks it. Only the other cases pay for dead_problem's full walk.
    if not (task_class.isascii() and 0 <= failed_at <= INT_FIELD_MAX):
        problem = dead_problem(task)
        if problem is not None:
            raise ValueError(f"dead task {task_id!r} cannot be stored: {problem}")
    return task


def _safe_str(exception: BaseException) -> str:
    try:
        return str(exception)
    except Exception as exc:  # noqa: BLE001 - a broken __str__ must not stop dead-lettering.
        return f"<str() of the exception raised {type(exc).__name__}>"
