"""The simulated Env agrees with the real one, and the engine runs on it.

Goal: every crash test built on ``deferq.crashtest`` is only as good as the simulator's
fidelity when nothing crashes (the pyfakefs lesson: no-op fsync and flock, unfaked
pread). Method: Hypothesis generates random sequences of seam calls (open with every
flag combination, write, pread, ftruncate, allocate, seek, a store into a mapping, fstat, close,
rename, unlink, makedirs, listdir, fsync, fsync_dir, flock from two descriptions, calls on closed
descriptors)
and runs each on a fresh ``SimEnv`` and on ``OsEnv`` in a temporary directory of the
real local filesystem; return values (descriptors as handles, directory listings
sorted), errnos and the final tree must be equal. The same is done one level up: a
random workload on ``Disk(env=SimEnv)`` and ``Disk(env=OsEnv)`` must observe the same
tasks (generated ids compared by order of generation, wall-clock fields left out).
Last, smoke tests run the real engine through power losses and damage at rest.
"""

from __future__ import annotations

import errno
import inspect
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deferq._engine.env import Env, OpenFlag
from deferq._core.names import is_wal_file_name
from deferq._engine.osenv import OsEnv
from deferq._core.types import DeadTask, PendingTask
from deferq.backends import Disk
from deferq.crashtest import Bound, SimDisk, SimEnv, flip_bit

PATHS = ("a", "b", "d", "d/a", "d/b", "a/x", "e/f", "d/")
HANDLES = st.integers(0, 7)
BAD_FD = 1_000_000  # never open: calls on a closed handle use it, so OS fd reuse cannot alias

open_flags = st.sets(st.sampled_from(list(OpenFlag))).map(
    lambda members: OpenFlag(sum(m.value for m in members)))

opens = st.tuples(st.just("open"), st.sampled_from(PATHS), open_flags)
seam_ops = st.one_of(
    opens, opens, opens,
    st.tuples(st.just("write"), HANDLES, st.binary(max_size=12)),
    st.tuples(st.just("pread"), HANDLES, st.integers(0, 12), st.integers(0, 16)),
    st.tuples(st.just("ftruncate"), HANDLES, st.integers(0, 16)),
    st.tuples(st.just("allocate"), HANDLES, st.integers(-1, 16), st.integers(-1, 16)),
    st.tuples(st.just("seek"), HANDLES, st.integers(-1, 20)),
    st.tuples(st.just("store"), HANDLES, st.integers(0, 16), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("fstat"), HANDLES),
    st.tuples(st.just("close"), HANDLES),
    st.tuples(st.just("fsync"), HANDLES),
    st.tuples(st.just("flock"), HANDLES),
    st.tuples(st.just("unlock"), HANDLES),
    st.tuples(st.just("rename"), st.sampled_from(PATHS), st.sampled_from(PATHS)),
    st.tuples(st.just("unlink"), st.sampled_from(PATHS)),
    st.tuples(st.just("makedirs"), st.sampled_from(PATHS)),
    st.tuples(st.just("listdir"), st.sampled_from((*PATHS, ""))),
    st.tuples(st.just("fsync_dir"), st.sampled_from((*PATHS, ""))),
)


RW_NEW = OpenFlag.READ | OpenFlag.WRITE | OpenFlag.CREATE
# Every sequence starts from a small tree with two open files, so most calls do something.
PRELUDE: list[tuple[object, ...]] = [
    ("makedirs", "d"),
    ("open", "a", RW_NEW),
    ("write", 0, b"hello"),
    ("open", "d/a", RW_NEW | OpenFlag.APPEND),
    ("write", 1, b"world"),
]


class SeamRunner:
    """Runs seam calls on one Env under ``root`` and normalizes what they return."""

    def __init__(self, env: Env, root: str, is_dir: Callable[[str], bool]) -> None:
        self.env = env
        self.root = root
        self.is_dir = is_dir
        self.handles: list[tuple[int | None, bool]] = []  # (fd or None once closed, is a dir)

    def path(self, rel: str) -> str:
        return f"{self.root.rstrip('/')}/{rel}" if rel else self.root

    def fd(self, handle: int) -> tuple[int, bool]:
        fd, is_dir = self.handles[handle % len(self.handles)]
        return (BAD_FD if fd is None else fd), is_dir

    def run(self, op: tuple[object, ...]) -> object:
        try:
            return self._run(op)
        except OSError as exc:
            assert exc.errno is not None
            return ("error", errno.errorcode[exc.errno])

    def _run(self, op: tuple[object, ...]) -> object:  # noqa: PLR0911, C901 - a dispatch table
        env, kind = self.env, op[0]
        if kind == "open":
            assert isinstance(op[1], str) and isinstance(op[2], OpenFlag)
            fd = env.open(self.path(op[1]), op[2])
            self.handles.append((fd, self.is_dir(self.path(op[1]))))
            return ("opened", len(self.handles) - 1)
        if kind in ("rename", "unlink", "makedirs", "listdir", "fsync_dir"):
            return self._run_path_op(op)
        if not self.handles:
            return "no handle"
        assert isinstance(op[1], int)
        fd, is_dir = self.fd(op[1])
        if kind == "write":
            assert isinstance(op[2], bytes)
            return env.write(fd, op[2])
        if kind == "pread":
            assert isinstance(op[2], int) and isinstance(op[3], int)
            return env.pread(fd, op[2], op[3])
        if kind == "ftruncate":
            assert isinstance(op[2], int)
            env.ftruncate(fd, op[2])
            return None
        if kind == "allocate":
            assert isinstance(op[2], int) and isinstance(op[3], int)
            env.allocate(fd, op[2], op[3])
            return None
        if kind == "seek":
            assert isinstance(op[2], int)
            env.seek(fd, op[2])
            return None
        if kind == "store":
            return self._store(fd, is_dir, op)
        if kind == "fstat":
            st_ = env.fstat(fd)
            return ("dir", st_.links) if is_dir else ("file", st_.size, st_.links)
        if kind == "close":
            env.close(fd)
            self.handles[op[1] % len(self.handles)] = (None, is_dir)
            return None
        if kind == "fsync":
            env.fsync(fd)
            return None
        if kind == "flock":
            return env.flock_exclusive_nb(fd)
        assert kind == "unlock"
        env.flock_unlock(fd)
        return None

    def _store(self, fd: int, is_dir: bool, op: tuple[object, ...]) -> object:
        """W-26: map the whole (non-empty) file at offset 0, store inside it, unmap."""
        assert isinstance(op[2], int) and isinstance(op[3], bytes)
        size = self.env.fstat(fd).size
        if is_dir or size == 0:
            return "not mappable here"  # Python's mmap refuses an empty file (ValueError)
        at = op[2] % size
        data = op[3][:size - at]
        window = self.env.map_shared(fd, 0, size)
        try:
            window[at:at + len(data)] = data
        finally:
            window.close()
        return ("stored", len(data))

    def _run_path_op(self, op: tuple[object, ...]) -> object:
        env, kind, rel = self.env, op[0], op[1]
        assert isinstance(rel, str)
        if kind == "rename":
            assert isinstance(op[2], str)
            env.rename(self.path(rel), self.path(op[2]))
            return None
        if kind == "unlink":
            env.unlink(self.path(rel))
            return None
        if kind == "makedirs":
            env.makedirs(self.path(rel))
            return None
        if kind == "listdir":
            return sorted(env.listdir(self.path(rel)))
        assert kind == "fsync_dir"
        env.fsync_dir(self.path(rel))
        return None

    def close_all(self) -> None:
        for fd, _ in self.handles:
            if fd is not None:
                self.env.close(fd)
        self.handles.clear()


def os_tree(root: str) -> dict[str, bytes | None]:
    out: dict[str, bytes | None] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for name in dirnames:
            out[os.path.normpath(os.path.join(rel, name))] = None
        for name in filenames:
            with open(os.path.join(dirpath, name), "rb") as handle:
                out[os.path.normpath(os.path.join(rel, name))] = handle.read()
    return out


def sim_tree(disk: SimDisk) -> dict[str, bytes | None]:
    image = disk.volatile_image()
    return {n.path.lstrip("/"): n.data for n in image.nodes if n.path != "/"}


@pytest.mark.spec("M-13")
@given(st.lists(seam_ops, max_size=40))
def test_sim_env_agrees_with_the_os_on_random_seam_calls(ops: list[tuple[object, ...]]) -> None:
    disk = SimDisk()
    sim = SeamRunner(disk.process(), "/", disk.is_dir)
    with tempfile.TemporaryDirectory(prefix="deferq-conformance-") as root:
        real = SeamRunner(OsEnv(), root, os.path.isdir)
        try:
            for index, op in enumerate(PRELUDE + ops):
                expected, got = real.run(op), sim.run(op)
                assert got == expected, f"call {index} {op!r}: os={expected!r} sim={got!r}"
            assert sim_tree(disk) == os_tree(root)
            disk.check_invariants()
        finally:
            real.close_all()


@pytest.mark.spec("A-8")
def test_flock_of_a_second_description_conflicts_on_both_envs() -> None:
    disk = SimDisk()
    with tempfile.TemporaryDirectory(prefix="deferq-conformance-") as root:
        for env, base in ((OsEnv(), root), (disk.process(), "/")):
            path = f"{base.rstrip('/')}/lock"
            first = env.open(path, OpenFlag.READ | OpenFlag.WRITE | OpenFlag.CREATE)
            second = env.open(path, OpenFlag.READ)
            assert env.flock_exclusive_nb(first) and not env.flock_exclusive_nb(second)
            env.flock_unlock(first)
            assert env.flock_exclusive_nb(second) and not env.flock_exclusive_nb(first)
            env.close(second)
            assert env.flock_exclusive_nb(first)
            env.close(first)


_PROBE = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    print("taken")
except BlockingIOError:
    print("busy")
"""


def other_process_can_lock(path: str) -> bool:
    out = subprocess.run([sys.executable, "-c", _PROBE, path], check=True, capture_output=True,
                         text=True, timeout=30).stdout.strip()
    assert out in ("taken", "busy"), out
    return out == "taken"


@pytest.mark.spec("A-1", "A-8")
@pytest.mark.multiprocess
def test_flock_excludes_another_process_on_the_local_filesystem_as_in_the_sim() -> None:
    disk = SimDisk()
    holder, other = disk.process(), disk.process()
    with tempfile.TemporaryDirectory(prefix="deferq-conformance-") as root:
        path = os.path.join(root, "lock")
        env = OsEnv()
        fd = env.open(path, OpenFlag.READ | OpenFlag.WRITE | OpenFlag.CREATE)
        sim_fd = holder.open("/lock", OpenFlag.READ | OpenFlag.WRITE | OpenFlag.CREATE)
        other_fd = other.open("/lock", OpenFlag.READ | OpenFlag.WRITE)
        assert env.flock_exclusive_nb(fd) and holder.flock_exclusive_nb(sim_fd)
        assert other_process_can_lock(path) is other.flock_exclusive_nb(other_fd) is False
        env.flock_unlock(fd)
        holder.flock_unlock(sim_fd)
        assert other_process_can_lock(path) is other.flock_exclusive_nb(other_fd) is True
        env.close(fd)


# ---------------------------------------------------------------------- the Disk backend

IDS = ("t1", "t2", "17-t3", "dup")


class Boom(Exception):
    """The exception dead tasks are recorded with (never raised: no backtrace)."""


disk_ops = st.one_of(
    st.tuples(st.just("add"), st.binary(max_size=20), st.sampled_from((None, 5, 10**10)),
              st.sampled_from((None, *IDS))),
    st.tuples(st.just("remove"), st.sampled_from(IDS) | st.integers(0, 5)),
    st.tuples(st.just("pending")),
    st.tuples(st.just("add_dead"), st.sampled_from(IDS) | st.integers(0, 5), st.binary(max_size=20),
              st.text(max_size=10), st.integers(0, 30)),
    st.tuples(st.just("list_dead"), st.sampled_from((None, 0, 1, 2, 5)), st.integers(0, 3)),
    st.tuples(st.just("find_dead"), st.sampled_from(IDS) | st.integers(0, 5)),
    st.tuples(st.just("remove_dead"), st.lists(st.sampled_from(IDS) | st.integers(0, 5),
                                               max_size=3)),
    st.tuples(st.just("sync")),
    st.tuples(st.just("reopen")),
)


@dataclass
class DiskRunner:
    """Runs a workload on one ``Disk``; generated ids become ``gen<k>`` by order of birth."""

    factory: Callable[[], Disk]
    backend: Disk
    generated: list[str]

    def task_id(self, ref: object) -> str:
        if isinstance(ref, str):
            return ref
        assert isinstance(ref, int)
        return self.generated[ref % len(self.generated)] if self.generated else "none"

    def name(self, task_id: str) -> str:
        return f"gen{self.generated.index(task_id)}" if task_id in self.generated else task_id

    def pending(self, tasks: list[PendingTask]) -> list[tuple[str, bytes, int | None]]:
        return [(self.name(t.task_id), t.context, t.publish_at) for t in tasks]

    def dead(self, task: DeadTask | None) -> object:
        if task is None:
            return None
        enqueued = task.enqueued_at if task.id not in self.generated else "generated"
        return (self.name(task.id), task.task_class, task.attempts, enqueued,
                task.exception_class, task.exception_message, task.backtrace, task.context)

    def run(self, op: tuple[object, ...]) -> object:  # noqa: PLR0911 - a dispatch table
        b, kind = self.backend, op[0]
        if kind == "add":
            assert isinstance(op[1], bytes)
            publish_at = op[2] if isinstance(op[2], int) else None
            given_id = op[3] if isinstance(op[3], str) else None
            task_id = b.add_task(op[1], publish_at, given_id)
            if given_id is None:
                self.generated.append(task_id)
            return self.name(task_id)
        if kind == "remove":
            b.remove_task(self.task_id(op[1]))
            return None
        if kind == "pending":
            return self.pending(b.pending_tasks())
        if kind == "add_dead":
            assert isinstance(op[2], bytes) and isinstance(op[3], str) and isinstance(op[4], int)
            task_class = op[3] or "Task"
            return self.name(b.add_dead_task(self.task_id(op[1]), op[2], Boom(op[3]),
                                             task_class=task_class, attempts=op[4]))
        if kind == "list_dead":
            limit = op[1] if isinstance(op[1], int) else None
            assert isinstance(op[2], int)
            return [self.dead(t) for t in b.list_dead_tasks(limit=limit, offset=op[2])]
        if kind == "find_dead":
            return self.dead(b.find_dead_task(self.task_id(op[1])))
        if kind == "remove_dead":
            assert isinstance(op[1], list)
            return b.remove_dead_tasks([self.task_id(ref) for ref in op[1]])
        if kind == "sync":
            b.sync()
            return None
        assert kind == "reopen"
        b.close()
        self.backend = self.factory()
        return self.pending(self.backend.pending_tasks())


@pytest.mark.spec("M-13")
@settings(max_examples=max(10, settings().max_examples // 5))
@given(st.lists(disk_ops, max_size=15))
def test_disk_on_sim_env_observes_what_disk_on_os_env_observes(
        ops: list[tuple[object, ...]]) -> None:
    disk = SimDisk()

    def sim_factory() -> Disk:
        return Disk(path="/s", env=disk.process(), fsync_frequency=0)

    with tempfile.TemporaryDirectory(prefix="deferq-conformance-") as root:
        def os_factory() -> Disk:
            return Disk(path=os.path.join(root, "s"), env=OsEnv(), fsync_frequency=0)

        real = DiskRunner(os_factory, os_factory(), [])
        sim = DiskRunner(sim_factory, sim_factory(), [])
        try:
            for index, op in enumerate(ops):
                assert sim.run(op) == real.run(op), f"call {index}: {op!r}"
            assert file_names(sim_tree(disk)) == file_names(os_tree(root))
        finally:
            real.backend.close()
            sim.backend.close()


def file_names(tree: dict[str, bytes | None]) -> list[str]:
    """The tree's paths, sorted, with WAL file names (pid, date, random part) as ``<wal>``."""
    return sorted("s/<wal>" if is_wal_file_name("deferred-", p.rpartition("/")[2]) else p
                  for p in tree)


# ---------------------------------------------------------------------- the engine on SimEnv


@pytest.fixture(autouse=True)
def _quiet_engine_warnings() -> Iterator[None]:
    # Crash states are full of torn records; the engine logs each one it skips.
    logger = logging.getLogger("deferq")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)


@pytest.mark.parametrize("model", ["weakest", "ext4_ordered", "prefix"])
def test_engine_on_sim_env_keeps_every_acknowledged_task_through_power_loss(model: str) -> None:
    for seed in range(8):
        disk = SimDisk(seed)
        backend = Disk(path="/s", env=disk.process(), fsync_frequency=0)
        acked = [backend.add_task(b"ctx%d" % i) for i in range(4)]
        backend.remove_task(acked[0])
        backend.add_task(b"unacknowledged")  # in flight when the power goes
        state = disk.power_loss(model, seed)
        reopened = Disk(path="/s", env=disk.process(), fsync_frequency=0)
        pending = {t.task_id for t in reopened.pending_tasks()}
        assert set(acked[1:]) <= pending, f"seed {seed}: {state}"
        reopened.close()


def test_engine_recovers_from_every_bounded_crash_state_of_an_unsynced_workload() -> None:
    disk = SimDisk(3)
    backend = Disk(path="/s", env=disk.process(), fsync_frequency=60)
    added = {backend.add_task(b"ctx%d" % i) for i in range(2)}
    backend.sync()
    synced = set(added)
    added |= {backend.add_task(b"late")}
    states = list(disk.crash_states("weakest", Bound(random_states=16)))
    assert len(states) > 50
    for state in states:
        rebooted = state.to_disk()
        reopened = Disk(path="/s", env=rebooted.process(), fsync_frequency=0)
        pending = {t.task_id for t in reopened.pending_tasks()}
        assert synced <= pending <= added, str(state)
        reopened.add_task(b"still works")  # and the recovered store accepts new work
        reopened.close()


@pytest.mark.spec("D-6", "C-11")
@pytest.mark.parametrize("model", ["prefix", "ext4_ordered", "weakest"])
def test_a_nested_storage_path_is_durable_before_the_first_add_returns(model: str) -> None:
    disk = SimDisk()
    backend = Disk(path="/x/y/s", env=disk.process(), fsync_frequency=0)
    acked = backend.add_task(b"acknowledged")
    for state in disk.crash_states(model):
        reopened = Disk(path="/x/y/s", env=state.to_disk().process(), fsync_frequency=0)
        assert acked in {t.task_id for t in reopened.pending_tasks()}, str(state)
        reopened.close()


@pytest.mark.spec("A-9")
def test_a_bit_flip_at_rest_in_a_wal_record_is_detected_not_repaired() -> None:
    disk = SimDisk()
    backend = Disk(path="/s", env=disk.process(), fsync_frequency=0)
    first = backend.add_task(b"first")
    second = backend.add_task(b"second")
    wal = f"/s/{backend._wal.file_name}"  # noqa: SLF001 - the test needs the file's name
    backend.close()
    flip_bit(disk, wal, 8 * 12)  # a byte inside the first record's body
    disk.power_loss("prefix", 0)
    reopened = Disk(path="/s", env=disk.process(), fsync_frequency=0)
    assert [t.task_id for t in reopened.pending_tasks()] == [second]
    assert reopened._wal.corrupt_records == 1  # noqa: SLF001
    assert first not in {t.task_id for t in reopened.pending_tasks()}
    reopened.close()


@pytest.mark.spec("M-13")
def test_sim_env_implements_the_env_protocol_exactly() -> None:
    env_methods = {n for n in dir(Env) if not n.startswith("_")}
    assert env_methods <= {n for n in dir(SimEnv) if not n.startswith("_")}
    assert env_methods <= {n for n in dir(OsEnv) if not n.startswith("_")}
    for name in env_methods:
        expected = inspect.signature(getattr(Env, name))
        got = inspect.signature(getattr(SimEnv, name))
        assert list(got.parameters) == list(expected.parameters), name


@pytest.mark.spec("F-16")
def test_a_directory_is_never_opened_as_a_file_by_either() -> None:
    # F-16: both Envs refuse a directory where a store file is expected, with the same
    # errno (EINVAL to read, EISDIR to write), as UnsafeEntryError.
    from deferq._core.errors import UnsafeEntryError

    disk = SimDisk()
    env = disk.process()
    env.makedirs("/d/e")
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "d", "e"))
        for opener, path in ((env.open, "/d"), (OsEnv().open, os.path.join(root, "d"))):
            for flags, code in ((OpenFlag.READ, errno.EINVAL),
                                (OpenFlag.READ | OpenFlag.WRITE, errno.EISDIR)):
                with pytest.raises(UnsafeEntryError) as refused:
                    opener(path, flags)
                assert refused.value.errno == code
