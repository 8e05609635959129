"""deferq's own conformance reader: ``python -m deferq.conformance.deferq_reader DIRECTORY PREFIX``.

Rules: it never writes to DIRECTORY. Opening a ``Disk`` adopts the WAL files (it merges
them into a fresh file and unlinks them) and creates the dead-task files, so the pending
and dead tasks come from a ``Disk`` opened on a private copy of the directory: that is the
engine's real recovery path (W-27, W-3, W-15, S-6), not a re-implementation of it. The
per-label damage counts, which a ``Disk`` only logs as totals, come from the engine's
read-only line classification run on DIRECTORY itself (``verify_file`` for WAL files, the
recovery table's ``line_body`` and the codec for the dead-task data file); the R-@G count
is the number of errors the ``Disk`` logged. The totals the ``Disk`` logged must equal the
sums of those labels: a reader that disagrees with itself exits with status 1 rather
than print a report the engine would not stand behind.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import tempfile
from pathlib import Path

from deferq._core.deadcodec import decode_dead_line
from deferq._core.frame import BadLine
from deferq._core.names import dead_data_name, is_wal_file_name
from deferq._core.recovery import line_body
from deferq._engine.env import OpenFlag
from deferq._engine.io import join, lines_forward
from deferq._engine.osenv import OS_ENV
from deferq._engine.verify import verify_file
from deferq.backends.disk import Disk
from deferq.conformance.report import Json, report

R_G = "R-@G"


class _Logged(logging.Handler):
    """Collects the totals a Disk logs (wal.py, deadreads.py and compact.py: one warning per operation)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.wal_total = 0
        self.dead_total = 0
        self.undecodable = 0

    def emit(self, record: logging.LogRecord) -> None:
        text = str(record.msg)
        if text.startswith("Detected %d corrupted deferred task"):
            self.wal_total += _first_int(record)
        elif text.startswith("Detected %d corrupted dead-lettered"):
            self.dead_total += _first_int(record)
        elif text.startswith("Can't deserialize the dead-lettered task"):
            self.undecodable += 1


def _first_int(record: logging.LogRecord) -> int:
    args = record.args
    return args[0] if isinstance(args, tuple) and args and isinstance(args[0], int) else 0


def _count(counts: dict[str, int], label: str) -> None:
    counts[label] = counts.get(label, 0) + 1


def wal_damage(directory: str, prefix: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name in sorted(n for n in OS_ENV.listdir(directory) if is_wal_file_name(prefix, n)):
        found = verify_file(OS_ENV, directory, name, "wal")
        for label, n in ({} if found is None else found.faults).items():
            counts[label] = counts.get(label, 0) + n
    return counts


def dead_frame_damage(directory: str, prefix: str) -> dict[str, int]:
    """Damage of the data file's lines (R-@B to R-@F, R-@K); payloads are judged by the Disk."""
    counts: dict[str, int] = {}
    try:
        fd = OS_ENV.open(join(directory, dead_data_name(prefix)), OpenFlag.READ)
    except FileNotFoundError:
        return counts
    try:
        for raw in lines_forward(OS_ENV, fd, OS_ENV.fstat(fd).size):
            data, faults = line_body(raw)
            for fault in faults:
                _count(counts, fault.value)
            framed = None if data is None else decode_dead_line(data)
            if isinstance(framed, BadLine):
                _count(counts, framed.fault.value)
    finally:
        OS_ENV.close(fd)
    return counts


def read(directory: str, prefix: str) -> Json:
    """The conformance report of ``directory``; raises SystemExit (status 1) on an inconsistency."""
    wal_counts = wal_damage(directory, prefix)
    dead_counts = dead_frame_damage(directory, prefix)
    logged = _Logged()
    logger = logging.getLogger("deferq")
    logger.addHandler(logged)
    try:
        with tempfile.TemporaryDirectory(prefix="deferq-conformance-") as scratch:
            copy = Path(scratch) / "store"
            shutil.copytree(directory, copy, symlinks=True)
            with Disk(path=str(copy), prefix=prefix, fsync_frequency=0) as disk:
                pending = disk.pending_tasks()
                dead = disk.list_dead_tasks()
    finally:
        logger.removeHandler(logged)
    if logged.undecodable:
        dead_counts[R_G] = logged.undecodable
    if (logged.wal_total != sum(wal_counts.values())
            or logged.dead_total != sum(n for k, n in dead_counts.items() if k != R_G)):
        raise SystemExit(f"deferq_reader: the Disk logged {logged.wal_total} WAL and "
                         f"{logged.dead_total} dead-task damaged lines, the line scan found "
                         f"{wal_counts} and {dead_counts}")  # exit status 1, message on stderr
    return report(prefix, pending, dead, wal_counts, dead_counts)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m deferq.conformance.deferq_reader DIRECTORY PREFIX",
              file=sys.stderr)
        return 2
    # The Disk's own warnings would go to stderr through logging's last resort; the report
    # already says everything they say.
    logging.getLogger("deferq").propagate = False
    sys.stdout.write(json.dumps(read(argv[0], argv[1]), ensure_ascii=True, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
