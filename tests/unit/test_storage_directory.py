"""The storage directory is held open: a store's files never move with the path (F-25).

Goal: after ``Disk()`` returned, nothing the process does with its working directory, and no rename
of the directory, redirects a write. Method: a real worker process (``python -c``) opens a store with
a relative path, then ``chdir``s into another directory that holds a decoy ``storage`` directory (or
the test renames the directory under it), and writes tasks, dead tasks and removals; the test then
reads the directory the store opened and checks the decoy stayed empty.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from deferq.backends import Disk
from deferq._core.errors import UnsafeEntryError

_WORKER = textwrap.dedent("""
    import os, sys
    from deferq.backends import Disk
    os.chdir(sys.argv[1])
    disk = Disk(path="storage", prefix="w-")
    kept = disk.add_task(b"kept")
    gone = disk.add_task(b"gone")
    os.chdir(sys.argv[2])             # a daemonizing helper's chdir
    if len(sys.argv) > 3:             # or an operator renames the directory
        os.rename(os.path.join(sys.argv[1], "storage"), sys.argv[3])
    disk.remove_task(gone)
    disk.add_dead_task(kept, b"ctx", ValueError("boom"), task_class="T", attempts=1)
    disk.remove_dead_tasks([kept])    # a compaction: staging file, rename, unlink
    disk.add_dead_task("d-1", b"ctx", ValueError("boom"), task_class="T", attempts=1)
    for _ in range(3):                # rotations: create, copy, unlink (W-9, W-10)
        disk._wal._rotate()
    disk.add_task(b"late")
    disk.close()
""")


def _run_worker(*args: Path) -> None:
    done = subprocess.run([sys.executable, "-c", _WORKER, *map(str, args)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr


def _check_store(storage: Path) -> None:
    with Disk(path=storage, prefix="w-") as disk:
        contexts = sorted(t.context for t in disk.pending_tasks())
        dead = [t.id for t in disk.list_dead_tasks()]
    assert contexts == [b"kept", b"late"]
    assert dead == ["d-1"]


@pytest.mark.spec("F-25", "F-41")
def test_chdir_after_open_does_not_redirect_writes(tmp_path: Path) -> None:
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir()
    (elsewhere / "storage").mkdir(parents=True)  # the decoy a re-resolved path would hit
    _run_worker(home, elsewhere)
    assert list((elsewhere / "storage").iterdir()) == []
    _check_store(home / "storage")


@pytest.mark.spec("F-25", "F-41")
def test_renamed_directory_keeps_the_open_store_and_the_old_name_stays_free(tmp_path: Path) -> None:
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir()
    (elsewhere / "storage").mkdir(parents=True)
    _run_worker(home, elsewhere, tmp_path / "moved")
    assert not (home / "storage").exists()
    assert list((elsewhere / "storage").iterdir()) == []
    _check_store(tmp_path / "moved")


@pytest.mark.spec("F-25", "F-40")
def test_storage_directory_that_is_a_symbolic_link_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(UnsafeEntryError, match="link.*symbolic link"):
        Disk(path=tmp_path / "link")
    assert list((tmp_path / "real").iterdir()) == []
