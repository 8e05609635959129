"""Group commit of concurrent dead-task adds inside one process (spec/dead-tasks.md S-14).

Goal: threads that call ``add_dead_task`` at once share one write and one fsync; each
returns only after an fsync that began after its line was written; a failed write or
fsync fails every caller of the batch, is cut back, and (for fsync) breaks the store
(S-8); a thread whose line no leader took still gives up after L-3's attempts and
writes nothing. Method: real directories with ``tests.fsenv`` envs whose first data
fsync is held until the other threads have queued their lines (so the batch is known),
and a simulated disk with ``FaultRule(op="fsync", fault=FsyncEio())``.
"""

from __future__ import annotations

import fcntl
import threading
from pathlib import Path

import pytest

from deferq._engine.deadadds import _AddRequest
from deferq._engine.deadstore import DeadTaskStore
from deferq._engine.env import OpenFlag
from deferq._core.deadcodec import encode_dead
from deferq._core.errors import DeadTasksLockTimeout, StorageBrokenError
from deferq._core.types import DeadTask
from deferq.backends import Disk
from deferq.crashtest import FaultRule, FsyncEio, SimDisk
from tests.fsenv import FaultyEnv, ManualClock

PREFIX = "deferred-"
DATA = "deferred-dead_tasks-0"
FOLLOWERS = 3


def dead(task_id: str) -> DeadTask:
    return DeadTask(id=task_id, task_class="job.T", attempts=3, enqueued_at=1, failed_at=2,
                    exception_class="ValueError", exception_message="gave up",
                    backtrace=(), context=task_id.encode())


class HeldFsyncEnv(FaultyEnv):
    """Holds the first fsync of ``data`` until ``FOLLOWERS`` more lines are queued."""

    def __init__(self, data: str) -> None:
        super().__init__()
        self.data = data
        self.store: DeadTaskStore | None = None
        self.held = False
        self.returned: list[tuple[str, int]] = []  # (id, number of calls recorded by then)

    def fsync(self, fd: int) -> None:
        if self.path_of(fd) == self.data and not self.held and self.store is not None:
            self.held = True
            store = self.store
            for _ in range(2000):
                with store._cond:
                    if len(store._queue) >= FOLLOWERS:
                        break
                threading.Event().wait(0.005)
        super().fsync(fd)


def run_adds(disk: Disk, env: HeldFsyncEnv, ids: list[str]) -> dict[str, BaseException | None]:
    outcome: dict[str, BaseException | None] = {}

    def one(task_id: str) -> None:
        try:
            disk._dead.add(dead(task_id))
            outcome[task_id] = None
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            outcome[task_id] = exc
        with env._rec_mutex:
            env.returned.append((task_id, len(env.calls)))

    leader = threading.Thread(target=one, args=(ids[0],))
    leader.start()
    while not env.held:
        threading.Event().wait(0.001)
    others = [threading.Thread(target=one, args=(i,)) for i in ids[1:]]
    for thread in others:
        thread.start()
    for thread in [leader, *others]:
        thread.join(20)
    return outcome


@pytest.mark.spec("S-14", "S-4", "D-7", "S-53", "S-54")
def test_concurrent_adds_share_one_write_and_one_fsync_and_return_after_it(
        storage: Path) -> None:
    data = str(storage / DATA)
    env = HeldFsyncEnv(data)
    with Disk(path=storage, prefix=PREFIX, fsync_frequency=0, env=env) as disk:
        env.store = disk._dead
        env.clear()
        ids = ["lead", "f1", "f2", "f3"]
        outcome = run_adds(disk, env, ids)
        assert outcome == dict.fromkeys(ids)
        writes = [i for i, c in enumerate(env.calls) if c.op == "write" and c.path == data]
        fsyncs = [i for i, c in enumerate(env.calls) if c.op == "fsync" and c.path == data]
        assert len(writes) == 2 and len(fsyncs) == 2  # the leader alone, then one batch
        assert disk._dead._queue == []
        batch_bytes, lead_bytes = env.calls[writes[1]].size, env.calls[writes[0]].size
        assert batch_bytes and lead_bytes and batch_bytes > 2 * lead_bytes  # three lines
        for task_id, seen in env.returned:
            assert seen > (fsyncs[0] if task_id == "lead" else fsyncs[1])
        assert sorted(t.id for t in disk.list_dead_tasks()) == sorted(ids)


@pytest.mark.spec("S-14", "S-8", "D-10", "A-7", "S-56")
def test_a_failed_batch_fsync_fails_every_caller_cuts_back_and_breaks_the_store(
        storage: Path) -> None:
    data = str(storage / DATA)
    env = HeldFsyncEnv(data)
    with Disk(path=storage, prefix=PREFIX, fsync_frequency=0, env=env) as disk:
        disk._dead.add(dead("before"))
        good = (storage / DATA).read_bytes()
        env.store = disk._dead
        env.inject("fsync", nth=2, path=data)  # the batch's fsync, after the leader's own
        outcome = run_adds(disk, env, ["lead", "f1", "f2", "f3"])
        assert outcome["lead"] is None
        for task_id in ("f1", "f2", "f3"):
            assert isinstance(outcome[task_id], StorageBrokenError), outcome
        assert (storage / DATA).read_bytes().startswith(good)
        assert b"dead_task:f1:" not in (storage / DATA).read_bytes()
        with pytest.raises(StorageBrokenError):
            disk._dead.add(dead("after"))


@pytest.mark.spec("S-14", "S-8", "S-55")
def test_a_failed_batch_write_fails_every_caller_and_leaves_the_store_usable(
        storage: Path) -> None:
    data = str(storage / DATA)
    env = HeldFsyncEnv(data)
    with Disk(path=storage, prefix=PREFIX, fsync_frequency=0, env=env) as disk:
        env.store = disk._dead
        env.inject("write", nth=2, path=data)
        outcome = run_adds(disk, env, ["lead", "f1", "f2", "f3"])
        assert outcome["lead"] is None
        for task_id in ("f1", "f2", "f3"):
            error = outcome[task_id]
            assert isinstance(error, OSError) and not isinstance(error, StorageBrokenError)
        disk._dead.add(dead("after"))
        assert sorted(t.id for t in disk.list_dead_tasks()) == ["after", "lead"]


@pytest.mark.spec("S-14", "S-8", "D-10", "S-56")
def test_on_a_simulated_disk_an_fsync_eio_fails_the_whole_batch() -> None:
    sim = SimDisk(5)
    env = sim.process()
    disk = Disk(path="/s", prefix=PREFIX, fsync_frequency=0, env=env)
    store = disk._dead
    sim.inject(FaultRule(op="fsync", fault=FsyncEio(), path=f"/s/{DATA}"))
    # Queue three lines as three threads would, then lead them as one batch.
    requests = [_AddRequest(encode_dead(dead(task_id))) for task_id in ("x", "y", "z")]
    with store._cond:
        store._queue.extend(requests)
    store._lead_adds()
    assert all(r.finished and isinstance(r.error, StorageBrokenError) for r in requests)
    fd = env.open(f"/s/{DATA}", OpenFlag.READ)
    assert env.fstat(fd).size == 0  # cut back
    env.close(fd)
    with pytest.raises(StorageBrokenError):
        disk.add_dead_task("w", b"", ValueError("x"), task_class="a.B", attempts=1)
    disk.close()


@pytest.mark.spec("S-14", "L-1", "L-3", "D-8", "S-57")
def test_threads_whose_lines_no_leader_took_give_up_and_write_nothing(storage: Path) -> None:
    clock = ManualClock()
    env = FaultyEnv(clock)
    with Disk(path=storage, prefix=PREFIX, fsync_frequency=0, env=env) as disk:
        holder = open(storage / "deferred-dead_tasks.lock", "rb")  # another process
        fcntl.flock(holder, fcntl.LOCK_EX)
        errors: list[BaseException] = []

        def one(task_id: str) -> None:
            try:
                disk._dead.add(dead(task_id))
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        threads = [threading.Thread(target=one, args=(f"t{n}",)) for n in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(20)
        fcntl.flock(holder, fcntl.LOCK_UN)
        holder.close()
        assert len(errors) == 3 and all(isinstance(e, DeadTasksLockTimeout) for e in errors)
        assert disk._dead._queue == []
        assert (storage / DATA).read_bytes() == b""


@pytest.mark.spec("L-5", "S-14", "L-2", "L-3", "D-8", "S-57", "L-13")
def test_the_leaders_twenty_attempts_stand_for_every_line_queued_behind_it(
        storage: Path) -> None:
    clock = ManualClock()
    env = FaultyEnv(clock)
    with Disk(path=storage, prefix=PREFIX, fsync_frequency=0, env=env) as disk:
        store = disk._dead
        holder = open(storage / "deferred-dead_tasks.lock", "rb")  # another process
        fcntl.flock(holder, fcntl.LOCK_EX)
        errors: dict[str, BaseException] = {}

        def one(task_id: str) -> None:
            try:
                store.add(dead(task_id))
            except BaseException as exc:  # noqa: BLE001
                errors[task_id] = exc

        followers = [threading.Thread(target=one, args=(f"f{n}",)) for n in range(2)]

        def on_first_sleep(_: float) -> None:
            clock.on_sleep = None
            for thread in followers:
                thread.start()
            for _ in range(2000):  # until both lines are queued behind the leader
                with store._cond:
                    if len(store._queue) == 3:
                        return
                threading.Event().wait(0.005)

        clock.on_sleep = on_first_sleep
        one("lead")
        for thread in followers:
            thread.join(20)
        fcntl.flock(holder, fcntl.LOCK_UN)
        holder.close()
        assert sorted(errors) == ["f0", "f1", "lead"]
        assert all(isinstance(e, DeadTasksLockTimeout) for e in errors.values())
        assert len(clock.sleeps) == 19  # the leader's attempts alone
        assert store._queue == [] and (storage / DATA).read_bytes() == b""
        store.add(dead("later"))  # the store is usable once the lock is free
