"""Checks of the arguments every backend's public methods take (spec/api.md C-7).

Rules: each check raises ``ValueError`` (``LimitExceededError`` for a value over a format
limit) naming the argument and what is allowed, before any I/O; a backend calls them
first, so a bad argument changes nothing.
"""

from __future__ import annotations

from deferq._core.errors import LimitExceededError
from deferq._core.limits import CONTEXT_BYTES_MAX


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


def check_count(name: str, value: object, *, allow_none: bool) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, not {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must not be negative, got {value}")
    return value
