"""A stateful crash suite for the PostgreSQL backend: several real workers and the pure model,
driven together against a real server that is crashed for real (spec/postgres.md P-40..P-44).

Goal: issue 19's "the same pure model checks it": no acknowledged task lost, nothing
invented, the give-up handoff atomic, and a worker whose lease ran out unable to undo the
new holder's claim, on generated histories with connection kills and server crashes
anywhere. Method: a Hypothesis ``RuleBasedStateMachine`` runs three claiming workers and a
producer, each its own ``Postgres`` (its own connection), on one schema of the throwaway
cluster (``fsync=on``), and mirrors every operation into ``StorageModel`` (every write is
durable when it returns, P-16, so an acknowledged write is marked durable) and into a model
of the claims (who holds each task, whether the lease is live, which ids each backend
renews). Rules add, re-add, remove, claim, renew, give up, retry and remove dead tasks; let a
worker's leases run out (the lease's end is moved into the past on the server: the driven
clock of this suite, equivalent to the worker stalling past its lease); terminate a
worker's connection while it is idle (the next call must succeed, P-6) or while its
statement waits on a table lock (the call either is acknowledged and then visible, or raises
``PostgresError`` and the model records a write that may or may not have happened); kill
the give-up transaction's connection, or crash the whole server, before any one of its
statements or its commit (P-43); and crash the server between operations with ``pg_ctl
stop -m immediate`` or a SIGKILL of every server process, restart it, and check every
acknowledged operation with ``StorageModel.check_recovered`` (P-44). After every step the
pending table, the dead table and the claims must equal the models exactly.

``DEFERQ_PG_EXAMPLES`` (default 4) sets the number of examples; the default run takes a
few seconds (``DEFERQ_PG_EXAMPLES=100`` is a soak). No rule has a precondition on what the
server did: a kill's timing decides whether a call was acknowledged, and Hypothesis must see
the same rules enabled when it replays a choice sequence, so the rules return early instead.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)

from deferq._core.model import Crash, Dead, Pending, StorageModel
from deferq.backends import Postgres, PostgresError
from tests.postgres.conftest import PgSchema

WORKERS = 3
PRODUCER = WORKERS  # index of the producer: a backend that does not claim
LEASE_S = 120.0  # never runs out by itself here; the ``expire`` rule ends leases
EXAMPLES = int(os.environ.get("DEFERQ_PG_EXAMPLES", "4"))
STEPS = int(os.environ.get("DEFERQ_PG_STEPS", "30"))
CRASHES = int(os.environ.get("DEFERQ_PG_CRASHES", "1"))  # server crashes per example (~1 s each)
GIVE_UP_STEPS = ("begin", "locked", "inserted", "deleted")
_machines = itertools.count(1)

workers = st.integers(0, WORKERS - 1)
callers = st.integers(0, WORKERS)  # a worker or the producer
picks = st.integers(0, 1_000_000)
publish_kinds = st.sampled_from(["now", "past", "future"])


@dataclass
class Claim:
    owner: int
    live: bool


class PgMachine(RuleBasedStateMachine):
    def __init__(self, pg: PgSchema) -> None:
        super().__init__()
        if not pg.cluster.running:  # a failed example (while shrinking) left it stopped
            pg.cluster.start()
        self.db = PgSchema(pg.cluster, pg.dsn, f"{pg.schema}_m{next(_machines)}")
        note(f"schema {self.db.schema}")
        self.backends = [Postgres(dsn=pg.dsn, schema=self.db.schema, lease_seconds=LEASE_S,
                                  create_schema=i == 0) for i in range(WORKERS + 1)]
        for worker in self.backends[:WORKERS]:
            worker.start_claiming()
        self.model = StorageModel()
        self.claims: dict[str, Claim] = {}
        self.held: list[set[str]] = [set() for _ in range(WORKERS)]
        self.maybe_added: dict[bytes, Pending] = {}  # failed adds of a new id, by context
        self.order: dict[str, int] = {}  # the server's insertion order (seq) of pending ids
        self.contexts = itertools.count(1)
        self.crashes = 0

    # ------------------------------------------------------------------ helpers
    def context(self) -> bytes:
        return b"ctx-%d" % next(self.contexts)

    def publish_at(self, kind: str) -> int | None:
        now = int(time.time())
        return {"now": None, "past": now - 100, "future": now + 3600}[kind]

    def pending_ids(self) -> list[str]:
        return sorted(self.model.pending())

    def fenced(self, caller: int, task_id: str) -> bool:
        """P-41: a claiming worker leaves alone a task another worker holds under a live lease."""
        claim = self.claims.get(task_id)
        return (caller != PRODUCER and claim is not None and claim.live
                and claim.owner != caller and task_id in self.model.pending())

    def take(self, caller: int, task_id: str) -> None:
        if caller == PRODUCER:
            self.claims.pop(task_id, None)  # a producer's add is free (P-21)
        else:
            self.claims[task_id] = Claim(caller, True)
            self.held[caller].add(task_id)

    def let_go(self, caller: int, task_id: str) -> None:
        if caller != PRODUCER:
            self.held[caller].discard(task_id)

    def observe(self) -> tuple[dict[str, Pending], dict[str, Dead], dict[str, Claim],
                               dict[str, int]]:
        pending, claims, order = {}, {}, {}
        owners = {b.owner: i for i, b in enumerate(self.backends)}
        for tid, context, publish_at, owner, live, seq in self.db.sql(
                "SELECT id, context, publish_at, lease_owner, lease_until >= now(), seq "
                "FROM {s}.pending"):
            assert isinstance(tid, str) and isinstance(context, bytes) and isinstance(seq, int)
            assert publish_at is None or isinstance(publish_at, int)
            pending[tid] = Pending(context, publish_at)
            order[tid] = seq
            if owner is not None:
                assert owner in owners, f"{tid} held by an unknown owner {owner!r}"
                claims[tid] = Claim(owners[str(owner)], bool(live))
        dead = {}
        for tid, context, task_class, attempts, message in self.db.sql(
                "SELECT id, context, task_class, attempts, exception_message FROM {s}.dead"):
            assert isinstance(tid, str) and isinstance(context, bytes)
            assert isinstance(task_class, str) and isinstance(attempts, int)
            assert isinstance(message, str)
            dead[tid] = Dead(context, task_class, attempts, message)
        return pending, dead, claims, order

    def settle(self) -> None:
        """After an operation that raised or a crash: the stored state must be one the model
        allows (every acknowledged write there, nothing invented); it is then adopted."""
        pending, dead, claims, order = self.observe()
        for tid, task in pending.items():
            if tid not in self.model.wal and self.maybe_added.get(task.context) == task:
                self.model.failed(self.model.add_task("pg", tid, task))  # a lost answer
        self.maybe_added.clear()
        violations = self.model.check_recovered(pending, dead)
        assert not violations, "\n".join(map(str, violations))
        self.claims, self.order = claims, order

    def run(self, caller: int, op: int, call: object) -> tuple[bool, object]:
        """Run ``call``; acknowledge ``op`` when it returned, else record it as failed."""
        assert callable(call)
        try:
            result = call()
        except PostgresError as exc:
            note(f"raised: {exc}")
            self.model.failed(op)
            return False, None
        self.model.acked(op, durable=True)
        return True, result

    # ------------------------------------------------------------------ pending tasks
    @rule(caller=callers, kind=publish_kinds)
    def add(self, caller: int, kind: str) -> None:
        context, when = self.context(), self.publish_at(kind)
        try:
            tid = self.backends[caller].add_task(context, when)
        except PostgresError:
            self.maybe_added[context] = Pending(context, when)
            self.settle()
            return
        self.model.acked(self.model.add_task("pg", tid, Pending(context, when)), durable=True)
        self.take(caller, tid)

    @rule(caller=callers, pick=picks, kind=publish_kinds)
    def readd(self, caller: int, pick: int, kind: str) -> None:
        if not self.model.pending():
            return
        ids = self.pending_ids()
        tid = ids[pick % len(ids)]
        task = Pending(self.context(), self.publish_at(kind))
        if self.fenced(caller, tid):
            assert self.backends[caller].add_task(task.context, task.publish_at, tid) == tid
            self.let_go(caller, tid)
            return
        op = self.model.add_task("pg", tid, task)
        done, got = self.run(caller, op, lambda: self.backends[caller].add_task(
            task.context, task.publish_at, tid))
        if not done:
            self.let_go(caller, tid)
            self.settle()
            return
        assert got == tid
        self.take(caller, tid)

    @rule(caller=callers, pick=picks)
    def remove(self, caller: int, pick: int) -> None:
        if not self.model.pending():
            return
        ids = self.pending_ids()
        tid = ids[pick % len(ids)]
        if self.fenced(caller, tid):
            self.backends[caller].remove_task(tid)
            self.let_go(caller, tid)
            return
        done, _ = self.run(caller, self.model.remove_task("pg", tid),
                           lambda: self.backends[caller].remove_task(tid))
        self.let_go(caller, tid)
        if done:
            self.claims.pop(tid, None)
        else:
            self.settle()

    # ------------------------------------------------------------------ claims
    @rule(worker=workers, limit=st.integers(1, 4))
    def claim(self, worker: int, limit: int) -> None:
        now = int(time.time())
        free = [tid for tid, task in self.model.pending().items()
                if (task.publish_at or 0) <= now
                and (tid not in self.claims or not self.claims[tid].live)]
        free.sort(key=lambda tid: ((self.model.pending()[tid].publish_at or 0), self.order[tid]))
        try:
            got = [t.task_id for t in self.backends[worker].claim_due(limit)]
        except PostgresError:
            self.settle()
            return
        assert got == free[:limit], (got, free)  # P-22: due and free, in due order
        for tid in got:
            self.take(worker, tid)

    @rule(worker=workers)
    def renew(self, worker: int) -> None:
        kept = {tid for tid in self.held[worker]
                if tid in self.claims and self.claims[tid].owner == worker}
        assert self.backends[worker].renew_claims() == len(kept)  # P-25
        self.held[worker] = kept
        for tid in kept:
            self.claims[tid].live = True

    @rule(worker=workers)
    def expire(self, worker: int) -> None:
        """The worker stalls past its lease: its leases end (P-23); it does not know yet."""
        self.db.sql("UPDATE {s}.pending SET lease_until = now() - interval '1 second' "
                    "WHERE lease_owner = %s", (self.backends[worker].owner,))
        for claim in self.claims.values():
            if claim.owner == worker:
                claim.live = False

    # ------------------------------------------------------------------ dead tasks
    def give_up_expected(self, worker: int, tid: str, attempts: int) -> tuple[Dead, bool]:
        context = self.model.pending()[tid].context if tid in self.model.pending() else b"gone"
        return Dead(context, "pg.K", attempts, f"failed {attempts}"), self.fenced(worker, tid)

    def give_up_call(self, worker: int, tid: str, dead: Dead) -> str:
        return self.backends[worker].add_dead_task(
            tid, dead.context, RuntimeError(dead.exception_message), task_class=dead.task_class,
            attempts=dead.attempts)

    def record_give_up(self, tid: str, dead: Dead) -> tuple[int, int]:
        return self.model.add_dead(tid, dead), self.model.remove_task("pg", tid)

    @rule(worker=workers, pick=picks, attempts=st.integers(1, 5))
    def give_up(self, worker: int, pick: int, attempts: int) -> None:
        if not self.model.pending():
            return
        ids = self.pending_ids()
        tid = ids[pick % len(ids)]
        dead, fenced = self.give_up_expected(worker, tid, attempts)
        if fenced:  # P-41: neither dead nor removed
            assert self.give_up_call(worker, tid, dead) == tid
            self.let_go(worker, tid)
            return
        add_op, remove_op = self.record_give_up(tid, dead)
        done, _ = self.run(worker, add_op, lambda: self.give_up_call(worker, tid, dead))
        self.let_go(worker, tid)
        if done:
            self.model.acked(remove_op, durable=True)
            self.claims.pop(tid, None)
        else:
            self.model.failed(remove_op)
            self.settle()

    @rule(worker=workers, pick=picks, step=st.sampled_from(GIVE_UP_STEPS),
          how=st.sampled_from(["terminate once", "terminate always", "crash"]))
    def give_up_interrupted(self, worker: int, pick: int, step: str, how: str) -> None:
        """P-43: the handoff's connection is terminated, or the server crashes, before one of
        its statements or its commit; dead and pending must still agree (both or neither)."""
        if not self.model.pending():
            return
        ids = self.pending_ids()
        tid = ids[pick % len(ids)]
        claim = self.claims.get(tid)
        if claim is not None and claim.live:
            worker = claim.owner  # the holder gives up (another worker would be fenced)
        if how == "crash" and self.crashes >= CRASHES:
            how = "terminate always"
        dead, fenced = self.give_up_expected(worker, tid, 1)
        assert not fenced
        fired: list[str] = []
        db = self.db

        def probe(name: str, pid: int) -> None:
            if name == step and (not fired or how == "terminate always"):
                fired.append(name)
                if how == "crash":
                    db.cluster.stop("immediate")
                else:
                    db.terminate(pid)

        backend = self.backends[worker]
        backend._give_up_probe = probe
        add_op, remove_op = self.record_give_up(tid, dead)
        try:
            done, _ = self.run(worker, add_op, lambda: self.give_up_call(worker, tid, dead))
        finally:
            backend._give_up_probe = None
            if not self.db.cluster.running:
                self.db.cluster.start()
        self.let_go(worker, tid)
        note(f"give-up of {tid} interrupted {how} at {fired}: {'acked' if done else 'raised'}")
        assert fired == [step] or (how == "terminate always" and fired == [step, step])
        if done:
            self.model.acked(remove_op, durable=True)
            self.claims.pop(tid, None)
        else:
            self.model.failed(remove_op)
            pending, dead_now, _, _ = self.observe()
            # An interrupted transaction is all or nothing: still pending and not dead.
            assert tid in pending and tid not in dead_now, (tid, step, how)
        if how == "crash":
            self.restart()
        elif not done:
            self.settle()

    @rule(pick=picks)
    def retry_dead(self, pick: int) -> None:
        """The operator's retry: a new pending task from the dead one, then the dead one goes."""
        if not self.model.dead_tasks():
            return
        dead = self.model.dead_tasks()
        tid = sorted(dead)[pick % len(dead)]
        producer = self.backends[PRODUCER]
        found = producer.find_dead_task(tid)
        assert found is not None and found.context == dead[tid].context
        self.add_known(PRODUCER, dead[tid].context)
        done, removed = self.run(PRODUCER, self.model.remove_dead([tid]),
                                 lambda: producer.remove_dead_tasks([tid]))
        assert removed == 1 or not done

    def add_known(self, caller: int, context: bytes) -> None:
        tid = self.backends[caller].add_task(context)
        self.model.acked(self.model.add_task("pg", tid, Pending(context, None)), durable=True)
        self.take(caller, tid)

    @rule(picks_=st.lists(picks, min_size=1, max_size=3))
    def remove_dead(self, picks_: list[int]) -> None:
        if not self.model.dead_tasks():
            return
        ids = sorted(self.model.dead_tasks())
        chosen = sorted({ids[p % len(ids)] for p in picks_})
        done, removed = self.run(PRODUCER, self.model.remove_dead(chosen),
                                 lambda: self.backends[PRODUCER].remove_dead_tasks(chosen))
        assert done and removed == len(chosen)

    # ------------------------------------------------------------------ faults
    @rule(caller=callers)
    def kill_idle_connection(self, caller: int) -> None:
        """P-6: a connection terminated while idle is noticed; the next call succeeds."""
        pid = self.db.sql("SELECT pid FROM pg_stat_activity WHERE backend_type = "
                          "'client backend' AND pid <> pg_backend_pid()")
        for (other,) in pid:
            assert isinstance(other, int)
            self.db.terminate(other)  # every backend's connection: each reconnects
        self.add_known(caller, self.context())  # must be acknowledged

    @rule(caller=callers, what=st.sampled_from(["add", "remove", "claim", "give up"]))
    def kill_mid_statement(self, caller: int, what: str) -> None:
        """P-6, P-42: a statement waiting on a lock has its connection terminated; the call
        is either acknowledged (a retried idempotent write) or raises, and nothing
        acknowledged is lost."""
        if what != "add" and not self.model.pending():
            return
        if what in ("claim", "give up") and caller == PRODUCER:
            caller = 0
        import psycopg

        with psycopg.connect(self.db.dsn) as lock:  # a transaction holding both tables
            lock.execute(f'LOCK TABLE "{self.db.schema}".pending, "{self.db.schema}".dead '
                         "IN ACCESS EXCLUSIVE MODE")
            action: Callable[[], None] = {"add": lambda: self.add(caller, "now"),
                      "remove": lambda: self.remove(caller, 0),
                      "claim": lambda: self.claim(caller, 2),
                      "give up": lambda: self.give_up(caller, 0, 1)}[what]
            errors: list[BaseException] = []

            def call() -> None:
                try:
                    action()
                except BaseException as exc:  # noqa: BLE001 - re-raised below
                    errors.append(exc)

            thread = threading.Thread(target=call)
            thread.start()
            waiter = self.wait_for_lock_waiter(thread)
            if waiter is not None:
                self.db.terminate(waiter)
                # A retried write reconnects and waits on the lock again; let it finish.
                time.sleep(0.05)
            lock.rollback()
        thread.join(30)
        assert not thread.is_alive(), f"{what} hung after its connection was terminated"
        if errors:
            raise errors[0]

    def wait_for_lock_waiter(self, thread: threading.Thread) -> int | None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            rows = self.db.sql("SELECT pid FROM pg_stat_activity WHERE wait_event_type = "
                               "'Lock' AND datname = current_database()")
            if rows:
                pid = rows[0][0]
                assert isinstance(pid, int)
                return pid
            if not thread.is_alive():
                return None  # fenced: the call changed nothing and sent nothing that waits
            time.sleep(0.005)
        raise AssertionError("the call never waited on the table lock")

    def restart(self) -> None:
        """After a crash: start the server (its recovery runs), then check every write."""
        cluster = self.db.cluster
        if not cluster.running:
            cluster.start()
        self.model.crash(Crash.PROCESS_KILL)
        self.crashes += 1
        self.settle()

    @rule(how=st.sampled_from(["immediate", "sigkill"]))
    def crash_server(self, how: str) -> None:
        """P-44: a real server crash (fsync=on); every acknowledged write survives it, and
        every worker's next call reconnects and succeeds."""
        if self.crashes >= CRASHES:
            return
        if how == "immediate":
            self.db.cluster.stop("immediate")
        else:
            self.db.cluster.kill()
        self.restart()
        for caller in range(WORKERS + 1):
            self.add_known(caller, self.context())  # each reconnects and is acknowledged

    # ------------------------------------------------------------------ invariants
    @invariant()
    def stored_state_is_the_models(self) -> None:
        pending, dead, claims, order = self.observe()
        assert pending == self.model.pending()
        assert dead == self.model.dead_tasks()
        assert claims == self.claims, "the claims differ from the model's"
        self.order = order

    def teardown(self) -> None:
        for backend in self.backends:
            backend.close()
        note(f"{self.crashes} server crashes")
        self.db.sql(f'DROP SCHEMA IF EXISTS "{self.db.schema}" CASCADE')


@pytest.mark.slow
@pytest.mark.spec("P-40", "P-41", "P-42", "P-43", "P-44", "M-20", "M-21", "M-32", "M-33", "M-34",
                  "P-59")
def test_postgres_backend_follows_the_model_through_kills_and_crashes(pg: PgSchema) -> None:
    class OnThisSchema(PgMachine):
        def __init__(self) -> None:
            super().__init__(pg)

    run_state_machine_as_test(
        OnThisSchema,
        settings=settings(max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None,
                          suppress_health_check=list(HealthCheck)))
