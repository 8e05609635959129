"""Filesystem faults a running worker meets: its files deleted, a full disk, failed fsyncs
(spec/wal.md W-80..W-82, spec/dead-tasks.md S-91, S-92, spec/queue.md Q-176, Q-177).

Goal: under each fault the error names what failed (the file's path and the errno's meaning),
a broken store keeps saying why, nothing acknowledged is lost, and an operator command prints
one line, never a traceback. Method: real files in ``tmp_path`` for the deleted WAL file and
the removed storage directory (a worker keeps writing into a file that has no name, which
only a real directory shows as it is); the simulated disk's ``FaultRule`` for ENOSPC and
EIO at a chosen write or fsync; and, for the command line, a real ``deferq`` process whose
file-size limit (``RLIMIT_FSIZE``, no root needed) makes its writes fail with ``EFBIG``.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import deferq
from deferq._core.errors import StorageBrokenError
from deferq._core.names import is_wal_file_name, schedules_tmp_name
from deferq._engine.env import FileStat, OpenFlag
from deferq._engine.osenv import DirEnv, OsEnv
from deferq._engine.scan import scan_pending
from deferq._engine.verify import verify_file
from deferq.backends import Disk
from deferq.crashtest import Enospc, FaultRule, FsyncEio, SimDisk

PREFIX = "deferred-"


def wal_files(storage: Path) -> list[Path]:
    return sorted(p for p in storage.iterdir() if is_wal_file_name(PREFIX, p.name))


def pending(disk: Disk) -> dict[str, bytes]:
    return {task.task_id: task.context for task in disk.pending_tasks()}


# ----------------------------------------------------------------------------- a deleted WAL file


@pytest.mark.spec("W-80")
@pytest.mark.parametrize("when", ["sweep", "close"])
def test_a_wal_file_deleted_under_a_running_worker_is_copied_back_with_every_pending_task(
        storage: Path, when: str, caplog: pytest.LogCaptureFixture) -> None:
    disk = Disk(path=storage, prefix=PREFIX, fsync_frequency=0.5)
    try:
        for n in range(5):
            disk.add_task(b"task-%d" % n, task_id=f"t{n}")
        disk.remove_task("t1")
        (deleted,) = wal_files(storage)
        deleted.unlink()  # by hand, while the worker runs
        disk.add_task(b"after", task_id="t5")  # acknowledged into the nameless file
        disk.remove_task("t2")
        want = pending(disk)
        assert set(want) == {"t0", "t3", "t4", "t5"}
        with caplog.at_level(logging.WARNING, logger="deferq"):
            if when == "sweep":
                assert disk.adopt_orphans() == []
                (copy,) = wal_files(storage)
                assert copy != deleted
                disk.add_task(b"later", task_id="t6")  # goes into the copy
                want["t6"] = b"later"
    finally:
        with caplog.at_level(logging.WARNING, logger="deferq"):
            disk.close()
    assert any(str(deleted) in r.getMessage() and "deleted" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    with Disk(path=storage, prefix=PREFIX, fsync_frequency=0) as reopened:
        assert pending(reopened) == want
        assert reopened._wal.corrupt_records == 0


class _LyingLinks(OsEnv):
    """The real filesystem, except that ``fstat`` says 0 links once ``lying`` is set."""

    lying = False

    def fstat(self, fd: int) -> FileStat:
        stat = super().fstat(fd)
        return stat._replace(links=0) if self.lying else stat


@pytest.mark.spec("W-80")
def test_a_link_count_of_0_is_checked_against_the_name_before_anything_is_copied(
        storage: Path) -> None:
    env = _LyingLinks()
    with Disk(path=storage, prefix=PREFIX, fsync_frequency=0, env=env) as disk:
        disk.add_task(b"a", task_id="a")
        (main,) = wal_files(storage)
        env.lying = True
        for _ in range(3):  # a copy per sweep would pile up files
            assert disk.adopt_orphans() == []
        assert wal_files(storage) == [main]
        disk.add_task(b"b", task_id="b")
        env.lying = False
    with Disk(path=storage, prefix=PREFIX, fsync_frequency=0) as reopened:
        assert pending(reopened) == {"a": b"a", "b": b"b"}


class _ReadEio(OsEnv):
    """The real filesystem, except that ``pread`` fails as a bad sector does once ``failing``
    is set: with the kernel's error, which names no file."""

    failing = False

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        if self.failing:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return super().pread(fd, size, offset)


@pytest.mark.spec("W-82")
def test_a_read_error_while_adopting_names_the_orphan(storage: Path) -> None:
    with Disk(path=storage, prefix=PREFIX, fsync_frequency=0) as disk:
        disk.add_task(b"a", task_id="a")
        (orphan,) = wal_files(storage)
    env = _ReadEio()
    env.failing = True
    with pytest.raises(OSError) as info:
        Disk(path=storage, prefix=PREFIX, fsync_frequency=0, env=env)
    assert info.value.filename == str(orphan), info.value
    assert wal_files(storage) == [orphan]  # left for the next worker
    with Disk(path=storage, prefix=PREFIX, fsync_frequency=0) as reopened:
        assert pending(reopened) == {"a": b"a"}


@pytest.mark.spec("Q-177")
def test_the_operators_read_only_scans_name_a_file_they_cannot_read(storage: Path) -> None:
    with Disk(path=storage, prefix=PREFIX, fsync_frequency=0) as disk:
        disk.add_task(b"a", task_id="a")
        disk.add_dead_task("d", b"c", ValueError("x"), task_class="T", attempts=1)
        (wal,) = wal_files(storage)
    env = _ReadEio()
    env.failing = True
    with pytest.raises(OSError) as scanned:  # deferq pending list, stats
        scan_pending(env, str(storage), PREFIX)
    assert scanned.value.filename == str(wal)
    for name, kind in ((wal.name, "wal"), (f"{PREFIX}dead_tasks-0", "dead")):  # deferq verify
        report = verify_file(env, str(storage), name, kind)  # reported, not raised
        assert report is not None and report.faults == {"unreadable (Input/output error)": 1}


@pytest.mark.spec("Q-178", "Q-17")
def test_verify_reports_a_file_it_cannot_read_and_scans_the_others(
        storage: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An unreadable WAL file (EIO on its reads) is one damaged file in the report; the dead
    data file after it is still scanned, and the exit status is 4."""
    from deferq._cli import main
    with Disk(path=storage, prefix=PREFIX, fsync_frequency=0) as disk:
        disk.add_task(b"a", task_id="a")
        disk.add_dead_task("d", b"c", ValueError("x"), task_class="T", attempts=1)
        (wal,) = wal_files(storage)
    real_pread = os.pread
    bad = os.open(wal, os.O_RDONLY)  # to tell the WAL file's descriptors by their inode
    inode = os.fstat(bad).st_ino
    os.close(bad)

    def pread(fd: int, size: int, offset: int) -> bytes:
        if os.fstat(fd).st_ino == inode:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_pread(fd, size, offset)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "pread", pread)
        status = main(["verify", "--path", str(storage), "--prefix", PREFIX])
    out = capsys.readouterr().out.splitlines()
    assert status == 4, out
    assert f"wal  {wal.name}: 0 bytes, 0 records, damage: unreadable (Input/output error) x1" in out
    assert any(line.startswith(f"dead {PREFIX}dead_tasks-0:") and "1 records, damage: none"
               in line for line in out), out
    assert out[-1] == "verify: files=2 records=1 damaged_files=1"


@pytest.mark.spec("W-81", "W-82")
def test_a_removed_storage_directory_breaks_the_wal_with_an_error_naming_it(
        storage: Path) -> None:
    disk = Disk(path=storage, prefix=PREFIX, fsync_frequency=0)
    try:
        disk.add_task(b"a", task_id="a")
        (lost,) = wal_files(storage)
        shutil.rmtree(storage)
        with pytest.raises(StorageBrokenError) as info:
            disk.adopt_orphans()
        message = str(info.value)
        assert str(lost) in message and str(storage) in message
        assert "No such file or directory" in message and "1 pending task" in message
        # Every later call refuses, and says why: no add is acknowledged into a file
        # that no restart could find.
        with pytest.raises(StorageBrokenError, match="was deleted while this worker ran"):
            disk.add_task(b"b", task_id="b")
        # The dead-task store's error names the file by its path, not a bare name.
        with pytest.raises(FileNotFoundError) as missing:
            disk.add_dead_task("d", b"c", ValueError("x"), task_class="T", attempts=1)
        assert missing.value.filename == f"{storage}/{PREFIX}dead_tasks-0"
    finally:
        disk.close()


@pytest.mark.spec("Q-176", "W-80")
def test_a_queue_goes_on_with_every_task_after_its_wal_file_is_deleted(storage: Path) -> None:
    registry = deferq.TaskRegistry()

    class Later(deferq.Task, name="faults.Later", registry=registry):
        def perform(self) -> None:
            raise AssertionError("scheduled an hour from now: never runs here")

    async def main() -> tuple[list[str], str]:
        disk = Disk(path=storage, prefix=PREFIX, fsync_frequency=0)
        queue = deferq.Queue(disk, registry=registry, sweep_interval=0.05)
        await queue.start()
        ids = [await queue.adefer(Later.options(delay=3600)) for _ in range(3)]
        (deleted,) = wal_files(storage)
        deleted.unlink()
        ids.append(await queue.adefer(Later.options(delay=3600)))
        for _ in range(200):  # the next sweep copies the tasks back (at most 2 s)
            if wal_files(storage):
                break
            await asyncio.sleep(0.01)
        ids.append(await queue.adefer(Later.options(delay=3600)))
        await asyncio.wait_for(queue.stop(timeout=1), 5)
        disk.close()
        return ids, deleted.name

    ids, deleted = asyncio.run(main())
    assert [p.name for p in wal_files(storage)] != [deleted]
    with Disk(path=storage, prefix=PREFIX, fsync_frequency=0) as reopened:
        assert sorted(pending(reopened)) == sorted(ids)


@pytest.mark.spec("Q-176", "W-81")
def test_a_queue_whose_storage_directory_is_removed_refuses_enqueues_and_stops(
        storage: Path) -> None:
    registry = deferq.TaskRegistry()

    class Later(deferq.Task, name="faults.Later", registry=registry):
        def perform(self) -> None:
            raise AssertionError("never runs here")

    async def main() -> str:
        disk = Disk(path=storage, prefix=PREFIX, fsync_frequency=0)
        queue = deferq.Queue(disk, registry=registry, sweep_interval=0.05)
        await queue.start()
        await queue.adefer(Later.options(delay=3600))
        shutil.rmtree(storage)
        try:
            for _ in range(200):
                await asyncio.wait_for(queue.adefer(Later.options(delay=3600)), 5)
                await asyncio.sleep(0.01)
            raise AssertionError("enqueues still acknowledged 2 s after the directory went")
        except StorageBrokenError as exc:
            refused = str(exc)
        with pytest.raises(StorageBrokenError):
            await asyncio.wait_for(queue.stop(timeout=1), 5)  # its sync fails
        disk.close()
        return refused

    refused = asyncio.run(main())
    assert str(storage) in refused and "was deleted while this worker ran" in refused


# ----------------------------------------------------------------------------- errors name the file


@pytest.mark.spec("W-82")
def test_a_full_disk_names_the_wal_file_and_a_failed_fsync_is_repeated_by_every_refusal() -> None:
    sim = SimDisk(7)
    disk = Disk(path="/s", prefix=PREFIX, fsync_frequency=0, env=sim.process())
    try:
        disk.add_task(b"a", task_id="a")
        wal = "/s/" + disk._wal.file_name
        sim.inject(FaultRule(op="write", fault=Enospc(), path=wal))
        with pytest.raises(OSError) as full:
            disk.add_task(b"b" * 300, task_id="b")
        assert full.value.filename == wal
        assert str(full.value).startswith("[Errno 28] No space left on device: ")
        sim.inject(FaultRule(op="fsync", fault=FsyncEio(), path=wal))
        with pytest.raises(StorageBrokenError) as broken:
            disk.add_task(b"c", task_id="c")
        assert wal in str(broken.value) and "Input/output error" in str(broken.value)
        for call in (lambda: disk.add_task(b"d"), disk.sync, disk.pending_tasks):
            with pytest.raises(StorageBrokenError) as refused:
                call()
            assert wal in str(refused.value) and "Input/output error" in str(refused.value)
    finally:
        disk.close()


@pytest.mark.spec("S-91")
def test_dead_task_errors_name_the_data_or_staging_file_and_a_broken_store_says_why() -> None:
    sim = SimDisk(8)
    disk = Disk(path="/s", prefix=PREFIX, fsync_frequency=0, env=sim.process())
    data, staging = f"/s/{PREFIX}dead_tasks-0", f"/s/{PREFIX}dead_tasks-0.tmp"

    def add(task_id: str) -> str:
        return disk.add_dead_task(task_id, b"ctx", ValueError("x"), task_class="T", attempts=1)

    try:
        add("a")
        add("b")
        sim.inject(FaultRule(op="write", fault=Enospc(), path=data))
        with pytest.raises(OSError) as full:
            add("c")
        assert full.value.filename == data
        sim.inject(FaultRule(op="write", fault=Enospc(), path=staging))
        with pytest.raises(OSError) as compaction:
            disk.remove_dead_tasks(["a"])
        assert compaction.value.filename == staging
        sim.inject(FaultRule(op="fsync", fault=FsyncEio(), path=data))
        with pytest.raises(StorageBrokenError) as broken:
            add("d")
        assert data in str(broken.value) and "Input/output error" in str(broken.value)
        with pytest.raises(StorageBrokenError) as refused:
            disk.list_dead_tasks()
        assert data in str(refused.value) and "Input/output error" in str(refused.value)
    finally:
        disk.close()


@pytest.mark.spec("W-82", "S-91")
def test_the_held_directorys_errors_name_paths_not_bare_names(storage: Path) -> None:
    """``DirEnv`` resolves names in the directory it holds open (F-25): the kernel's error
    then carries the bare name, which it replaces with the path."""
    storage.mkdir(mode=0o700)
    env = DirEnv(str(storage))
    try:
        missing, other = f"{storage}/{PREFIX}dead_tasks-0", f"{storage}/{PREFIX}dead_tasks-0.tmp"
        with pytest.raises(FileNotFoundError) as opened:
            env.open(missing, OpenFlag.READ)
        assert opened.value.filename == missing
        with pytest.raises(FileNotFoundError) as unlinked:
            env.unlink(missing)
        assert unlinked.value.filename == missing
        with pytest.raises(FileNotFoundError) as renamed:
            env.rename(other, missing)
        assert (renamed.value.filename, renamed.value.filename2) == (other, missing)
    finally:
        env.close_directory()


@pytest.mark.spec("W-82", "S-92")
@pytest.mark.parametrize("held", [False, True])
def test_a_real_read_error_names_the_file_read(storage: Path, held: bool) -> None:
    """``pread`` takes a descriptor, so the kernel's error names no file; the env names the
    path the descriptor was opened as (here a real EINVAL: a negative offset)."""
    storage.mkdir(mode=0o700)
    path = f"{storage}/{PREFIX}dead_tasks-0"
    Path(path).write_bytes(b"x\n")
    env = DirEnv(str(storage)) if held else OsEnv()
    fd = env.open(path, OpenFlag.READ)
    try:
        with pytest.raises(OSError) as failed:
            env.pread(fd, 10, -1)
        assert failed.value.errno == errno.EINVAL and failed.value.filename == path
    finally:
        env.close(fd)
        if isinstance(env, DirEnv):
            env.close_directory()


@pytest.mark.spec("S-92")
def test_a_dead_task_read_that_fails_names_the_file_it_read(
        storage: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Listing and finding dead tasks read through ``pread``: an I/O error there (injected
    at the system call, as a failing disk gives it) names the store's file."""
    with Disk(path=storage, prefix=PREFIX, fsync_frequency=0) as disk:
        for n in range(3):
            disk.add_dead_task(f"d{n}", b"c", ValueError("x"), task_class="T", attempts=1)
        real_pread = os.pread

        def failing(fd: int, size: int, offset: int) -> bytes:
            raise OSError(errno.EIO, os.strerror(errno.EIO))

        monkeypatch.setattr(os, "pread", failing)
        for call in (disk.list_dead_tasks, lambda: disk.find_dead_task("d1")):
            with pytest.raises(OSError) as failed:
                call()
            named = failed.value.filename
            assert failed.value.errno == errno.EIO and isinstance(named, str)
            assert Path(named).parent == storage and Path(named).name.startswith(PREFIX)
            assert named in str(failed.value)
        monkeypatch.setattr(os, "pread", real_pread)
        assert [t.id for t in disk.list_dead_tasks()] == ["d2", "d1", "d0"]


_REAL_FULL_DISK = """
import errno, json, resource, signal, sys
from deferq.backends import Disk

out = {}
with Disk(path=sys.argv[1], prefix="deferred-", fsync_frequency=0) as disk:
    for n in range(12):  # about 3 KB of dead tasks, written before the limit
        disk.add_dead_task(f"d{n}", b"c" * 100, ValueError("x"), task_class="T", attempts=1)
    store = disk.open_schedules()
    assert store.try_lead()
    # From here every write past byte 1000 of any file fails with EFBIG, as on a full disk.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1000, resource.RLIM_INFINITY))
    calls = {
        "wal": lambda: disk.add_task(b"w" * 4000),
        "dead": lambda: disk.add_dead_task("big", b"c", ValueError("x"), task_class="T",
                                           attempts=1),
        "compaction": lambda: disk.remove_dead_tasks(["d0"]),
        "schedules": lambda: store.write({f"schedule-{n}": n for n in range(100)}),
    }
    for name, call in calls.items():
        try:
            call()
            out[name] = "no error"
        except OSError as exc:
            out[name] = [exc.errno == errno.EFBIG, exc.filename, str(exc)]
    store.close()
print(json.dumps(out))
"""


@pytest.mark.spec("W-82", "S-91")
def test_a_real_write_that_fails_names_its_file_in_the_error(storage: Path) -> None:
    """The kernel's own error (a ``write`` names no file), from a real process whose file-size
    limit makes every file's writes fail past 1000 bytes."""
    result = subprocess.run([sys.executable, "-c", _REAL_FULL_DISK, str(storage)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    files = {"dead": f"{PREFIX}dead_tasks-0", "compaction": f"{PREFIX}dead_tasks-0.tmp",
             "schedules": schedules_tmp_name(PREFIX)}
    for name, (efbig, filename, message) in out.items():
        assert efbig, (name, message)
        assert isinstance(filename, str), (name, message)  # the kernel's error names no file
        if name == "wal":
            assert is_wal_file_name(PREFIX, Path(filename).name) and filename.startswith(
                f"{storage}/"), message
        else:
            assert filename == f"{storage}/{files[name]}", (name, message)
        assert message.startswith("[Errno 27] File too large: ") and filename in message


# ----------------------------------------------------------------------------- the command line


# The command, in a process whose every write past byte 10 of a file fails with EFBIG, as
# on a full disk (set before deferq is imported; no preexec_fn, which forks a threaded parent).
_LIMITED_CLI = ("import resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
                "resource.setrlimit(resource.RLIMIT_FSIZE, (10, 10)); "
                "from deferq._cli import main; sys.exit(main(sys.argv[1:]))")


@pytest.mark.spec("Q-177", "W-82")
def test_an_operator_command_whose_writes_fail_prints_one_line_naming_the_file(
        storage: Path) -> None:
    with Disk(path=storage, prefix=PREFIX, fsync_frequency=0) as disk:
        disk.add_dead_task("d1", b"{}", ValueError("x"), task_class="T", attempts=1)
    before = {p.name: p.read_bytes() for p in storage.iterdir()}
    result = subprocess.run(
        [sys.executable, "-c", _LIMITED_CLI, "--path", str(storage), "dead", "retry", "d1"],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert lines[-1].startswith("deferq: error: [Errno 27] File too large: "), lines
    assert f"'{storage}/{PREFIX}" in lines[-1]  # the hand-off file, by its path
    assert len(lines) <= 2, lines  # the error, and at most the engine's one-line warning
    # Nothing was removed, and the failed hand-off file was unlinked (W-73).
    assert {p.name: p.read_bytes() for p in storage.iterdir()} == before
