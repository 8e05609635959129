"""Probe for the rotation tests (``python tests/power/rotation_probe.py STORAGE``).

Goal: drive one WAL rotation (W-9) on a real filesystem so strace can fail its
fsyncs. Method: three adds of about 1 MB each push the WAL past
``WAL_SIZE_LIMIT_BYTES``; the remove that follows rotates; the other two tasks
are then removed (acknowledged and fsynced, ``fsync_frequency=0``), one more
task is added, the backend is closed and reopened. Prints one line per call
(``remove0 ok``, ``remove1 StorageBrokenError``, ...), the WAL's ``broken``
flag, the number of WAL files left after ``close``, then ``pending`` and the
ids pending after the restart.
"""

from __future__ import annotations

import logging
import os
import sys

from deferq._core.errors import DeferqError
from deferq._core.limits import DEFAULT_PREFIX
from deferq._core.names import is_wal_file_name
from deferq.backends import Disk


def main(path: str) -> int:
    logging.getLogger("deferq").setLevel(logging.CRITICAL)
    disk = Disk(path=path, fsync_frequency=0)
    ids = [disk.add_task(b"x" * 800_000) for _ in range(3)]
    for name, call in (("remove0", lambda: disk.remove_task(ids[0])),
                       ("remove1", lambda: disk.remove_task(ids[1])),
                       ("remove2", lambda: disk.remove_task(ids[2])),
                       ("add", lambda: disk.add_task(b"after the rotation", None, "last"))):
        try:
            call()
            print(name, "ok", flush=True)
        except (DeferqError, OSError) as exc:
            print(name, type(exc).__name__, flush=True)
    print("broken", disk._wal.broken, flush=True)
    try:
        disk.close()
    except (DeferqError, OSError):
        pass
    wal_files = [n for n in os.listdir(path) if is_wal_file_name(DEFAULT_PREFIX, n)]
    print("walfiles", len(wal_files), flush=True)
    with Disk(path=path, fsync_frequency=0) as again:
        pending = [t.task_id for t in again.pending_tasks()]
    print("pending", *["id0" if i == ids[0] else "id1" if i == ids[1] else "id2" if i == ids[2]
                       else i for i in pending], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
