"""Periodic tasks in one process, stepped by a driven clock (spec/queue.md Q-124..Q-130,
spec/dead-tasks.md L-9..L-12, spec/format.md F-42, spec/durability.md D-28, D-29).

Goal: a queue with schedules starts each new schedule at its latest due time without firing it,
fires every later due time once with its key and metadata, fires only the latest of due times
missed while no worker led, keeps its records durably in the directory's record file, leads
alone, and stops cleanly. Method: real ``Disk`` stores in ``tmp_path`` and the ``Memory``
backend, a ``DrivenClock`` the test advances once the schedules' loop is parked in its sleep,
plain tasks declared ``inline=True``, and a hook that records every enqueue.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

import deferq
from deferq._core.frame import frame
from deferq._core.names import schedules_data_name, schedules_lock_name, schedules_tmp_name
from deferq._core.schedcodec import decode_schedules
from deferq._engine.osenv import OS_ENV
from deferq._engine.schedstore import ScheduleStore
from deferq._runtime.periodic import Periodic
from deferq.backends import Disk
from deferq.testing import Memory
from tests.queue.helpers import START, DrivenClock, run

REG = deferq.TaskRegistry()
RAN: list[int] = []
PREFIX = "deferred-"


class Tick(deferq.Task, name="per.Tick", registry=REG, inline=True):
    def perform(self, n: int) -> None:
        RAN.append(n)


class Hold(deferq.Task, name="per.Hold", registry=REG):
    """Runs until the queue stops and cancels it: it stays pending in the WAL (Q-15)."""

    async def perform(self) -> None:
        RAN.append(-1)
        await asyncio.Event().wait()


class Seen(deferq.Hooks):
    def __init__(self) -> None:
        self.enqueued: list[deferq.TaskEnqueued] = []

    def on_enqueued(self, event: deferq.TaskEnqueued) -> None:
        self.enqueued.append(event)


def periodic_of(queue: deferq.Queue) -> Periodic:
    periodic = queue._periodic  # noqa: SLF001 - the test reads its firings
    assert isinstance(periodic, Periodic)
    return periodic


async def parked(clock: DrivenClock, count: int = 1, timeout_s: float = 10.0) -> None:
    """Wait (in real time) until ``count`` coroutines sleep on the driven clock."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while sum(not f.done() for _, _, f in clock._waiters) < count:  # noqa: SLF001
        assert loop.time() < deadline, "the schedules' loop never went to sleep"
        await asyncio.sleep(0.002)


async def stop_cancelling(queue: deferq.Queue, clock: DrivenClock) -> None:
    """``stop(timeout=1)`` with the driven clock moved past its timeout (Hold is cancelled)."""
    stopping = asyncio.ensure_future(queue.stop(timeout=1))
    while not stopping.done():
        await clock.advance(1)
        await asyncio.sleep(0.002)
    await stopping


async def step(clock: DrivenClock, seconds: float, count: int = 1) -> None:
    await parked(clock, count)
    await clock.advance(seconds)
    await parked(clock, count)


def records(path: Path) -> dict[str, int]:
    fired, dropped = decode_schedules((path / schedules_data_name(PREFIX)).read_bytes())
    assert dropped == 0
    return fired


@pytest.mark.spec("Q-124", "Q-125", "Q-128", "F-42", "L-12")
def test_a_new_schedule_starts_at_its_latest_due_time_then_fires_each_one_once(
        tmp_path: Path) -> None:
    RAN.clear()
    clock, seen = DrivenClock(START + 30), Seen()

    async def main() -> list[tuple[str, int, str]]:
        with Disk(path=tmp_path, fsync_frequency=0) as disk:
            queue = deferq.Queue(disk, registry=REG, clock=clock, hooks=[seen], schedules=[
                deferq.Schedule(Tick, every=60, name="tick", args=(7,))])
            await queue.start()
            await parked(clock)
            assert records(tmp_path) == {"tick": START} and RAN == []  # not fired
            await step(clock, 30)  # START + 60 is due
            await step(clock, 59)
            assert RAN == [7]
            await step(clock, 1)  # START + 120
            await queue.stop()
            return list(periodic_of(queue).firings)

    firings = run(main())
    assert [(name, due) for name, due, _ in firings] == [("tick", START + 60), ("tick", START + 120)]
    assert RAN == [7, 7]
    assert records(tmp_path) == {"tick": START + 120}
    assert not (tmp_path / schedules_tmp_name(PREFIX)).exists()
    assert (tmp_path / schedules_lock_name(PREFIX)).exists()
    assert [e.meta for e in seen.enqueued] == [
        {"deferq.schedule": "tick", "deferq.due": "2027-01-15T08:01:00+00:00"},
        {"deferq.schedule": "tick", "deferq.due": "2027-01-15T08:02:00+00:00"}]


@pytest.mark.spec("Q-126", "D-29")
def test_due_times_missed_while_no_worker_ran_fire_once_for_the_latest(tmp_path: Path) -> None:
    RAN.clear()

    async def session(clock: DrivenClock, advance_s: float) -> list[int]:
        with Disk(path=tmp_path, fsync_frequency=0) as disk:
            queue = deferq.Queue(disk, registry=REG, clock=clock, schedules=[
                deferq.Schedule(Tick, cron="*/5 * * * *", args=(1,)),
                deferq.Schedule(Tick, every=3600, name="hourly", args=(2,))])
            await queue.start()
            await parked(clock)
            if advance_s:
                await step(clock, advance_s)
            await queue.stop()
            return [due for _, due, _ in periodic_of(queue).firings]

    assert run(session(DrivenClock(START + 10), 0)) == []
    assert records(tmp_path) == {"per.Tick": START, "hourly": START}
    # Every worker is down for 3 hours and a bit: 37 five-minute and 3 hourly slots pass.
    later = START + 3 * 3600 + 400
    fired = run(session(DrivenClock(later), 0))
    assert sorted(fired) == [START + 3 * 3600, START + 3 * 3600 + 300]
    assert sorted(RAN) == [1, 2]
    assert records(tmp_path) == {"per.Tick": START + 3 * 3600 + 300, "hourly": START + 3 * 3600}
    # Restarted again before the next due time: nothing fires twice.
    assert run(session(DrivenClock(later + 100), 0)) == []


@pytest.mark.spec("L-9", "L-10", "L-11", "Q-130")
def test_one_worker_leads_and_the_other_takes_over_when_it_stops(tmp_path: Path) -> None:
    RAN.clear()
    clock = DrivenClock(START + 1)

    async def main() -> tuple[list[int], list[int]]:
        with Disk(path=tmp_path, fsync_frequency=0) as a, Disk(path=tmp_path,
                                                              fsync_frequency=0) as b:
            sched = deferq.Schedules((deferq.Schedule(Tick, every=10, args=(0,)),), poll_s=2)
            qa = deferq.Queue(a, registry=REG, clock=clock, schedules=sched)
            qb = deferq.Queue(b, registry=REG, clock=clock, schedules=sched)
            await qa.start()
            await parked(clock)
            await qb.start()
            for _ in range(3):
                await step(clock, 10, count=2)
            assert clock.sleeps.count(2) >= 3  # L-11: the follower polls every poll_s
            await qa.stop()  # L-10: the lock is released
            for _ in range(3):
                await step(clock, 10)
            await qb.stop()
            return ([d for _, d, _ in periodic_of(qa).firings],
                    [d for _, d, _ in periodic_of(qb).firings])

    fired_a, fired_b = run(main())
    assert fired_a == [START + 10, START + 20, START + 30]
    assert fired_b == [START + 40, START + 50, START + 60]
    assert len(RAN) == 6


@pytest.mark.spec("L-9", "L-10")
def test_the_leader_lock_is_exclusive_across_open_descriptions(tmp_path: Path) -> None:
    one = ScheduleStore(OS_ENV, str(tmp_path), PREFIX)
    two = ScheduleStore(OS_ENV, str(tmp_path), PREFIX)
    assert one.try_lead() and one.try_lead()
    assert not two.try_lead()
    with pytest.raises(AssertionError, match="only the leader"):
        two.write({"x": 1})
    one.close()
    one.close()  # idempotent
    assert two.try_lead()
    two.write({"x": 60})
    assert two.read() == {"x": 60}
    two.close()


class FailingRecords(ScheduleStore):
    """The record's rename never happens: a crash between the enqueue and the record."""

    def write(self, fired: object) -> None:
        raise OSError(5, "simulated crash before the record's rename")


@pytest.mark.spec("D-28", "Q-130", "D-30", "Q-209")
def test_a_crash_before_the_record_fires_again_and_the_key_absorbs_a_pending_repeat(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    RAN.clear()
    clock = DrivenClock(START + 5)
    held = deferq.Schedule(Hold, every=60)

    async def main() -> tuple[set[str], list[str]]:
        with Disk(path=tmp_path, fsync_frequency=0) as disk:
            queue = deferq.Queue(disk, registry=REG, clock=clock, schedules=[held])
            await queue.start()
            await parked(clock)
            periodic = periodic_of(queue)
            store = periodic._records  # noqa: SLF001
            assert isinstance(store, ScheduleStore)
            store.__class__ = FailingRecords  # from now on every record write fails
            await step(clock, 55)  # START + 60 fires; its record fails; logged, retried
            await step(clock, 1)
            ids = {task.task_id for task in disk.pending_tasks()}
            await stop_cancelling(queue, clock)
        with Disk(path=tmp_path, fsync_frequency=0) as disk:  # the next start
            queue = deferq.Queue(disk, registry=REG, clock=clock, schedules=[held])
            await queue.start()
            await parked(clock)
            again = [tid for _, _, tid in periodic_of(queue).firings]
            await stop_cancelling(queue, clock)
        return ids, again

    with caplog.at_level(logging.ERROR, "deferq.schedules"):
        ids, again = run(main())
    assert "simulated crash before the record's rename" in caplog.text
    assert len(ids) == 1  # the retried firing was absorbed by the key while pending
    assert again == list(ids)  # after the restart: fired again, the same pending task
    assert records(tmp_path) == {"per.Hold": START + 60}


@pytest.mark.spec("Q-172")
def test_schedules_takes_any_iterable_of_schedules_as_docs_queue_md_writes_it() -> None:
    # docs/queue.md: `deferq.Schedules([...], poll_s=0.2)`. A list was kept as the items of a
    # frozen value (so it compared unequal to the same tuple) and mypy --strict refused it; a
    # generator was used up by the name check and left no schedule.
    one, two = deferq.Schedule(Tick, every=5), deferq.Schedule(Tick, every=7, name="b")
    listed = deferq.Schedules([one, two], poll_s=0.2)
    assert listed.items == (one, two) and listed.poll_s == 0.2
    assert deferq.Schedules(s for s in (one, two)).items == (one, two)
    assert listed == deferq.Schedules((one, two), poll_s=0.2)
    with pytest.raises(TypeError, match="schedules must be an iterable of deferq.Schedule"):
        deferq.Schedules(5)  # type: ignore[arg-type]


@pytest.mark.spec("Q-127", "Q-129")
def test_schedules_are_checked_and_a_shared_backend_is_refused() -> None:
    with pytest.raises(ValueError, match="exactly one of cron= and every="):
        deferq.Schedule(Tick)
    with pytest.raises(ValueError, match="exactly one of cron= and every="):
        deferq.Schedule(Tick, cron="* * * * *", every=5)
    with pytest.raises(ValueError, match="cron field hour has the value 25"):
        deferq.Schedule(Tick, cron="0 25 * * *")
    with pytest.raises(ValueError, match="every must be a whole number of seconds"):
        deferq.Schedule(Tick, every=0.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="schedule name 'a b' must be"):
        deferq.Schedule(Tick, every=5, name="a b")
    with pytest.raises(deferq.NotATaskError):
        deferq.Schedule(print, every=5)
    one = deferq.Schedule(Tick, every=5)
    with pytest.raises(ValueError, match="schedule names must be unique"):
        deferq.Schedules((one, one))
    with pytest.raises(ValueError, match="poll_s must be a number"):
        deferq.Schedules((one,), poll_s=0)
    from deferq.backends.postgres import Postgres
    shared = Postgres.__new__(Postgres)
    shared.lease_seconds = shared.poll_seconds = 1.0  # a ClaimingBackend's attributes
    with pytest.raises(ValueError, match="schedules need a Disk backend"):
        deferq.Queue(shared, registry=REG, schedules=[one])


@pytest.mark.spec("Q-127")
def test_on_memory_the_records_are_kept_in_memory() -> None:
    RAN.clear()
    clock = DrivenClock(START + 1)

    async def main() -> None:
        queue = deferq.Queue(Memory(now=clock.time), registry=REG, clock=clock,
                             schedules=[deferq.Schedule(Tick, every=30, args=(5,))])
        async with queue:
            await parked(clock)
            await step(clock, 29)
            await step(clock, 30)

    run(main())
    assert RAN == [5, 5]


@pytest.mark.spec("F-45", "Q-125")
def test_a_damaged_record_line_is_dropped_logged_and_its_schedule_starts_afresh(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    RAN.clear()
    good = frame(b"fired kept %d" % START)
    (tmp_path / schedules_data_name(PREFIX)).write_bytes(
        good + b"00000000:fired lost %d\n" % START)  # a CRC mismatch
    clock = DrivenClock(START + 130)

    async def main() -> list[tuple[str, int]]:
        with Disk(path=tmp_path, fsync_frequency=0) as disk:
            queue = deferq.Queue(disk, registry=REG, clock=clock, schedules=[
                deferq.Schedule(Tick, every=60, name="kept", args=(1,)),
                deferq.Schedule(Tick, every=60, name="lost", args=(2,))])
            await queue.start()
            await parked(clock)
            await queue.stop()
            return [(name, due) for name, due, _ in periodic_of(queue).firings]

    with caplog.at_level(logging.WARNING, "deferq.schedules"):
        firings = run(main())
    assert "1 damaged line(s)" in caplog.text
    assert firings == [("kept", START + 120)]  # "lost" starts afresh, without firing
    assert RAN == [1]
    assert records(tmp_path) == {"kept": START + 120, "lost": START + 120}
