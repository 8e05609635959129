"""A read-only scan of the WAL files in a storage directory, for operators (spec/queue.md Q-14).

Rules: it reads WAL files read-only and never claims them (no lock, no merge, no
repair), so it works while workers run; what a live worker has not yet written (or
fsynced) is naturally not seen. The files are replayed as one sequence in name order,
exactly as recovery replays the files it adopts (W-42, W-15, R-@I, R-@J): a task id in
two files is one task, a ``rem`` in one file removes an ``add`` of another, and the
leftovers of an interrupted adoption (the fresh copy beside the files it copied) add
nothing twice.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from deferq._core.errors import UnsafeEntryError
from deferq._core.frame import HEADER_BYTES
from deferq._core.names import is_wal_file_name
from deferq._core.recovery import WalReplay
from deferq._core.types import PendingTask
from deferq._core.walcodec import WalAdd, decode_wal_line
from deferq._engine.env import Env, OpenFlag
from deferq._engine.io import join, lines_forward, name_file, records_end

log = logging.getLogger("deferq")


@dataclass(slots=True)
class PendingScan:
    """What a read-only scan found: the WAL files read and the merged pending tasks (W-42)."""

    files: list[str] = field(default_factory=list)
    pending: list[PendingTask] = field(default_factory=list)
    origin: dict[str, str] = field(default_factory=dict)  # id -> file of its deciding add (W-43)
    corrupt_lines: int = 0


def scan_pending(env: Env, path: str, prefix: str) -> PendingScan:
    """Pending tasks of every WAL file of ``prefix`` in ``path``, read-only, replayed as one
    sequence in name order (W-42), in replay order."""
    out = PendingScan()
    replay = WalReplay()
    origin = out.origin
    for name in sorted(n for n in env.listdir(path) if is_wal_file_name(prefix, n)):
        try:
            fd = env.open(join(path, name), OpenFlag.READ)
        except FileNotFoundError:
            continue  # merged away or rotated by a worker since the listing
        except UnsafeEntryError as exc:
            log.warning("skipping %s: %s", name, exc)  # F-16: not a WAL file at all
            continue
        try:
            end = records_end(env, fd, env.fstat(fd).size)  # R-@L: not the reserved space
            for raw in lines_forward(env, fd, end):
                data = replay.apply(raw)
                if data is not None and data.startswith(b"add:", HEADER_BYTES):
                    start = HEADER_BYTES + 4  # the id of a valid add (F-5: it holds no ':')
                    origin[data[start:data.index(b":", start)].decode("utf-8")] = name
        except OSError as exc:
            name_file(exc, join(path, name))  # the operator's error names the file
            raise
        finally:
            env.close(fd)
        out.files.append(name)
    out.corrupt_lines = replay.corrupt
    for task_id, line in replay.live.items():
        record = decode_wal_line(line[:-1])
        assert isinstance(record, WalAdd)
        out.pending.append(PendingTask(task_id, record.context, record.publish_at))
    for task_id in set(origin) - set(replay.live):
        del origin[task_id]
    return out
