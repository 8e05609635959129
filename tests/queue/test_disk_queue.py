"""The queue over a real Disk in one process, and the context record as a property.

Goal: the transitions of Q-7..Q-9 leave exactly the expected files behind on a
real filesystem (retries in the WAL, give-ups in the dead-task store with the
task's backtrace, nothing else), a restart replays what is left, and every
JSON-shaped argument round-trips (Q-5). Method: a real ``Disk`` in pytest's
tmp directory with ``fsync_frequency=0``, a ``DrivenClock``, reopening the
``Disk`` to read what is durable; Hypothesis for the context record.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import deferq
from deferq._runtime.serialize import Context, decode_context, encode_context
from deferq.backends import Disk
from tests.queue.helpers import START, DrivenClock, run

REG = deferq.TaskRegistry()
RUNS: list[tuple[str, int]] = []


class Charge(deferq.Task, name="d.Charge", registry=REG):
    max_retries = 1

    def perform(self, order: int) -> None:
        RUNS.append((self.task_id, self.attempt))
        if order < 0:
            raise ValueError(f"bad order {order}")


@pytest.mark.spec("Q-7", "Q-8", "Q-9")
def test_real_disk_retry_give_up_and_restart(storage: Path) -> None:
    RUNS.clear()

    async def first_run() -> tuple[str, str, str]:
        with Disk(path=storage, fsync_frequency=0) as disk:
            clock = DrivenClock()
            queue = deferq.Queue(disk, registry=REG, clock=clock, rng=random.Random(3))
            await queue.start()
            ok = queue.enqueue(Charge, 1)
            bad = queue.enqueue(Charge, -1)
            later = queue.enqueue(Charge, 2, delay=600)
            await queue.wait_idle()
            [pending_bad] = [t for t in disk.pending_tasks() if t.task_id == bad]
            assert decode_context(pending_bad.context).attempts == 1
            assert pending_bad.publish_at is not None
            await clock.advance(pending_bad.publish_at - clock.now)
            await queue.wait_idle()
            assert await queue.stop(timeout=1)
            return ok, bad, later

    ok, bad, later = run(first_run())
    assert RUNS == [(ok, 1), (bad, 1), (bad, 2)]
    with Disk(path=storage) as disk:
        assert [t.task_id for t in disk.pending_tasks()] == [later]
        [dead] = disk.list_dead_tasks()
        assert dead.id == bad and dead.attempts == 2 and dead.task_class == "d.Charge"
        assert dead.exception_class == "ValueError" and dead.exception_message == "bad order -1"
        assert dead.backtrace[-1].endswith("in perform")
        # The time it was first enqueued, kept across its retry (Q-65, F-17).
        assert dead.enqueued_at == int(START)
        assert decode_context(dead.context) == Context("d.Charge", (-1,), {}, 2, None, int(START))

    async def restart() -> None:
        with Disk(path=storage, fsync_frequency=0) as disk:
            clock = DrivenClock(now=DrivenClock().now + 10_000)  # later than publish_at
            queue = deferq.Queue(disk, registry=REG, clock=clock)
            await queue.start()
            await queue.wait_idle()
            await queue.stop()

    run(restart())
    assert RUNS[-1] == (later, 1)
    with Disk(path=storage) as disk:
        assert disk.pending_tasks() == []


@pytest.mark.spec("Q-15")
def test_stop_then_restart_runs_what_did_not_run(storage: Path) -> None:
    RUNS.clear()

    async def stopped_early() -> str:
        with Disk(path=storage) as disk:  # fsync_frequency 0.5: stop() must sync
            queue = deferq.Queue(disk, registry=REG, clock=DrivenClock())
            await queue.start()
            task_id = queue.enqueue(Charge, 5, delay=30)
            await queue.stop(timeout=0)
            return task_id

    task_id = run(stopped_early())
    assert RUNS == []

    async def restart() -> None:
        with Disk(path=storage) as disk:
            queue = deferq.Queue(disk, registry=REG, clock=DrivenClock(now=DrivenClock().now + 31))
            await queue.start()
            await queue.wait_idle()
            await queue.stop()

    run(restart())
    assert RUNS == [(task_id, 1)]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet=st.characters(exclude_categories=["Cs"])),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner,
                                                                   max_size=4),
    max_leaves=20)


@pytest.mark.spec("Q-5")
@given(args=st.lists(JSON, max_size=4), kwargs=st.dictionaries(st.text(max_size=8), JSON,
                                                               max_size=3),
       attempts=st.integers(min_value=0, max_value=10**6))
def test_context_round_trips(args: list[object], kwargs: dict[str, object], attempts: int) -> None:
    context = Context("t.Name", tuple(args), kwargs, attempts)
    data = encode_context(context)
    assert b"\n" not in data
    assert decode_context(data) == context



@pytest.mark.spec("F-26", "Q-24")
def test_queue_and_cli_leave_owner_only_files(storage: Path) -> None:
    import stat

    from deferq._cli import main

    async def work() -> None:
        with Disk(path=storage, fsync_frequency=0) as disk:
            queue = deferq.Queue(disk, registry=REG, clock=DrivenClock())
            await queue.start()
            queue.enqueue(Charge, -1)
            await queue.wait_idle()
            queue.enqueue(Charge, 3, delay=60)
            await queue.stop()

    run(work())
    assert main(["dead", "retry", "--all", "--path", str(storage)]) == 0
    assert main(["dead", "remove", "--all", "--path", str(storage)]) == 0
    assert stat.S_IMODE(storage.stat().st_mode) == 0o700
    names = sorted(p.name for p in storage.iterdir())
    assert any(n.startswith("deferred-0-") for n in names) and "deferred-dead_tasks-0" in names
    for path in storage.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path.name
