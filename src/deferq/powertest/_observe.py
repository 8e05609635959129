"""What the storage directory holds after a crash, read straight from its files.

Theory of operation. ``observe`` reads every file of the storage directory
directly (no ``Disk``, so nothing is repaired or merged before it is seen):
each WAL file is replayed on its own with the engine's ``WalReplay`` (a task
may be pending in two WALs at once: at-least-once); the dead-task data file is
read forward with the engine's decoders, the latest framed record of an id
deciding (R-@H). Torn tails (bytes after the last newline, R-@F) and damaged
complete lines are counted separately; a file that cannot be read is a problem.
Contexts are kept as digests, the form the workers' events carry. Whether the
model allows what was seen is ``_check.Ledger``'s business.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from deferq._core.deadcodec import decode_dead_line, decode_dead_payload
from deferq._core.frame import BadLine
from deferq._core.model import Dead, Pending
from deferq._core.names import dead_data_name, is_wal_file_name
from deferq._core.recovery import ForwardLines, RawLine, WalReplay
from deferq._core.walcodec import WalAdd, decode_wal_line
from deferq.powertest._workers import digest

_CHUNK = 64 * 1024


@dataclass(frozen=True, slots=True)
class FileScan:
    """One file as read after a crash."""

    name: str
    size: int
    records: int
    torn_bytes: int  # bytes after the last newline (R-@F)
    damaged: int  # complete lines that do not decode (R-@B..R-@E)


@dataclass(slots=True)
class Observation:
    pending: dict[str, list[Pending]] = field(default_factory=dict)  # id -> one copy per WAL
    dead: dict[str, Dead] = field(default_factory=dict)
    files: list[FileScan] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def torn(self) -> int:
        return sum(1 for f in self.files if f.torn_bytes)

    @property
    def damaged(self) -> int:
        return sum(f.damaged for f in self.files)


def _lines(path: str, *, wal: bool) -> tuple[list[RawLine], int]:
    """The lines of a file, and the size they span: for a WAL file the NUL bytes it ends
    with are its reserved space, not lines (R-@L, W-25)."""
    with open(path, "rb") as f:
        data = f.read()
    size = len(data.rstrip(b"\0")) if wal else len(data)
    splitter = ForwardLines()
    out: list[RawLine] = []
    for start in range(0, size, _CHUNK):
        out.extend(splitter.feed(data[start:min(size, start + _CHUNK)]))
    tail = splitter.finish()
    if tail is not None:
        out.append(tail)
    return out, size


def _torn(lines: list[RawLine], size: int) -> int:
    return size - lines[-1].offset if lines and not lines[-1].complete else 0


def observe(path: str, prefix: str) -> Observation:
    """Read every WAL file and the dead-task data file of ``path`` as they are now."""
    obs = Observation()
    try:
        names = sorted(os.listdir(path))
    except FileNotFoundError:
        return obs  # cut before any Disk made the directory durable: the model judges that
    except OSError as exc:
        obs.problems.append(f"cannot list {path}: {exc}")
        return obs
    for name in names:
        full = os.path.join(path, name)
        try:
            if is_wal_file_name(prefix, name):
                _observe_wal(obs, name, full)
            elif name == dead_data_name(prefix):
                _observe_dead(obs, name, full)
        except OSError as exc:
            obs.problems.append(f"cannot read {name}: {exc}")
    return obs


def _observe_wal(obs: Observation, name: str, full: str) -> None:
    lines, size = _lines(full, wal=True)
    replay = WalReplay()
    damaged = 0
    for raw in lines:
        if not replay.apply(raw) and raw.complete:
            damaged += 1
    for task_id, line in replay.live.items():
        record = decode_wal_line(line[:-1])
        assert isinstance(record, WalAdd)
        obs.pending.setdefault(task_id, []).append(
            Pending(digest(record.context).encode(), record.publish_at))
    obs.files.append(FileScan(name, size, replay.records, _torn(lines, size), damaged))


def _observe_dead(obs: Observation, name: str, full: str) -> None:
    lines, size = _lines(full, wal=False)
    latest: dict[str, bytes] = {}
    damaged = records = 0
    for raw in lines:
        if not raw.complete:
            continue
        framed = decode_dead_line(raw.data) if raw.data is not None else None
        if framed is None or isinstance(framed, BadLine):
            damaged += 1
            continue
        records += 1
        latest.pop(framed.task_id, None)
        assert raw.data is not None
        latest[framed.task_id] = raw.data
    for task_id, data in latest.items():
        framed = decode_dead_line(data)
        assert not isinstance(framed, BadLine)
        task = decode_dead_payload(framed)
        if isinstance(task, BadLine):
            damaged += 1  # R-@G: the latest record of this id does not decode; it is not listed.
            continue
        obs.dead[task_id] = Dead(digest(task.context).encode(), task.task_class, task.attempts,
                                 task.exception_message)
    obs.files.append(FileScan(name, size, records, _torn(lines, size), damaged))
