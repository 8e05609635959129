"""The public backend protocol (spec/api.md C-16..C-18): what a second backend implements.

Goal: ``Backend`` is the whole contract between the queue runtime and its storage. Method:
compare the signatures of ``Disk`` and ``Nil`` with the protocol's (mypy checks the same by
the assignments below); run a real ``Queue`` and ``Operator`` over a ``Disk`` seen through a
proxy that lets through only the protocol's members, so any use of something else fails;
and record the ``sync`` arguments the queue passes for each value of ``group_commit``.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterable
from pathlib import Path

import pytest

from deferq import Operator, Queue, Task, TaskRegistry
from deferq._core.types import DeadTask, PendingTask
from deferq.backends import Backend, Disk, Memory, Nil
from deferq.backends.protocol import DeadTaskAdmin
from tests.queue.helpers import DrivenClock, settle

BACKEND_MEMBERS = ("group_commit", "add_task", "remove_task", "pending_tasks", "written_ticket",
                   "sync_through", "sync", "add_dead_task", "list_dead_tasks", "find_dead_task",
                   "remove_dead_tasks", "close")
ADMIN_MEMBERS = ("list_dead_tasks", "find_dead_task", "remove_dead_tasks")


def _protocol_members(protocol: type) -> set[str]:
    return {name for name in vars(protocol) if not name.startswith("_")} | {
        name for base in protocol.__mro__[1:] if base.__module__ == protocol.__module__
        for name in vars(base) if not name.startswith("_")}


def test_the_protocols_list_exactly_the_documented_members() -> None:
    assert _protocol_members(Backend) == set(BACKEND_MEMBERS)
    assert _protocol_members(DeadTaskAdmin) == set(ADMIN_MEMBERS)


@pytest.mark.spec("C-16", "C-21")
@pytest.mark.parametrize("cls", [Disk, Nil, Memory])
def test_disk_and_nil_have_every_member_with_the_protocols_signature(cls: type) -> None:
    for name in BACKEND_MEMBERS:
        wanted = inspect.getattr_static(Backend, name)
        got = inspect.getattr_static(cls, name)
        if isinstance(wanted, property):
            assert isinstance(got, property), f"{cls.__name__}.{name} is not a property"
            continue
        want_params = [(p.name, p.kind, p.default) for p in
                       inspect.signature(wanted).parameters.values()]
        got_params = [(p.name, p.kind, p.default) for p in
                      inspect.signature(got).parameters.values()]
        assert got_params == want_params, f"{cls.__name__}.{name}"


@pytest.mark.spec("C-16")
def test_disk_and_nil_are_backends_to_mypy(tmp_path: Path) -> None:
    # mypy --strict checks these assignments (scripts/check.sh runs it on tests/).
    disk: Backend = Disk(path=tmp_path / "s")
    nil: Backend = Nil()
    memory: Backend = Memory()
    assert memory.pending_tasks() == []
    admin: DeadTaskAdmin = disk
    try:
        assert admin.list_dead_tasks() == [] and nil.pending_tasks() == []
    finally:
        disk.close()


class ProtocolOnly:
    """A backend that has exactly the members of ``Backend``: each forwards to a ``Disk``.

    Anything else the queue or the operator reached for would raise ``AttributeError``.
    """

    __slots__ = ("_inner", "used")

    def __init__(self, inner: Disk) -> None:
        self._inner = inner
        self.used: set[str] = set()

    @property
    def group_commit(self) -> bool:
        self.used.add("group_commit")
        return self._inner.group_commit

    def add_task(self, context: bytes, publish_at: int | None = None,
                 task_id: str | None = None, *, sync: bool = True) -> str | None:
        self.used.add("add_task")
        return self._inner.add_task(context, publish_at, task_id, sync=sync)

    def remove_task(self, task_id: str, *, sync: bool = True) -> None:
        self.used.add("remove_task")
        self._inner.remove_task(task_id, sync=sync)

    def pending_tasks(self) -> list[PendingTask]:
        self.used.add("pending_tasks")
        return self._inner.pending_tasks()

    def written_ticket(self) -> int:
        self.used.add("written_ticket")
        return self._inner.written_ticket()

    def sync_through(self, ticket: int) -> None:
        self.used.add("sync_through")
        self._inner.sync_through(ticket)

    def sync(self) -> None:
        self.used.add("sync")
        self._inner.sync()

    def add_dead_task(self, task_id: str, context: bytes, exception: BaseException, *,
                      task_class: str, attempts: int,
                      enqueued_at: int | None = None) -> str | None:
        self.used.add("add_dead_task")
        return self._inner.add_dead_task(task_id, context, exception, task_class=task_class,
                                         attempts=attempts, enqueued_at=enqueued_at)

    def list_dead_tasks(self, *, limit: int | None = None, offset: int = 0) -> list[DeadTask]:
        self.used.add("list_dead_tasks")
        return self._inner.list_dead_tasks(limit=limit, offset=offset)

    def find_dead_task(self, task_id: str) -> DeadTask | None:
        self.used.add("find_dead_task")
        return self._inner.find_dead_task(task_id)

    def remove_dead_tasks(self, ids: str | Iterable[str] | None) -> int:
        self.used.add("remove_dead_tasks")
        return self._inner.remove_dead_tasks(ids)

    def close(self) -> None:
        self.used.add("close")
        self._inner.close()


REGISTRY = TaskRegistry()
RUNS: list[str] = []


class Works(Task, name="protocol.Works", registry=REGISTRY,
           inline=True):  # stepped by hand (settle): on the loop, not in a thread
    def perform(self, label: str) -> None:
        RUNS.append(label)


class Fails(Task, name="protocol.Fails", registry=REGISTRY,
           inline=True):  # stepped by hand (settle): on the loop, not in a thread
    max_retries = 1

    def perform(self) -> None:
        raise RuntimeError("always")

    def retry_interval(self, exception: BaseException, attempt: int) -> object:
        return 1


async def _life(backend: ProtocolOnly, clock: DrivenClock) -> tuple[str, str]:
    queue = Queue(backend, registry=REGISTRY, clock=clock)
    await queue.start()
    queue.enqueue(Works, "now")
    queue.enqueue(Works, "later", delay=5)
    failing = await queue.aenqueue(Fails)
    await settle()
    await clock.advance(1)  # the retry
    await clock.advance(5)  # the delayed task
    await queue.wait_idle()
    dead = await queue.dead_tasks()
    assert [t.id for t in dead] == [failing]
    retried, missing = await queue.retry_dead_tasks([failing])
    assert missing == [] and len(retried) == 1 and retried[0].new_id is not None
    await settle()
    await clock.advance(1)
    await queue.wait_idle()
    await queue.stop(timeout=1)
    return failing, retried[0].new_id


@pytest.mark.spec("C-17")
@pytest.mark.parametrize("fsync_frequency", [0.0, 0.5])
def test_a_backend_with_only_the_protocols_members_runs_the_whole_life_of_tasks(
        tmp_path: Path, fsync_frequency: float) -> None:
    RUNS.clear()
    clock = DrivenClock()
    backend = ProtocolOnly(Disk(path=tmp_path / "s", fsync_frequency=fsync_frequency))
    try:
        failing, retried = asyncio.run(_life(backend, clock))
        assert sorted(RUNS) == ["later", "now"]
        # The retried task failed again and gave up again under its new id; the operator
        # removes it through the admin half alone.
        operator = Operator(backend)
        assert [t.id for t in operator.list_dead()] == [retried]
        assert operator.remove_dead([retried]) == 1 and operator.list_dead() == []
        assert backend.pending_tasks() == []
    finally:
        backend.close()
    assert {"add_task", "remove_task", "pending_tasks", "add_dead_task", "list_dead_tasks",
            "find_dead_task", "remove_dead_tasks", "sync", "group_commit"} <= backend.used
    assert failing != retried


@pytest.mark.spec("C-18")
def test_group_commit_is_true_for_a_power_safe_disk_only(tmp_path: Path) -> None:
    with Disk(path=tmp_path / "a", fsync_frequency=0) as safe, \
            Disk(path=tmp_path / "b", fsync_frequency=0.5) as timed:
        assert safe.group_commit is True and timed.group_commit is False
    assert Nil().group_commit is False


class SyncRecorder(ProtocolOnly):
    __slots__ = ("syncs",)

    def __init__(self, inner: Disk) -> None:
        super().__init__(inner)
        self.syncs: list[tuple[str, bool]] = []

    def add_task(self, context: bytes, publish_at: int | None = None,
                 task_id: str | None = None, *, sync: bool = True) -> str | None:
        self.syncs.append(("add_task", sync))
        return super().add_task(context, publish_at, task_id, sync=sync)

    def remove_task(self, task_id: str, *, sync: bool = True) -> None:
        self.syncs.append(("remove_task", sync))
        super().remove_task(task_id, sync=sync)


async def _one_task(backend: SyncRecorder) -> None:
    queue = Queue(backend, registry=REGISTRY, clock=DrivenClock())
    await queue.start()
    await queue.aenqueue(Works, "x")
    await queue.wait_idle()
    await queue.stop(timeout=1)


@pytest.mark.spec("C-18")
@pytest.mark.parametrize("fsync_frequency", [0.0, 0.5])
def test_the_queue_writes_unsynced_exactly_when_the_backend_wants_group_commit(
        tmp_path: Path, fsync_frequency: float) -> None:
    backend = SyncRecorder(Disk(path=tmp_path / "s", fsync_frequency=fsync_frequency))
    try:
        asyncio.run(_one_task(backend))
    finally:
        backend.close()
    group = fsync_frequency == 0
    assert backend.syncs == [("add_task", not group), ("remove_task", not group)]
    assert ("sync_through" in backend.used) == group
