"""Adoption holds a bounded number of descriptors (W-35).

Goal: a directory of more orphaned WAL files than the process may hold descriptors must not stop
every future worker from starting, and adopting in batches must have the outcome of one replay of
every file in name order (W-3, W-15): a removal in a later batch removes a task added in an earlier
one, and generated ids stay above every seed seen. Method: orphan files written with the codec;
the worker runs in a subprocess under ``resource.setrlimit(RLIMIT_NOFILE, 1024)``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from deferq._core.names import is_wal_file_name, wal_file_name
from deferq._core.walcodec import encode_add, encode_rem
from deferq.backends import Disk

_PREFIX = "w-"
_ORPHANS = 1_100


def _write_orphans(storage: Path, count: int) -> None:
    storage.mkdir()
    for index in range(count):
        lines = [encode_add(f"7-{index}-1", None, f"task {index}".encode())]
        if index == count - 1:
            # The last file (the last batch) removes a task of the first file (the first batch)
            # and carries the largest seed.
            lines += [encode_rem("7-0-1"), encode_rem("900000000000-1-0")]
        # Five-digit pids: name order is index order.
        name = wal_file_name(_PREFIX, "20260101", 10_000 + index, index)
        (storage / name).write_bytes(b"".join(lines))


_WORKER = textwrap.dedent("""
    import json, resource, sys
    from deferq.backends import Disk
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
    with Disk(path=sys.argv[1], prefix="w-") as disk:
        ids = [t.task_id for t in disk.pending_tasks()]
        new = disk.add_task(b"new")
    print(json.dumps({"pending": ids, "new": new}))
""")


@pytest.mark.slow
@pytest.mark.spec("W-35", "W-3", "W-15", "W-28", "W-75", "W-76")
def test_more_orphans_than_descriptors_are_adopted_in_batches(tmp_path: Path) -> None:
    storage = tmp_path / "storage"
    _write_orphans(storage, _ORPHANS)
    done = subprocess.run([sys.executable, "-c", _WORKER, str(storage)], capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert out["pending"] == [f"7-{index}-1" for index in range(1, _ORPHANS)]
    assert int(out["new"].split("-")[0]) > 900000000000
    wal_files = [p.name for p in storage.iterdir() if is_wal_file_name(_PREFIX, p.name)]
    assert len(wal_files) == 1  # every orphan and every intermediate copy retired
    with Disk(path=storage, prefix=_PREFIX) as disk:
        assert len(disk.pending_tasks()) == _ORPHANS  # 1,099 adopted and the new one


@pytest.mark.spec("W-35", "W-76")
def test_adoption_of_a_few_batches_in_process_matches_one_replay(tmp_path: Path) -> None:
    storage = tmp_path / "storage"
    count = 131  # two batches of ADOPT_FILES_MAX (64) and three files more
    _write_orphans(storage, count)
    with Disk(path=storage, prefix=_PREFIX) as disk:
        assert [t.task_id for t in disk.pending_tasks()] == [f"7-{i}-1" for i in range(1, count)]
        assert disk.pending_tasks()[0].context == b"task 1"
    assert len([p for p in storage.iterdir() if is_wal_file_name(_PREFIX, p.name)]) == 1
