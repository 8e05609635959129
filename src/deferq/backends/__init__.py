"""The storage backends the queue runs on, one module each, behind one protocol.

- ``Disk`` (``disk``): a tasks WAL per worker and a shared dead-task store in a directory.
- ``Nil`` (``nil``): stores nothing.
- ``Postgres`` (``postgres``): pending and dead tasks in a PostgreSQL database shared by
  several workers and hosts; needs ``pip install 'deferq[postgres]'`` (psycopg is imported
  only when one is made).
- ``Memory`` (``memory``): ``Disk``'s semantics in memory, for tests (``deferq.testing``).
- ``Backend`` (``protocol``): what the queue and the operator tools require of a backend;
  a new backend implements it (spec/api.md).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from deferq.backends.disk import Disk
    from deferq.backends.memory import Memory
    from deferq.backends.nil import Nil
    from deferq.backends.postgres import Postgres, PostgresError
    from deferq.backends.protocol import Backend

# Where each public name lives. Why on first use (PEP 562): importing one backend module
# (``deferq.backends._options`` for an operator command) imports this package first, and
# with it every backend; see ``deferq/__init__.py``.
_MODULE_OF: Final = {
    "Backend": "deferq.backends.protocol",
    "Disk": "deferq.backends.disk",
    "Memory": "deferq.backends.memory",
    "Nil": "deferq.backends.nil",
    "Postgres": "deferq.backends.postgres",
    "PostgresError": "deferq.backends.postgres",
}


def __getattr__(name: str) -> object:
    """Import a public name on its first use and keep it in this package."""
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'deferq.backends' has no attribute {name!r}")
    value: object = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

__all__ = ["Backend", "Disk", "Memory", "Nil", "Postgres", "PostgresError"]
