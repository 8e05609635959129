"""Checks of the arguments every backend's public methods take (spec/api.md C-7).

Rules: each check raises ``ValueError`` (``LimitExceededError`` for a value over a format
limit) naming the argument and what is allowed, before any I/O; a backend calls them
first, so a bad argument changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

from deferq._core.errors import LimitExceededError
from deferq._core.limits import CONTEXT_BYTES_MAX, INT_FIELD_MAX, TASK_CLASS_BYTES_MAX
from deferq._core.taskid import caller_id_problem, check_task_id


def check_context(context: object) -> bytes:
    if not isinstance(context, (bytes, bytearray, memoryview)):
        raise ValueError(f"context must be bytes, not {type(context).__name__}")
    data = bytes(context)
    if len(data) > CONTEXT_BYTES_MAX:
        raise LimitExceededError(
            f"context is {len(data)} bytes; the most a task can carry is {CONTEXT_BYTES_MAX}")
    return data


def check_publish_at(publish_at: object) -> int | None:
    if publish_at is None:
        return None
    if isinstance(publish_at, bool) or not isinstance(publish_at, int) or publish_at <= 0:
        raise ValueError(f"publish_at {publish_at!r} must be None or a positive int (epoch seconds)")
    if publish_at >= 10**18:
        raise ValueError(f"publish_at {publish_at!r} is beyond any plausible epoch second")
    return publish_at


def check_caller_id(task_id: object) -> str:
    """An id a caller gives ``add_task``: valid (F-5) and with a seed that leaves generated
    ids room to grow (C-24)."""
    tid = check_task_id(task_id)
    problem = caller_id_problem(tid)
    if problem is not None:
        raise ValueError(f"invalid task_id {tid!r}: it {problem}")
    return tid


def check_count(name: str, value: object, *, allow_none: bool) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, not {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must not be negative, got {value}")
    return value



def check_dead_task(task_id: object, context: object, exception: object, task_class: object,
                    attempts: object, enqueued_at: object = None
                    ) -> tuple[str, bytes, BaseException, str, int, int | None]:
    """The arguments of ``add_dead_task``, checked (C-7, C-23): id, context, exception, class,
    attempts and the time the task was first enqueued (None: not known)."""
    tid = check_task_id(task_id)
    data = check_context(context)
    if not isinstance(exception, BaseException):
        raise ValueError(f"exception must be an exception instance, not "
                         f"{type(exception).__name__}")
    if not isinstance(task_class, str) or not task_class:
        raise ValueError(f"task_class must be a non-empty str, got {task_class!r}")
    if len(task_class.encode("utf-8", "surrogatepass")) > TASK_CLASS_BYTES_MAX:
        raise LimitExceededError(f"task_class must be at most {TASK_CLASS_BYTES_MAX} bytes")
    count = check_count("attempts", attempts, allow_none=False)
    assert count is not None
    if count > INT_FIELD_MAX:  # Implements F-19 at the call.
        raise ValueError(f"attempts must be at most {INT_FIELD_MAX} (2**63 - 1), the largest "
                         f"integer a dead-task record holds")
    # Implements C-23: an epoch second the format can store (F-17).
    first = check_count("enqueued_at", enqueued_at, allow_none=True)
    if first is not None and first > INT_FIELD_MAX:
        raise ValueError(f"enqueued_at must be at most {INT_FIELD_MAX} (2**63 - 1), the "
                         f"largest integer a dead-task record holds")
    return tid, data, exception, task_class, count, first


def check_ids(ids: object) -> set[str]:
    """The distinct ids of ``remove_dead_tasks(ids)`` (C-7, C-8): a ``str`` is one id."""
    if ids is None:
        return set()
    if isinstance(ids, (bytes, bytearray, memoryview)):
        # Iterable, but of ints: say what was passed rather than complain about an int id.
        raise ValueError(f"ids must be a task id (str), an iterable of task ids or None, "
                         f"not {type(ids).__name__}; decode it first")
    if isinstance(ids, str):
        return {check_task_id(ids, argument="id")}
    if isinstance(ids, Iterable):
        return {check_task_id(i, argument="id") for i in ids}
    raise ValueError(f"ids must be a task id, an iterable of task ids or None, not "
                     f"{type(ids).__name__}")


def check_page(limit: object, offset: object) -> tuple[int | None, int]:
    """The ``limit`` and ``offset`` of ``list_dead_tasks`` (C-7)."""
    lim = check_count("limit", limit, allow_none=True)
    off = check_count("offset", offset, allow_none=False)
    assert off is not None
    return lim, off
