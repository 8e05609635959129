"""``deferq verify``: a read-only scan of every deferq file in a storage directory (Q-17).

Rules: nothing is locked, written or created, so it is safe while workers run
(a file that a worker rotates or merges away between the listing and the open
is skipped). Every line of every WAL file (F-1) and of the dead-task data file
(F-9) is classified by the recovery table (spec/recovery.md): valid records
count as records, everything else is counted under its R-@ label; a dead-task
id whose latest record's payload does not decode counts once under R-@G (R-@H is
checked first: an older record of an id is never judged by its JSON, S-35). A torn tail is damage
too: the next add (dead-task store) or the next open (WAL) cuts it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from deferq._core.deadcodec import decode_dead_line, decode_dead_payload
from deferq._core.errors import UnsafeEntryError
from deferq._core.frame import BadLine, LineFault
from deferq._core.names import dead_data_name, is_wal_file_name
from deferq._core.recovery import line_body
from deferq._core.walcodec import decode_wal_line
from deferq._engine.env import Env, OpenFlag
from deferq._engine.io import join, lines_forward, records_end

NOT_A_REGULAR_FILE: Final = "not a regular file (F-16)"
UNREADABLE: Final = "unreadable"  # the fault of a file that could not be opened or read


@dataclass(slots=True)
class FileReport:
    """What the scan found in one file."""

    name: str
    kind: str  # "wal" or "dead"
    size_bytes: int = 0
    reserved_bytes: int = 0  # a WAL file's space reserved after its records (W-25, R-@L)
    records: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    torn_tail_bytes: int = 0

    @property
    def damaged(self) -> bool:
        return bool(self.faults)


def _fault(report: FileReport, fault: LineFault) -> None:
    report.faults[fault.value] = report.faults.get(fault.value, 0) + 1


def verify_file(env: Env, path: str, name: str, kind: str) -> FileReport | None:
    """Scan one file; None when it disappeared before it could be opened.

    Implements Q-178: a file that cannot be opened or read is reported with the error, and
    the scan goes on with the other files (the operator sees every file's state at once).
    """
    try:
        return _scan(env, path, name, kind)
    except UnsafeEntryError:
        # F-16: named like a store file but not a regular file: reported, never read.
        report = FileReport(name, kind)
        report.faults[NOT_A_REGULAR_FILE] = 1
        return report
    except FileNotFoundError:
        return None  # removed (compacted, retired) between the listing and the open
    except OSError as exc:
        report = FileReport(name, kind)
        report.faults[f"{UNREADABLE} ({exc.strerror or exc})"] = 1
        return report


def _scan(env: Env, path: str, name: str, kind: str) -> FileReport:
    fd = env.open(join(path, name), OpenFlag.READ)
    report = FileReport(name, kind)
    latest: dict[str, bool] = {}  # dead-task id -> its latest record does not decode (R-@G)
    try:
        report.size_bytes = env.fstat(fd).size
        # R-@L: a WAL file's reserved space (W-25) is neither records nor damage.
        end = records_end(env, fd, report.size_bytes) if kind == "wal" else report.size_bytes
        report.reserved_bytes = report.size_bytes - end
        for raw in lines_forward(env, fd, end):
            data, faults = line_body(raw)
            for fault in faults:
                _fault(report, fault)
            if not raw.complete:
                report.torn_tail_bytes = end - raw.offset
            if data is None:
                continue
            if kind == "wal":
                record = decode_wal_line(data)
                if isinstance(record, BadLine):
                    _fault(report, record.fault)
                    continue
            else:
                framed = decode_dead_line(data)
                if isinstance(framed, BadLine):
                    _fault(report, framed.fault)
                    continue
                # R-@H before R-@G (recovery.md step 6): only the latest record of an id is
                # judged by its JSON, so the count matches a listing's.
                latest.pop(framed.task_id, None)
                latest[framed.task_id] = isinstance(decode_dead_payload(framed), BadLine)
            report.records += 1
    finally:
        env.close(fd)
    undecodable = sum(latest.values())
    if undecodable:
        report.faults[LineFault.BAD_DEAD_PAYLOAD.value] = undecodable
        report.records -= undecodable
    return report


def verify_directory(env: Env, path: str, prefix: str,
                     on_file: Callable[[str], None] | None = None) -> list[FileReport]:
    """Scan every WAL file of ``prefix`` (name order) and the dead-task data file.

    ``on_file`` is called with each file's name before it is scanned (for progress).
    """
    names = env.listdir(path)
    todo = [(n, "wal") for n in sorted(n for n in names if is_wal_file_name(prefix, n))]
    dead = dead_data_name(prefix)
    if dead in names:
        todo.append((dead, "dead"))
    reports = []
    for name, kind in todo:
        if on_file is not None:
            on_file(name)
        report = verify_file(env, path, name, kind)
        if report is not None:
            reports.append(report)
    return reports
