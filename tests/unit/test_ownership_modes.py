"""Who owns the storage directory and its files, and who may write them (F-26, F-27, F-28).

Goal: a directory or file another user could write is never used; directories deferq creates are
never writable by others under any umask; a root operator's files go to the directory's owner.
Method: real directories in a throwaway location readable by every user, real ``chmod`` and
``chown``, and real processes switched to the ``nobody`` user with ``setpriv`` (root only: those
tests skip with a message otherwise).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from deferq._core.errors import UnsafeEntryError
from deferq._core.names import dead_data_name, wal_file_name
from deferq._core.walcodec import encode_add
from deferq.backends import Disk

_NOBODY = 65534
_IS_ROOT = os.geteuid() == 0
root_only = pytest.mark.skipif(not _IS_ROOT, reason="needs root: chown and switching to nobody")


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[Path]:
    """A directory every user can reach (pytest's tmp_path is 0700 under root)."""
    del tmp_path
    path = Path(tempfile.mkdtemp(prefix="deferq-owner-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


_NOBODY_CAN_RUN: list[str] = []  # "" once probed and usable, else why not


def _nobody_can_run_this_python() -> str:
    """"" when ``nobody`` can run this interpreter and import deferq, else the reason.

    Why: an interpreter under root's home (a pyenv build, as the check's Python 3.13 is)
    cannot be loaded by ``nobody``; those tests then skip naming it, and run on the others.
    """
    if not _NOBODY_CAN_RUN:
        probe = subprocess.run(["setpriv", f"--reuid={_NOBODY}", f"--regid={_NOBODY}",
                                "--clear-groups", sys.executable, "-c", "import deferq"],
                               capture_output=True, text=True, timeout=120, check=False)
        _NOBODY_CAN_RUN.append("" if probe.returncode == 0 else
                               (probe.stderr.strip().splitlines() or ["exit status "
                                                                      f"{probe.returncode}"])[-1])
    return _NOBODY_CAN_RUN[0]


def _as_nobody(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is needed to run a process as nobody")
    reason = _nobody_can_run_this_python()
    if reason:
        pytest.skip(f"nobody cannot run {sys.executable}: {reason}")
    return subprocess.run(["setpriv", f"--reuid={_NOBODY}", f"--regid={_NOBODY}", "--clear-groups",
                           sys.executable, "-c", textwrap.dedent(script), *args],
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.spec("F-26")
def test_parents_deferq_creates_are_not_writable_by_others_under_umask_0(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        with Disk(path=tmp_path / "a" / "b" / "storage"):
            pass
    finally:
        os.umask(old)
    assert (tmp_path / "a").stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "a" / "b").stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "a" / "b" / "storage").stat().st_mode & 0o777 == 0o700


@pytest.mark.spec("F-27", "F-39")
@pytest.mark.parametrize("mode", [0o770, 0o777, 0o1777])
def test_a_storage_directory_writable_by_others_is_refused(tmp_path: Path, mode: int) -> None:
    storage = tmp_path / "storage"
    storage.mkdir()
    storage.chmod(mode)
    with pytest.raises(UnsafeEntryError, match=r"has mode .*chmod go-w"):
        Disk(path=storage)
    assert list(storage.iterdir()) == []


@pytest.mark.spec("F-38", "F-39")
def test_a_dead_task_data_file_writable_by_others_is_refused(tmp_path: Path) -> None:
    storage = tmp_path / "storage"
    storage.mkdir(mode=0o700)
    data = storage / dead_data_name("deferred-")
    data.write_bytes(b"")
    data.chmod(0o666)
    with pytest.raises(UnsafeEntryError, match=r"dead_tasks-0 has mode 0666"):
        Disk(path=storage)


@pytest.mark.spec("F-38")
def test_an_orphan_wal_file_writable_by_others_is_skipped_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    storage = tmp_path / "storage"
    storage.mkdir(mode=0o700)
    planted = storage / wal_file_name("deferred-", "20260101", 4242, 1)
    planted.write_bytes(encode_add("planted", None, b"rm -rf"))
    planted.chmod(0o666)
    with caplog.at_level(logging.WARNING, logger="deferq"), Disk(path=storage) as disk:
        assert disk.pending_tasks() == []
    assert planted.exists()
    assert "skipping" in caplog.text and "mode 0666" in caplog.text


@root_only
@pytest.mark.spec("F-27")
def test_a_store_file_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    storage = tmp_path / "storage"
    storage.mkdir(mode=0o700)
    data = storage / dead_data_name("deferred-")
    data.write_bytes(b"")
    os.chown(data, _NOBODY, _NOBODY)
    with pytest.raises(UnsafeEntryError, match=rf"belongs to uid {_NOBODY}"):
        Disk(path=storage)


@root_only
@pytest.mark.spec("F-27")
def test_a_storage_directory_of_another_user_is_refused_to_a_non_root_process(shared: Path) -> None:
    storage = shared / "storage"
    storage.mkdir(mode=0o755)  # root's, readable by nobody
    done = _as_nobody("""
        import sys
        from deferq.backends import Disk
        try:
            Disk(path=sys.argv[1])
        except OSError as exc:
            print(exc)
    """, str(storage))
    assert done.returncode == 0, done.stderr
    assert "belongs to uid 0, not to this process's user" in done.stdout
    assert list(storage.iterdir()) == []


@root_only
@pytest.mark.spec("F-28")
def test_files_root_creates_in_a_service_users_directory_belong_to_that_user(shared: Path) -> None:
    storage = shared / "storage"
    storage.mkdir(mode=0o700)
    os.chown(storage, _NOBODY, _NOBODY)
    with Disk(path=storage) as disk:  # an operator's sudo session
        disk.add_task(b"by root")
        disk.add_dead_task("d-1", b"", ValueError("x"), task_class="T", attempts=1)
        disk.add_dead_task("d-2", b"", ValueError("x"), task_class="T", attempts=1)
        assert disk.remove_dead_tasks("d-1") == 1  # a compaction: the data file is a new file
    for path in storage.iterdir():
        assert (path.stat().st_uid, path.stat().st_gid) == (_NOBODY, _NOBODY), path.name
    done = _as_nobody("""
        import sys
        from deferq.backends import Disk
        with Disk(path=sys.argv[1]) as disk:
            print(len(disk.pending_tasks()), [t.id for t in disk.list_dead_tasks()])
    """, str(storage))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0] == "1 ['d-2']"


@root_only
@pytest.mark.spec("Q-80", "F-28")
def test_root_operator_commands_leave_a_store_the_service_user_can_open(shared: Path) -> None:
    from deferq._cli import main

    storage = shared / "storage"
    storage.mkdir(mode=0o700)
    os.chown(storage, _NOBODY, _NOBODY)  # the service user's directory
    done = _as_nobody("""
        import os, sys
        from deferq.backends import Disk
        os.umask(0o077)
        with Disk(path=sys.argv[1]) as disk:
            for n in range(3):
                disk.add_dead_task(f"d-{n}", b'{"task": "T", "args": [], "kwargs": {}, "attempts": 1}',
                                   ValueError("x"), task_class="T", attempts=1)
    """, str(storage))
    assert done.returncode == 0, done.stderr
    assert main(["stats", "--path", str(storage)]) == 0
    assert main(["dead", "list", "--path", str(storage)]) == 0
    assert main(["dead", "remove", "d-0", "--path", str(storage)]) == 0  # a compaction
    for path in storage.iterdir():
        assert path.stat().st_uid == _NOBODY, f"{path.name} belongs to uid {path.stat().st_uid}"
    assert main(["dead", "retry", "d-1", "--path", str(storage)]) == 0  # a new WAL file
    for path in storage.iterdir():
        assert path.stat().st_uid == _NOBODY, f"{path.name} belongs to uid {path.stat().st_uid}"
    done = _as_nobody("""
        import sys
        from deferq.backends import Disk
        with Disk(path=sys.argv[1]) as disk:
            print(len(disk.pending_tasks()), [t.id for t in disk.list_dead_tasks()])
    """, str(storage))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0] == "1 ['d-2']"


def _snapshot(directory: Path) -> list[tuple[str, int, int, int]]:
    return sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns, p.stat().st_mode)
                  for p in directory.iterdir())


@root_only
@pytest.mark.spec("Q-81", "S-32")
def test_read_only_commands_work_on_a_store_nobody_may_write(shared: Path) -> None:
    storage = shared / "storage"
    storage.mkdir(mode=0o700)
    os.chown(storage, _NOBODY, _NOBODY)
    done = _as_nobody("""
        import sys
        from deferq.backends import Disk
        with Disk(path=sys.argv[1]) as disk:
            disk.add_task(b'{"task": "T", "args": [], "kwargs": {}, "attempts": 0}')
            disk.add_dead_task("d-1", b"{}", ValueError("x"), task_class="T", attempts=1)
    """, str(storage))
    assert done.returncode == 0, done.stderr
    for path in storage.iterdir():
        path.chmod(0o400)
    storage.chmod(0o500)  # a read-only snapshot: its owner may not write it either
    before = _snapshot(storage)
    for command in (["stats"], ["dead", "list"], ["dead", "show", "d-1"], ["verify"],
                    ["pending", "list"]):
        ran = _as_nobody("import sys; from deferq._cli import main; sys.exit(main(sys.argv[1:]))",
                         *command, "--path", str(storage))
        assert ran.returncode == 0, (command, ran.stderr)
    assert _snapshot(storage) == before


@pytest.mark.spec("Q-81", "S-32", "S-76")
def test_read_only_commands_create_nothing_where_no_dead_task_was_stored(tmp_path: Path) -> None:
    from deferq._cli import main

    storage = tmp_path / "storage"
    storage.mkdir(mode=0o700)
    (storage / wal_file_name("deferred-", "20260101", 4242, 1)).write_bytes(b"")
    before = _snapshot(storage)
    assert main(["stats", "--path", str(storage)]) == 0
    assert main(["dead", "list", "--path", str(storage)]) == 0
    assert main(["dead", "show", "x-1", "--path", str(storage)]) == 3  # not found
    assert _snapshot(storage) == before
    (storage / dead_data_name("deferred-")).write_bytes(b"")
    assert main(["dead", "list", "--path", str(storage)]) == 5  # a data file without its lock
