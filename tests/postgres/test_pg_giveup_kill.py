"""The give-up handoff interrupted before each of its statements and before its commit: the
task is pending or dead, never neither, never both (spec/postgres.md P-30, P-43).

Goal: issue 19's "the queue keeps its give-up order" under connection kills and server
crashes, statement by statement rather than by luck of timing. Method: the backend's give-up
probe (P-43) runs before each step of the transaction (``begin``: after BEGIN; ``locked``:
after the fencing ``SELECT ... FOR UPDATE``; ``inserted``: after the dead row's INSERT;
``deleted``: after the pending row's DELETE, before COMMIT). At one step it terminates the
session with ``pg_terminate_backend`` (once: the retry on a fresh connection must then
complete the handoff; on every attempt: the call must raise ``PostgresError`` and change
nothing), or crashes the server (``pg_ctl stop -m immediate``, fsync on), which is then
restarted: the task must still be pending and not dead.
"""

from __future__ import annotations

import pytest

from deferq.backends import Postgres, PostgresError
from tests.postgres.conftest import PgSchema

STEPS = ("begin", "locked", "inserted", "deleted")


def _state(pg: PgSchema, tid: str) -> tuple[bool, bool]:
    """(pending, dead) of ``tid``."""
    return (bool(pg.sql("SELECT 1 FROM {s}.pending WHERE id = %s", (tid,))),
            bool(pg.sql("SELECT 1 FROM {s}.dead WHERE id = %s", (tid,))))


@pytest.mark.parametrize("how", ["terminate once", "terminate always", "crash"])
@pytest.mark.parametrize("step", STEPS)
@pytest.mark.spec("P-30", "P-43")
def test_an_interrupted_give_up_leaves_the_task_pending_or_dead_never_both(
        pg: PgSchema, step: str, how: str) -> None:
    with Postgres(dsn=pg.dsn, schema=pg.schema, create_schema=True) as worker:
        worker.start_claiming()
        tid = worker.add_task(b"ctx")  # held by this worker, as a running queue's task is
        fired: list[int] = []

        def probe(name: str, pid: int) -> None:
            if name == step and (not fired or how == "terminate always"):
                fired.append(pid)
                if how == "crash":
                    pg.cluster.stop("immediate")
                else:
                    pg.terminate(pid)

        worker._give_up_probe = probe
        try:
            if how == "terminate once":
                assert worker.add_dead_task(tid, b"ctx", RuntimeError("boom"), task_class="K",
                                            attempts=1) == tid
            else:
                with pytest.raises(PostgresError, match="add a dead task|cannot connect"):
                    worker.add_dead_task(tid, b"ctx", RuntimeError("boom"), task_class="K",
                                         attempts=1)
        finally:
            worker._give_up_probe = None
            if not pg.cluster.running:
                pg.cluster.start()
        assert len(fired) == {"terminate once": 1, "terminate always": 2, "crash": 1}[how]
        expected = (False, True) if how == "terminate once" else (True, False)
        assert _state(pg, tid) == expected, (step, how)
        # The worker goes on: the next give-up (no probe) completes the handoff.
        worker.add_dead_task(tid, b"ctx", RuntimeError("boom"), task_class="K", attempts=2)
        assert _state(pg, tid) == (False, True)
