"""Group commit of the tasks WAL: tickets, sync_through, shared fsyncs (spec/wal.md W-20..W-24).

Goal: show that an acknowledged write is durable only through an fsync that began after
the write completed (D-15), that concurrent writers share fsyncs, that a failed fsync
fails every write it had to cover and every later one (D-16), and that rotation and
close never run under an fsync in flight (W-23). Method: real threads, either on the
real OS with an ``OsEnv`` that stamps every write and fsync with a global sequence
number (and slows fsync down so writers pile up behind it), or on a ``SimDisk`` with a
hook that parks the leading thread inside its fsync while followers write and wait.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from deferq._engine import wal as _wal
from deferq._core.errors import StorageBrokenError, StorageClosedError
from deferq._engine.osenv import OsEnv
from deferq.backends import Disk, Nil
from deferq.crashtest import FaultRule, FsyncEio, SimDisk, SimEnv
from deferq.crashtest._tracing import TracingEnv

from tests.fsenv import RecordingEnv, snapshot

# ----------------------------------------------------------------------------- helpers


class StampingEnv(OsEnv):
    """The real OS; every WAL write's end and every fsync's start and end get a global stamp."""

    def __init__(self, fsync_delay_s: float) -> None:
        self.fsync_delay_s = fsync_delay_s
        self.lock = threading.Lock()
        self.clock = 0
        self.write_end: dict[bytes, int] = {}  # line -> stamp after the write returned
        self.fsyncs: list[tuple[int, int]] = []  # (start stamp, end stamp)

    def stamp(self) -> int:
        with self.lock:
            self.clock += 1
            return self.clock

    def write(self, fd: int, data: bytes) -> int:
        written = super().write(fd, data)
        self.write_end[data] = self.stamp()
        return written

    def fsync(self, fd: int) -> None:
        start = self.stamp()
        time.sleep(self.fsync_delay_s)  # a slow disk: writers arrive while it runs
        super().fsync(fd)
        end = self.stamp()
        with self.lock:
            self.fsyncs.append((start, end))


class GateEnv(TracingEnv):
    """A ``TracingEnv`` running a per-thread hook just before a thread's next fsync."""

    def __init__(self, inner: SimEnv) -> None:
        super().__init__(inner, [])
        self.before_fsync: dict[str, Callable[[], None]] = {}
        self.fsync_threads: list[str] = []

    def fsync(self, fd: int) -> None:
        name = threading.current_thread().name
        self.fsync_threads.append(name)
        hook = self.before_fsync.pop(name, None)
        if hook is not None:
            hook()
        super().fsync(fd)


def _run_threads(count: int, target: Callable[[int], None]) -> None:
    errors: list[BaseException] = []

    def body(index: int) -> None:
        try:
            target(index)
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    if errors:
        raise errors[0]


def _wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.001)


def _followers_waiting(disk: Disk, written: int) -> None:
    """Return once ``written`` records exist and every writer released the mutex.

    A writer holds the WAL mutex from its write until it waits for an fsync (or
    returns), so taking the mutex once afterwards proves they all reached that point.
    """
    wal = disk._wal
    _wait_until(lambda: wal.written_ticket() >= written, f"{written} records are written")
    with wal._mutex:
        pass


# ----------------------------------------------------------------------------- real OS


@pytest.mark.spec("W-20", "W-21", "D-15", "D-1", "W-54")
def test_every_acknowledged_add_is_covered_by_an_fsync_that_began_after_its_write(
        tmp_path: Path) -> None:
    env = StampingEnv(fsync_delay_s=0.002)
    disk = Disk(path=str(tmp_path / "s"), fsync_frequency=0, env=env)
    acked: dict[str, int] = {}
    lines: dict[str, bytes] = {}

    def producer(index: int) -> None:
        for n in range(30):
            task_id = disk.add_task(f"p{index}-{n}".encode(), task_id=f"t{index}-{n}")
            acked[task_id] = env.stamp()

    _run_threads(8, producer)
    for line in env.write_end:
        fields = line.split(b":")  # crc:add:id:publish_at:payload (F-6)
        if len(fields) > 2 and fields[1] == b"add":
            lines[fields[2].decode()] = line
    assert len(acked) == 240 and set(lines) == set(acked)
    for task_id, ack in acked.items():
        written = env.write_end[lines[task_id]]
        covering = [(s, e) for s, e in env.fsyncs if written < s and e < ack]
        assert covering, f"{task_id}: written at {written}, acknowledged at {ack}, no fsync " \
                         f"began after the write and ended before the acknowledgement"
    assert len(env.fsyncs) < len(acked), "no fsync was shared"
    disk.close()


@pytest.mark.spec("W-21", "W-55", "W-56")
def test_sixteen_threads_adding_with_f0_share_fsyncs(tmp_path: Path) -> None:
    env = StampingEnv(fsync_delay_s=0.002)
    disk = Disk(path=str(tmp_path / "s"), fsync_frequency=0, env=env)
    per_thread = 25

    def producer(index: int) -> None:
        for n in range(per_thread):
            disk.add_task(b"x", task_id=f"t{index}-{n}")

    _run_threads(16, producer)
    adds = 16 * per_thread
    assert len(disk.pending_tasks()) == adds
    assert len(env.fsyncs) <= adds // 4, f"{len(env.fsyncs)} fsyncs for {adds} adds"
    disk.close()


# ----------------------------------------------------------------------------- simulated


@pytest.mark.spec("W-22", "W-12", "D-16", "D-10")
def test_a_failed_group_fsync_fails_every_waiter_and_the_wal_stays_broken() -> None:
    sim = SimDisk(0)
    env = GateEnv(sim.process())
    disk = Disk(path="/s", fsync_frequency=0, env=env)
    disk.add_task(b"first", task_id="first")  # ticket 1, durable
    followers = 4
    outcomes: dict[str, BaseException | None] = {}

    def add(task_id: str) -> None:
        try:
            disk.add_task(task_id.encode(), task_id=task_id)
            outcomes[task_id] = None
        except BaseException as exc:  # noqa: BLE001 - checked below
            outcomes[task_id] = exc

    threads = [threading.Thread(target=add, args=(f"f{i}",), name=f"F{i}")
               for i in range(followers)]

    def followers_pile_up() -> None:
        for thread in threads:
            thread.start()
        _followers_waiting(disk, 2 + followers)

    env.before_fsync["L"] = followers_pile_up
    sim.inject(FaultRule(op="fsync", fault=FsyncEio(), path="/s/deferred-0-*"))
    leader = threading.Thread(target=add, args=("lead",), name="L")
    leader.start()
    leader.join(20)
    for thread in threads:
        thread.join(20)
    assert set(outcomes) == {"lead", *(f"f{i}" for i in range(followers))}
    for task_id, outcome in outcomes.items():
        assert isinstance(outcome, StorageBrokenError), (task_id, outcome)
    assert env.fsync_threads.count("L") == 1
    assert not any(name.startswith("F") for name in env.fsync_threads), "a follower retried"
    assert disk._wal.broken
    disk.sync_through(1)  # covered before the failure: still true
    with pytest.raises(StorageBrokenError):
        disk.sync_through(2)
    with pytest.raises(StorageBrokenError):
        disk.add_task(b"later")
    with pytest.raises(StorageBrokenError):
        disk.sync()
    disk.close()
    sim.faults.clear()
    rebooted = Disk(path="/s", fsync_frequency=0, env=SimDisk(0, image=sim.durable_image()).process())
    assert "first" in [t.task_id for t in rebooted.pending_tasks()]


@pytest.mark.spec("W-23", "W-9", "W-77")
def test_rotation_is_deferred_while_an_fsync_is_in_flight(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_wal, "WAL_SIZE_LIMIT_BYTES", 300)
    sim = SimDisk(1)
    env = GateEnv(sim.process())
    disk = Disk(path="/s", fsync_frequency=0.5, env=env)
    ids = [disk.add_task(b"x" * 40) for _ in range(8)]
    wal = disk._wal
    assert wal._size >= 300
    before = wal.file_name
    seen: list[str] = []

    def remove_during_fsync() -> None:  # runs in this thread, inside sync(), mutex released
        disk.remove_task(ids[0])
        seen.append(wal.file_name)

    env.before_fsync[threading.current_thread().name] = remove_during_fsync
    disk.sync()
    assert seen == [before], "W-23: rotated while an fsync of the old file was in flight"
    assert wal.written_ticket() > wal._durable  # the removal came after the fsync began
    disk.remove_task(ids[1])  # nothing in flight now: this one rotates
    assert wal.file_name != before
    assert wal._durable == wal.written_ticket()  # W-23: the rotated copy is durable
    fsyncs = len(env.fsync_threads)
    disk.sync_through(disk.written_ticket())
    assert len(env.fsync_threads) == fsyncs  # nothing left to fsync
    disk.close()
    rebooted = Disk(path="/s", fsync_frequency=0.5, env=SimDisk(1, image=sim.durable_image()).process())
    assert sorted(t.task_id for t in rebooted.pending_tasks()) == sorted(ids[2:])


@pytest.mark.spec("C-9", "W-78")
def test_close_waits_for_an_fsync_in_flight() -> None:
    sim = SimDisk(2)
    env = GateEnv(sim.process())
    disk = Disk(path="/s", fsync_frequency=0.5, env=env)
    disk.add_task(b"a", task_id="a")
    closer = threading.Thread(target=disk.close, name="C")
    still_waiting: list[bool] = []

    def close_meanwhile() -> None:
        closer.start()
        closer.join(0.2)
        still_waiting.append(closer.is_alive())

    env.before_fsync["L"] = close_meanwhile
    syncer = threading.Thread(target=disk.sync, name="L")
    syncer.start()
    syncer.join(20)
    closer.join(20)
    assert still_waiting == [True], "close did not wait for the fsync in flight"
    assert not closer.is_alive()
    with pytest.raises(StorageClosedError):
        disk.add_task(b"b")


@pytest.mark.spec("W-24", "C-12", "C-13", "C-14", "D-15")
def test_unsynced_writes_need_sync_through_to_survive_a_power_loss() -> None:
    sim = SimDisk(3)
    disk = Disk(path="/s", fsync_frequency=0, env=sim.process())
    before = disk.written_ticket()
    task_id = disk.add_task(b"a", sync=False)
    ticket = disk.written_ticket()
    assert ticket == before + 1
    lost = Disk(path="/s", fsync_frequency=0, env=SimDisk(3, image=sim.durable_image()).process())
    assert lost.pending_tasks() == []  # W-24: no fsync inside the call
    disk.sync_through(ticket)
    kept = Disk(path="/s", fsync_frequency=0, env=SimDisk(3, image=sim.durable_image()).process())
    assert [t.task_id for t in kept.pending_tasks()] == [task_id]
    disk.remove_task(task_id, sync=False)
    assert disk.written_ticket() == ticket + 1
    disk.remove_task(task_id, sync=False)  # not pending: writes nothing (W-6), no new ticket
    assert disk.written_ticket() == ticket + 1
    disk.sync_through(ticket + 1)
    gone = Disk(path="/s", fsync_frequency=0, env=SimDisk(3, image=sim.durable_image()).process())
    assert gone.pending_tasks() == []
    disk.close()


@pytest.mark.spec("C-12", "C-13", "C-14", "W-20", "W-24")
def test_sync_false_and_sync_through_on_the_real_os_fsync_once(tmp_path: Path) -> None:
    env = RecordingEnv()
    disk = Disk(path=str(tmp_path / "s"), fsync_frequency=0, env=env)
    env.clear()
    first = disk.add_task(b"a", sync=False)
    disk.add_task(b"b", sync=False)
    disk.remove_task(first, sync=False)
    assert env.calls_of("fsync") == []
    ticket = disk.written_ticket()
    disk.sync_through(ticket)
    assert len(env.calls_of("fsync")) == 1
    disk.sync_through(ticket)
    disk.sync_through(0)
    disk.sync()
    assert len(env.calls_of("fsync")) == 1  # everything was durable already
    disk.close()


@pytest.mark.spec("C-15", "C-7", "C-9")
def test_sync_and_ticket_arguments_are_validated_before_any_io(tmp_path: Path) -> None:
    storage = tmp_path / "s"
    disk = Disk(path=str(storage), fsync_frequency=0)
    disk.add_task(b"a", task_id="a")
    before = snapshot(storage)
    bad_calls: list[Callable[[], object]] = [
        lambda: disk.add_task(b"x", sync=1),  # type: ignore[arg-type]
        lambda: disk.add_task(b"x", sync=None),  # type: ignore[arg-type]
        lambda: disk.remove_task("a", sync="no"),  # type: ignore[arg-type]
        lambda: disk.sync_through(-1),
        lambda: disk.sync_through(True),
        lambda: disk.sync_through(1.0),  # type: ignore[arg-type]
        lambda: disk.sync_through("1"),  # type: ignore[arg-type]
        lambda: disk.sync_through(disk.written_ticket() + 1),
    ]
    for call in bad_calls:
        with pytest.raises(ValueError) as info:
            call()
        assert "sync" in str(info.value) or "ticket" in str(info.value)
    assert snapshot(storage) == before
    assert [t.task_id for t in disk.pending_tasks()] == ["a"]
    disk.close()
    with pytest.raises(StorageClosedError):
        disk.written_ticket()
    with pytest.raises(StorageClosedError):
        disk.sync_through(0)
    with pytest.raises(ValueError):
        disk.sync_through(-1)  # arguments first, then the state (api.md notes)


@pytest.mark.spec("C-10", "C-12", "C-13", "C-14")
def test_nil_has_the_group_commit_methods_as_no_ops() -> None:
    nil = Nil()
    add: Callable[..., object] = nil.add_task
    remove: Callable[..., object] = nil.remove_task
    sync_through: Callable[[int], object] = nil.sync_through
    assert add(b"a", sync=False) is None
    assert remove("a", sync=False) is None
    assert sync_through(0) is None
    assert nil.written_ticket() == 0


@pytest.mark.spec("W-57", "W-8")
def test_with_a_period_an_add_whose_fsync_is_due_does_not_wait_for_the_one_in_flight() -> None:
    sim = SimDisk(3)
    env = GateEnv(sim.process())
    disk = Disk(path="/s", fsync_frequency=0.5, env=env)
    disk.add_task(b"a", task_id="a")
    added: list[str] = []
    fsyncs_before: list[int] = []

    def add_while_the_fsync_runs() -> None:  # this thread's own fsync is in flight
        sim.advance(1.0)  # the period has passed: the add below finds its fsync due
        fsyncs_before.append(len(env.fsync_threads))
        added.append(disk.add_task(b"b", task_id="b"))  # would deadlock if it waited

    env.before_fsync[threading.current_thread().name] = add_while_the_fsync_runs
    disk.sync()
    assert added == ["b"]
    assert len(env.fsync_threads) == fsyncs_before[0]  # the add issued no fsync of its own
    assert disk._wal.written_ticket() > disk._wal._durable  # "b" waits for a later fsync
    disk.sync()
    assert disk._wal._durable == disk._wal.written_ticket()
    disk.close()
