"""Periodic tasks: schedules fired once per due time by one leader per directory (spec/queue.md Q-120..Q-131).

Theory of operation. A ``Schedule`` names a task, its arguments, and its due times: a
cron expression or an interval (``_core/cron.py``). A queue given schedules runs one
``Periodic`` loop. It tries to become the directory's leader (``ScheduleRecords.try_lead``,
a non-blocking flock, L-9) every ``poll_s`` seconds until it is (L-11); the leader then:
1. reads the last fired due time of every schedule (F-45); one with no record gets, as its
   start, its latest due time at or before now, written before anything fires (Q-125);
2. whenever a schedule's latest due time at or before now is later than its record, it
   *fires* it: enqueues the task with the unique key ``deferq.schedule:<name>:<due>`` and
   the metadata ``deferq.schedule``/``deferq.due``, waits until the task is durable in the
   WAL, and only then writes the due time as the record (Q-128, D-28). Before its first
   firing, a worker that has just become the leader runs one adoption sweep (Q-131). Due times missed
   while no worker led (every worker down, a leader dead) fire once, at the latest of
   them (Q-126): a schedule never fires twice for one wake-up and never goes backwards;
3. sleeps on the queue's clock until the next due time of any schedule, at most
   ``poll_s``, so a jump of the wall clock is noticed soon.
A crash between a durable enqueue and its record's rename fires that due time again when
the next leader takes over (D-28), unless the task is still pending in the WAL the next
leader replayed at start or adopted when it took the lead, whose key then absorbs the repeat
(Q-52, Q-131). A firing that fails (the
backend refuses the task) is logged and tried again at the next wake-up. ``stop`` waits
for a firing in flight, cancels only a sleep, and releases the lock (L-10).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Final, Protocol

from deferq._core.cron import (Cron, interval_latest_due, interval_next_due, latest_due,
                               next_due, parse_cron)
from deferq._core.errors import StorageBrokenError, StorageClosedError
from deferq._core.schedcodec import schedule_name_problem
from deferq._runtime.clock import Clock
from deferq._runtime.serialize import Context
from deferq._runtime.sweeper import Sweeper
from deferq._runtime.task import Task, task_class_of
from deferq.backends.protocol import Backend, ClaimingBackend, ScheduleKeeper, ScheduleRecords

log = logging.getLogger("deferq.schedules")

DEFAULT_SCHEDULE_POLL_S: Final = 1.0
SCHEDULE_POLL_S_MAX: Final = 3600.0
SCHEDULES_MAX: Final = 1024



class Prepare(Protocol):
    """The queue's ``_prepare``: a task's record and context, checked (Q-6, Q-54, Q-66)."""

    def __call__(self, cls: type[Task], args: tuple[object, ...], kwargs: dict[str, object],
                 key: str | None = None, *, meta: Mapping[str, str] | None = None
                 ) -> tuple[bytes, Context, type[Task]]: ...


# The queue's ``_apersist``: backpressure, the write, the group commit, the scheduling.
Persist = Callable[[bytes, Context, type[Task], tuple[int | None, int | None]], Awaitable[str]]


@dataclass(frozen=True, slots=True)
class Schedule:
    """A task enqueued at every due time of a cron expression or an interval (Q-120, Q-123).

    Args:
        task: a ``Task`` subclass or ``@task`` function, registered in the queue.
        cron: five fields ``minute hour day-of-month month day-of-week``, in UTC.
        every: an interval (``timedelta`` or seconds, whole seconds >= 1): due at each
            multiple of it since the epoch. Exactly one of ``cron`` and ``every``.
        name: the schedule's durable identity (default: the task's name).
        args, kwargs: what each enqueued task is called with.
    Raises:
        ValueError: naming the field or the argument that is wrong.
    """

    task: object
    _: KW_ONLY
    cron: str | None = None
    every: datetime.timedelta | int | None = None
    name: str | None = None
    args: tuple[object, ...] = ()
    kwargs: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        task_class_of(self.task)  # NotATaskError for anything else
        if (self.cron is None) == (self.every is None):
            raise ValueError("a Schedule needs exactly one of cron= and every=")
        if self.cron is not None:
            parse_cron(self.cron)
        else:
            every_s(self.every)
        problem = schedule_name_problem(self.key_name)
        if problem is not None:
            raise ValueError(f"schedule name {problem}")

    @property
    def key_name(self) -> str:
        """The name its records are kept under: ``name``, else the task's name."""
        return self.name if self.name is not None else task_class_of(self.task).task_name


def every_s(every: object) -> int:
    """Implements Q-123: an interval in whole seconds >= 1, or ``ValueError``."""
    seconds = every.total_seconds() if isinstance(every, datetime.timedelta) else every
    if (isinstance(seconds, bool) or not isinstance(seconds, (int, float))
            or seconds != int(seconds) or not 1 <= seconds <= 10 ** 9):
        raise ValueError(f"every must be a whole number of seconds from 1 to 10**9, got {every!r}")
    return int(seconds)


@dataclass(frozen=True, slots=True, init=False)
class Schedules:
    """A queue's schedules and how often a follower tries to lead (Q-129).

    ``items`` is any iterable of ``Schedule``s (docs write a list), kept as a tuple (Q-172).
    """

    items: tuple[Schedule, ...]
    poll_s: float = DEFAULT_SCHEDULE_POLL_S

    def __init__(self, items: Iterable[Schedule], poll_s: float = DEFAULT_SCHEDULE_POLL_S) -> None:
        try:
            kept = tuple(items)
        except TypeError:
            raise TypeError("schedules must be an iterable of deferq.Schedule objects, got "
                            f"{type(items).__name__}") from None
        object.__setattr__(self, "items", kept)
        object.__setattr__(self, "poll_s", poll_s)
        self._check()

    def __iter__(self) -> Iterator[Schedule]:
        return iter(self.items)

    def _check(self) -> None:
        if not all(isinstance(s, Schedule) for s in self.items):
            raise TypeError("schedules must be deferq.Schedule objects")
        names = [s.key_name for s in self.items]
        if len(set(names)) != len(names) or len(names) > SCHEDULES_MAX:
            raise ValueError(f"schedule names must be unique (at most {SCHEDULES_MAX}): {names}")
        poll = self.poll_s
        if isinstance(poll, bool) or not isinstance(poll, (int, float)) or not (
                0 < poll <= SCHEDULE_POLL_S_MAX):
            raise ValueError(f"poll_s must be a number in (0, {SCHEDULE_POLL_S_MAX:g}], got {poll!r}")


def as_schedules(value: Iterable[Schedule]) -> Schedules | None:
    """The queue's ``schedules=`` argument, checked; None when there are none."""
    checked = value if isinstance(value, Schedules) else Schedules(value)
    return checked if checked.items else None


class LocalRecords:
    """Records for a backend without ``open_schedules``: in memory, one process (Q-127)."""

    def __init__(self) -> None:
        self.leading = False
        self._fired: dict[str, int] = {}

    def try_lead(self) -> bool:
        self.leading = True
        return True

    def read(self) -> dict[str, int]:
        return dict(self._fired)

    def write(self, fired: Mapping[str, int]) -> None:
        self._fired = dict(fired)

    def close(self) -> None:
        self.leading = False


class _Due:
    """One schedule's due-time arithmetic."""

    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule
        self.cron: Cron | None = None if schedule.cron is None else parse_cron(schedule.cron)
        self.every_s = 0 if self.cron is not None else every_s(schedule.every)

    def latest(self, now: int) -> int | None:
        return (latest_due(self.cron, now) if self.cron is not None
                else interval_latest_due(self.every_s, now))

    def next(self, now: int) -> int | None:
        return (next_due(self.cron, now) if self.cron is not None
                else interval_next_due(self.every_s, now))


class Periodic:
    """The queue's schedules loop: lead, catch up, fire each due time, sleep (Q-124..Q-130)."""

    def __init__(self, schedules: Schedules, records: ScheduleRecords, prepare: Prepare,
                 persist: Persist, sync: Callable[[], None], clock: Clock,
                 adopt: Callable[[], Awaitable[bool]] | None = None) -> None:
        self._dues = [_Due(s) for s in schedules.items]
        self._prepare = prepare
        self._persist = persist
        self.poll_s = float(schedules.poll_s)
        self._records = records
        self._sync = sync
        self._clock = clock
        self._adopt = adopt
        self._fired: dict[str, int] | None = None  # read once this loop leads
        self._task: asyncio.Task[None] | None = None
        self._busy = False
        self._stopping = False
        # (name, due, task id) of the latest firings, for tests and operators.
        self.firings: collections.deque[tuple[str, int, str]] = collections.deque(maxlen=1024)

    def start(self) -> None:
        """Start on the running loop (nothing to do without schedules)."""
        assert self._task is None
        if not self._dues:
            return
        self._task = asyncio.get_running_loop().create_task(self._run(), name="deferq-periodic")

    async def stop(self) -> None:
        """Implements Q-130: wait for a firing in flight, cancel a sleep, release the lock."""
        self._stopping = True
        task = self._task
        if task is not None:
            if not self._busy:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        # A close of the lock file, on the loop: awaiting a thread here would let executions
        # that have not begun start while the queue stops.
        self._records.close()

    async def _run(self) -> None:
        while not self._stopping:
            self._busy = True
            try:
                wait_s = await self.wake()
            except (StorageBrokenError, StorageClosedError) as exc:
                log.error("periodic schedules stopped: %s", exc)
                return
            except Exception as exc:  # noqa: BLE001 - logged; the next wake-up tries again
                log.error("periodic schedules failed (%s: %s); trying again in %g s",
                          type(exc).__name__, exc, self.poll_s)
                wait_s = self.poll_s
            finally:
                self._busy = False
            if self._stopping:
                return
            await self._clock.sleep(wait_s)

    async def wake(self) -> float:
        """One wake-up: lead if possible, fire what is due; return the seconds to sleep."""
        records = self._records
        if self._fired is None:
            if not await asyncio.to_thread(records.try_lead):
                return self.poll_s  # Implements L-11: a follower polls the lock.
            if self._adopt is not None:
                # Implements Q-131: what a dead leader fired and left pending is adopted, and
                # its key registered, before this worker fires anything (D-28).
                await self._adopt()
            self._fired = await asyncio.to_thread(records.read)
            log.info("periodic schedules: this worker leads (%d schedule(s))", len(self._dues))
        fired = self._fired
        now = int(self._clock.time())
        starts = {d.schedule.key_name: d.latest(now) for d in self._dues
                  if d.schedule.key_name not in fired}
        if starts:
            # Implements Q-125: a schedule no leader has seen starts at its latest due time.
            fired.update({name: due for name, due in starts.items() if due is not None})
            await asyncio.to_thread(records.write, dict(fired))
        for due_of in self._dues:
            name = due_of.schedule.key_name
            due = due_of.latest(now)
            if due is not None and due > fired.get(name, -1):
                await self._fire_once(due_of.schedule, name, due)  # once, the latest
        nexts = [n for n in (d.next(now) for d in self._dues) if n is not None]
        return max(0.0, min([self.poll_s, *(n - self._clock.time() for n in nexts)]))

    async def _fire_once(self, schedule: Schedule, name: str, due: int) -> None:
        """Implements Q-128, D-28: a durable enqueue, then the durable record."""
        assert self._fired is not None
        at = datetime.datetime.fromtimestamp(due, datetime.timezone.utc).isoformat()
        data, context, cls = self._prepare(
            task_class_of(schedule.task), schedule.args, dict(schedule.kwargs),
            f"deferq.schedule:{name}:{due}", meta={"deferq.schedule": name, "deferq.due": at})
        task_id = await self._persist(data, context, cls, (None, None))
        await asyncio.to_thread(self._sync)
        self._fired[name] = due
        await asyncio.to_thread(self._records.write, dict(self._fired))
        self.firings.append((name, due, task_id))
        log.info("periodic schedule %s fired for %s: task %s", name, at, task_id)


def periodic_for(schedules: Iterable[Schedule], backend: Backend, prepare: Prepare,
                 persist: Persist, clock: Clock, sweeper: Sweeper | None) -> Periodic:
    """The queue's ``Periodic`` for its ``schedules=`` argument (idle when there are none).

    Implements Q-127: the records and leader lock of a backend's storage directory when it
    offers them (``Disk``); in memory otherwise, except on a backend that workers share
    through a server (``Postgres``), where a per-process leader would fire once per worker.
    """
    checked = as_schedules(schedules)
    if checked is None:
        return Periodic(Schedules(()), LocalRecords(), prepare, persist, _no_sync, clock)
    if isinstance(backend, ClaimingBackend):
        raise ValueError("schedules need a Disk backend (or one with open_schedules): "
                         f"{type(backend).__name__} is shared by workers with no leader lock")
    records = backend.open_schedules() if isinstance(backend, ScheduleKeeper) else LocalRecords()
    adopt = None if sweeper is None else sweeper.sweep_once
    return Periodic(checked, records, prepare, persist, backend.sync, clock, adopt)


def _no_sync() -> None:
    """A backend with no ``sync`` has nothing to make durable."""
