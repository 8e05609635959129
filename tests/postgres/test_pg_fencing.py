"""Owner fencing, one write at a time: a claiming worker whose lease ran out cannot remove,
replace or dead-letter a task another worker now holds under a live lease (spec/postgres.md
P-41); once that lease runs out too, or for a backend that does not claim, the write applies.
"""

from __future__ import annotations

import logging

import pytest

from deferq.backends import Postgres
from tests.postgres.conftest import PgSchema


def _row(pg: PgSchema, tid: str) -> list[tuple[object, ...]]:
    return pg.sql("SELECT context, lease_owner FROM {s}.pending WHERE id = %s", (tid,))


def _expire(pg: PgSchema) -> None:
    pg.sql("UPDATE {s}.pending SET lease_until = now() - interval '1 second' "
           "WHERE lease_owner IS NOT NULL")


@pytest.mark.spec("P-41", "P-25", "P-55", "P-57", "P-58")
def test_a_worker_whose_lease_ran_out_cannot_undo_the_new_holders_claim(
        pg: PgSchema, caplog: pytest.LogCaptureFixture) -> None:
    with Postgres(dsn=pg.dsn, schema=pg.schema, create_schema=True) as a, \
            Postgres(dsn=pg.dsn, schema=pg.schema) as b, \
            Postgres(dsn=pg.dsn, schema=pg.schema) as producer:
        a.start_claiming()
        b.start_claiming()
        tid = a.add_task(b"v1")
        _expire(pg)  # a stalled past its lease
        assert [t.task_id for t in b.claim_due(5)] == [tid]
        a.remove_task(tid)
        assert _row(pg, tid) == [(b"v1", b.owner)]
        assert a.add_task(b"v2", None, tid) == tid
        assert _row(pg, tid) == [(b"v1", b.owner)]
        with caplog.at_level(logging.WARNING, logger="deferq.postgres"):
            assert a.add_dead_task(tid, b"v1", RuntimeError("late"), task_class="K",
                                   attempts=1) == tid
        assert "was not dead-lettered" in caplog.text and tid in caplog.text
        assert pg.sql("SELECT id FROM {s}.dead") == []
        assert _row(pg, tid) == [(b"v1", b.owner)]
        assert a.renew_claims() == 0 and b.renew_claims() == 1
        # b's lease runs out too: the task is nobody's, and a's late removal applies.
        _expire(pg)
        a.remove_task(tid)
        assert _row(pg, tid) == []
        # A backend that does not claim is not fenced (the operator, a producer).
        other = b.add_task(b"held")
        producer.remove_task(other)
        assert _row(pg, other) == []


@pytest.mark.spec("P-41", "P-56")
def test_a_claim_during_a_give_up_skips_the_task_the_handoff_has_locked(
        pg: PgSchema) -> None:
    with Postgres(dsn=pg.dsn, schema=pg.schema, create_schema=True) as a, \
            Postgres(dsn=pg.dsn, schema=pg.schema) as b:
        a.start_claiming()
        b.start_claiming()
        first, second = a.add_task(b"1"), a.add_task(b"2")
        _expire(pg)
        # While a's give-up holds the row's lock, b's claim skips it (SKIP LOCKED), so the
        # handoff completes and b never gets the task.
        claimed: list[list[str]] = []

        def probe(step: str, pid: int) -> None:
            if step == "inserted":
                claimed.append([t.task_id for t in b.claim_due(5)])

        a._give_up_probe = probe
        a.add_dead_task(first, b"1", RuntimeError("x"), task_class="K", attempts=1)
        a._give_up_probe = None
        assert claimed == [[second]]
        assert pg.sql("SELECT id FROM {s}.dead") == [(first,)]
        assert _row(pg, first) == []
        assert _row(pg, second) == [(b"2", b.owner)]
