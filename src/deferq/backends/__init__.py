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

from deferq.backends.disk import Disk
from deferq.backends.memory import Memory
from deferq.backends.nil import Nil
from deferq.backends.postgres import Postgres, PostgresError
from deferq.backends.protocol import Backend

__all__ = ["Backend", "Disk", "Memory", "Nil", "Postgres", "PostgresError"]
