"""Entries in the storage directory that are not regular files (spec/format.md F-16): a link
is never followed, a FIFO or socket is never waited on, a directory is never read as a file.

Goal: a planted link cannot make deferq (often run as root by an operator) truncate,
overwrite or create a file elsewhere, and a FIFO cannot hang a command. Method: real files
and real commands in subprocesses with a time limit (a hang fails the test), then check the
link targets are untouched.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from deferq._core.errors import UnsafeEntryError
from deferq.backends import Disk

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "deferred-"


def deferq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deferq", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=30, check=False)  # a hang is a failure


def _store(path: Path) -> str:
    with Disk(path=path) as disk:
        task_id = disk.add_task(b"{}")
        disk.add_dead_task(task_id, b"{}", RuntimeError("x"), task_class="t", attempts=1)
        disk.remove_task(task_id)
    return task_id


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim.txt"
    path.write_text("precious\n")
    return path


@pytest.mark.spec("F-16", "F-36")
def test_a_planted_lock_link_is_refused_and_its_target_never_truncated(tmp_path: Path,
                                                                      victim: Path) -> None:
    store = tmp_path / "s"
    task_id = _store(store)
    lock = store / f"{PREFIX}dead_tasks.lock"
    lock.unlink()
    lock.symlink_to(victim)
    result = deferq("dead", "remove", task_id, "--path", str(store))
    assert result.returncode == 1 and "is a symbolic link" in result.stderr, result
    assert result.stderr.count("\n") == 1  # one line, no traceback
    assert victim.read_text() == "precious\n"
    with pytest.raises(UnsafeEntryError, match="symbolic link"):
        Disk(path=store)


@pytest.mark.spec("F-16", "F-36")
def test_a_planted_staging_link_is_removed_not_followed(tmp_path: Path, victim: Path) -> None:
    store = tmp_path / "s"
    task_id = _store(store)
    (store / f"{PREFIX}dead_tasks-0.tmp").symlink_to(victim)
    result = deferq("dead", "remove", task_id, "--path", str(store))
    assert result.returncode == 0, result
    assert victim.read_text() == "precious\n"
    assert not (store / f"{PREFIX}dead_tasks-0.tmp").exists()


@pytest.mark.spec("F-16")
def test_a_dangling_data_file_link_never_creates_its_target(tmp_path: Path) -> None:
    store = tmp_path / "s"
    _store(store)
    data = store / f"{PREFIX}dead_tasks-0"
    target = tmp_path / "elsewhere" / "created-by-deferq"
    (tmp_path / "elsewhere").mkdir()
    data.unlink()
    data.symlink_to(target)
    for command in (["stats"], ["dead", "list"], ["verify"]):
        result = deferq(*command, "--path", str(store))
        assert result.returncode != 0, (command, result)
        assert not target.exists(), command


@pytest.mark.spec("F-16", "F-35", "F-37")
def test_a_fifo_named_like_a_store_file_never_hangs_anything(tmp_path: Path) -> None:
    store = tmp_path / "s"
    _store(store)
    data = store / f"{PREFIX}dead_tasks-0"
    data.unlink()
    os.mkfifo(data)
    os.mkfifo(store / f"{PREFIX}0-20261204-77-1a")  # named like a WAL file
    (store / f"{PREFIX}0-20261204-78-1b").mkdir()  # so is this directory
    listed = deferq("dead", "list", "--path", str(store))
    assert listed.returncode == 1 and "is a FIFO" in listed.stderr, listed
    verified = deferq("verify", "--path", str(store))
    assert verified.returncode == 4 and "not a regular file" in verified.stdout, verified
    pending = deferq("pending", "list", "--path", str(store))
    assert pending.returncode == 0 and "skipping" in pending.stderr, pending
    with pytest.raises(UnsafeEntryError, match="FIFO"):
        Disk(path=store)  # the dead-task data file is needed, and refused
    data.unlink()
    with Disk(path=store) as disk:  # the WAL-named FIFO and directory are skipped, not adopted
        assert disk.pending_tasks() == []
    assert (store / f"{PREFIX}0-20261204-77-1a").exists()
