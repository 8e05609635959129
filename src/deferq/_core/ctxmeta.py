"""PURE: a task's metadata, string keys and values stored in its context record (spec/queue.md Q-66).

Theory of operation: the queue stores the mapping as the ``meta`` field of the task's JSON
context record, so it travels with the context: through retries, a restart's replay, the
give-up into the dead-task store (whose record keeps the context, F-10) and an operator's
retry, with no change to any byte layout of spec/format.md. ``meta_problem`` is the one
rule, used by the writer (a ``ValueError`` at enqueue) and by both readers (the queue's, a
``ContextError``; the dead task's ``meta``, which shows nothing rather than fail).

This module imports nothing that does I/O; CrossHair checks its contracts.
"""

from __future__ import annotations

import json

from deferq._core.limits import META_BYTES_MAX, META_ITEMS_MAX


def meta_problem(meta: object) -> str | None:
    """Say what is wrong with a metadata mapping, or return None when it is valid (Q-66).

    post: __return__ is not None or isinstance(meta, dict)
    """
    if not isinstance(meta, dict):
        return f"must be a mapping of str to str, not {type(meta).__name__}"
    if len(meta) > META_ITEMS_MAX:
        return f"has {len(meta)} entries; at most {META_ITEMS_MAX} are allowed"
    size = 0
    for key, value in meta.items():
        if not isinstance(key, str) or not key:
            return f"has the key {key!r}; keys must be non-empty str"
        if not isinstance(value, str):
            return f"has a {type(value).__name__} value for {key!r}; values must be str"
        try:
            size += len(key.encode("utf-8")) + len(value.encode("utf-8"))
        except UnicodeEncodeError:
            return f"entry {key!r} is not encodable as UTF-8 (a lone surrogate)"
    if size > META_BYTES_MAX:
        return f"holds {size} bytes of keys and values; at most {META_BYTES_MAX} are allowed"
    return None


def context_meta(context: bytes) -> dict[str, str]:
    """The metadata of a queue's JSON context record (Q-66), or ``{}``.

    ``{}`` when the context has none, is not a JSON context record (a pickled one, Q-34,
    keeps its metadata inside the pickle, which no operator opens), or its ``meta`` breaks
    ``meta_problem``: an operator's view must never fail on what a record holds.
    """
    if not context.startswith(b"{") or b'"meta"' not in context:
        return {}
    try:
        record = json.loads(context.decode("utf-8"))
    except (ValueError, RecursionError):
        return {}
    if not isinstance(record, dict) or record.get("v") not in (1, 2):
        return {}
    meta = record.get("meta")
    if meta_problem(meta) is not None:
        return {}
    assert isinstance(meta, dict)
    return dict(meta)
