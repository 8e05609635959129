"""A read-only scan of the WAL files in a storage directory, for operators (spec/queue.md Q-14).

Rules: it reads WAL files read-only and never claims them (no lock, no merge, no
repair), so it works while workers run; what a live worker has not yet written (or
fsynced) is naturally not seen.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from deferq._core.errors import UnsafeEntryError
from deferq._core.names import is_wal_file_name
from deferq._core.recovery import WalReplay
from deferq._core.types import PendingTask
from deferq._core.walcodec import WalAdd, decode_wal_line
from deferq._engine.env import Env, OpenFlag
from deferq._engine.io import join, lines_forward, records_end

log = logging.getLogger("deferq")


@dataclass(slots=True)
class WalFileScan:
    """What a read-only scan found in one WAL file."""

    name: str
    pending: list[PendingTask] = field(default_factory=list)
    corrupt_lines: int = 0


def scan_pending(env: Env, path: str, prefix: str) -> list[WalFileScan]:
    """Pending tasks of every WAL file of ``prefix`` in ``path``, read-only, in name order."""
    out = []
    for name in sorted(n for n in env.listdir(path) if is_wal_file_name(prefix, n)):
        try:
            fd = env.open(join(path, name), OpenFlag.READ)
        except FileNotFoundError:
            continue  # merged away or rotated by a worker since the listing
        except UnsafeEntryError as exc:
            log.warning("skipping %s: %s", name, exc)  # F-16: not a WAL file at all
            continue
        try:
            replay = WalReplay()
            end = records_end(env, fd, env.fstat(fd).size)  # R-@L: not the reserved space
            for raw in lines_forward(env, fd, end):
                replay.apply(raw)
        finally:
            env.close(fd)
        scan = WalFileScan(name, corrupt_lines=replay.corrupt)
        for task_id, line in replay.live.items():
            record = decode_wal_line(line[:-1])
            assert isinstance(record, WalAdd)
            scan.pending.append(PendingTask(task_id, record.context, record.publish_at))
        out.append(scan)
    return out
