"""Fixtures of the PostgreSQL backend's tests: one throwaway server per pytest process, one
schema per test.

Goal: tests against a real server (issue 19) that are safe under xdist and leave nothing
behind. Method: ``pg_cluster`` (session scope, so once per xdist worker process) runs initdb in
a temporary directory as an unprivileged user and starts the server on a Unix socket there
(``tests/postgres/cluster.py``); ``pg`` gives each test a fresh schema name and drops it
afterwards. Where the server binaries or psycopg are missing the tests skip, saying which;
with ``DEFERQ_REQUIRE_POSTGRES=1`` (set by scripts/check.sh, so in CI) they fail instead,
so CI can never pass with them all skipped.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.postgres.cluster import Cluster, server_bin_dir

REQUIRE = "DEFERQ_REQUIRE_POSTGRES"
_schemas = itertools.count(1)


def _unavailable(reason: str) -> None:
    if os.environ.get(REQUIRE) == "1":
        pytest.fail(f"{reason}, and {REQUIRE}=1 says these tests must run "
                    "(scripts/setup.sh installs PostgreSQL and psycopg)")
    pytest.skip(f"{reason}: install them with scripts/setup.sh to run the PostgreSQL tests")


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    try:
        import psycopg  # noqa: F401
    except ImportError:
        _unavailable("psycopg is not installed")
    bin_dir = server_bin_dir()
    if bin_dir is None:
        _unavailable("no PostgreSQL server binaries (initdb) found")
    assert bin_dir is not None
    cluster = Cluster(bin_dir)
    try:
        cluster.init()
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


@dataclass(frozen=True)
class PgSchema:
    """A test's database: connect with ``dsn``, keep deferq's tables in ``schema``."""

    cluster: Cluster
    dsn: str
    schema: str

    def sql(self, query: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        """Run one statement on a fresh connection, ``{s}`` standing for the quoted schema."""
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            cur = conn.execute(query.replace("{s}", f'"{self.schema}"'), params)
            return cur.fetchall() if cur.description else []

    def terminate(self, pid: int) -> None:
        """``pg_terminate_backend(pid)``, then wait until that session is gone (the server
        ends it asynchronously)."""
        self.sql("SELECT pg_terminate_backend(%s)", (pid,))
        deadline = time.monotonic() + 20
        while self.sql("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)):
            assert time.monotonic() < deadline, f"session {pid} was not terminated"
            time.sleep(0.01)


@pytest.fixture
def pg(pg_cluster: Cluster) -> Iterator[PgSchema]:
    import psycopg

    schema = f"t{os.getpid()}_{next(_schemas)}"
    yield PgSchema(pg_cluster, pg_cluster.dsn, schema)
    if pg_cluster.running:
        with psycopg.connect(pg_cluster.dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
