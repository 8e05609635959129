"""The JSON document a conformance reader prints for one storage directory.

Rules: the shape is fixed here and in conformance/README.md:
``{"prefix", "pending", "dead", "damage": {"wal": {label: n}, "dead": {label: n}}}``.
``pending`` lists tasks in replay order as ``{"id", "publish_at", "context_base64"}``
(``publish_at`` null for an immediate task); ``dead`` lists the dead tasks newest first,
each with every F-10 field under its F-10 name (``context`` as canonical base64, as in the
file); ``damage`` counts lines per recovery-table label (R-@B to R-@F, R-@K, and R-@G for
the dead-task records a reader logs as undecodable), leaving out labels never met.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence

from deferq._core.types import DeadTask, PendingTask

Json = dict[str, "Json"] | list["Json"] | str | int | float | bool | None


def pending_json(task: PendingTask) -> Json:
    return {"id": task.task_id, "publish_at": task.publish_at,
            "context_base64": base64.b64encode(task.context).decode("ascii")}


def dead_json(task: DeadTask) -> Json:
    return {
        "id": task.id, "task_class": task.task_class, "attempts": task.attempts,
        "enqueued_at": task.enqueued_at, "failed_at": task.failed_at,
        "exception_class": task.exception_class, "exception_message": task.exception_message,
        "backtrace": list(task.backtrace),
        "context": base64.b64encode(task.context).decode("ascii"),
    }


def report(prefix: str, pending: Sequence[PendingTask], dead: Sequence[DeadTask],
           wal_damage: Mapping[str, int], dead_damage: Mapping[str, int]) -> Json:
    """The whole document; zero counts are left out so that readers need not list every label."""
    return {
        "prefix": prefix,
        "pending": [pending_json(t) for t in pending],
        "dead": [dead_json(t) for t in dead],
        "damage": {"wal": {k: v for k, v in sorted(wal_damage.items()) if v},
                   "dead": {k: v for k, v in sorted(dead_damage.items()) if v}},
    }
