"""Operator subcommands of ``deferq``: ``dead ...`` (``_cli.dead``), ``pending list``, ``stats``
and ``verify``, and their arguments (spec/queue.md Q-13..Q-15, Q-17, Q-24..Q-28, Q-33).

Rules:
- Every subcommand takes ``--path`` and ``--prefix`` itself, because the top-level
  parser is shared; their defaults come from ``DEFERQ_PATH`` and ``DEFERQ_PREFIX``,
  else ``storage`` and ``deferred-`` (Q-24).
- The directory must hold a store of that prefix, or the command fails with status 5
  and names the prefixes it does hold (Q-25): it never creates a store, and a typo
  never reads as an empty one (``_cli.store``).
- ``pending list`` scans WAL files read-only without claiming them (a live worker holds
  its file's lock), so it shows what is on disk now, merged as recovery merges (W-42);
  ``stats`` adds the dead tasks.
- ``--json`` prints exactly one JSON document (Q-26); text for people is escaped and
  aligned (Q-28, ``_cli.output``). Exit statuses: ``EXIT_STATUSES``.
"""

from __future__ import annotations

import argparse
import os
from typing import Final

from deferq._cli.db import database_options, open_database, refuse_files_only
from deferq._cli.dead import (
    DeadStoreView,
    dead_list,
    dead_remove,
    dead_retry,
    dead_show,
)
from deferq._cli.output import (
    context_json,
    context_summary,
    print_json,
    safe,
    table,
    when,
)
from deferq._cli.parser import Parser, Subcommands
from deferq._cli.progress import Progress
from deferq._cli.store import PATH_VARIABLE, PREFIX_VARIABLE, require_store, storage_of
from deferq._core.limits import DEFAULT_PATH, DEFAULT_PREFIX
from deferq._core.names import is_wal_file_name
from deferq._engine.env import OpenFlag
from deferq._engine.io import records_end
from deferq._engine.osenv import OS_ENV
from deferq._runtime.operator import Operator

EXIT_DAMAGED: Final = 4
EXIT_STATUSES: Final = """\
exit status:
  0  done
  1  an error (the message says which)
  2  a usage error
  3  some id asked for was not found
  4  verify found damage
  5  no store of that prefix in that directory (nothing was created)"""


def file_size_text(path: str, prefix: str = DEFAULT_PREFIX) -> str:
    """A file's size for people: for a WAL file, its records and the space reserved after them
    (W-25, R-@L), so that 1 MiB of reserved zeros does not read as 1 MiB of tasks."""
    size = os.path.getsize(path)
    if not is_wal_file_name(prefix, os.path.basename(path)):
        return f"{size:>7} bytes"
    fd = OS_ENV.open(path, OpenFlag.READ)
    try:
        records = records_end(OS_ENV, fd, size)  # the readers' own rule, reading the tail only
    finally:
        OS_ENV.close(fd)
    return f"{records:>7} bytes (+{size - records} reserved)"

def _storage(args: argparse.Namespace) -> tuple[str, str]:
    """The command's (path, prefix), once it is known to hold a store of that prefix (Q-25)."""
    path, prefix = storage_of(args)
    require_store(path, prefix)
    return path, prefix


def _database_pending(args: argparse.Namespace) -> int | None:
    """``deferq pending list`` on PostgreSQL (P-7), or None when it acts on a directory."""
    database = open_database(args)
    if database is None:
        return None
    with database:
        rows = database.list_pending()
    if args.json:
        print_json([{"id": r.task.task_id, "publish_at": r.task.publish_at,
                     "held_by": r.held_by, "lease_until": r.lease_until,
                     "context": context_json(r.task.context)} for r in rows])
        return 0
    lines = []
    for row in rows:
        name, attempts = context_summary(row.task.context)
        runs_at = "now" if row.task.publish_at is None else when(row.task.publish_at)
        lines.append([safe(row.task.task_id), name, attempts, runs_at,
                      "-" if row.held_by is None else safe(row.held_by)])
    if lines:
        print("\n".join(table(("ID", "TASK", "ATTEMPTS", "RUNS AT", "HELD BY"), lines)))
    print(f"{len(rows)} pending task(s) in schema {database.schema!r}")
    return 0


def pending_list(args: argparse.Namespace) -> int:
    on_database = _database_pending(args)
    if on_database is not None:
        return on_database
    path, prefix = _storage(args)
    from deferq._engine.scan import scan_pending  # noqa: PLC0415 - pending commands only
    scan = scan_pending(OS_ENV, path, prefix)  # W-42: one replay of every file, as recovery
    if args.json:
        print_json([{"file": scan.origin[task.task_id], "id": task.task_id,
                     "publish_at": task.publish_at, "context": context_json(task.context)}
                    for task in scan.pending])
        return 0
    rows = []
    for task in scan.pending:
        name, attempts = context_summary(task.context)
        runs_at = "now" if task.publish_at is None else when(task.publish_at)
        rows.append([safe(task.task_id), name, attempts, runs_at,
                     safe(scan.origin[task.task_id])])
    if rows:
        print("\n".join(table(("ID", "TASK", "ATTEMPTS", "RUNS AT", "WAL FILE"), rows)))
    corrupt = scan.corrupt_lines
    print(f"{len(rows)} pending task(s) in {len(scan.files)} WAL file(s)"
          + (f"; {corrupt} damaged line(s) skipped" if corrupt else ""))
    return 0


def _database_stats(args: argparse.Namespace) -> int | None:
    """``deferq stats`` on PostgreSQL (P-7), or None when the command acts on a directory."""
    database = open_database(args)
    if database is None:
        return None
    with database:
        report: dict[str, object] = {"schema": database.schema, **database.stats()}
    if args.json:
        print_json(report)
        return 0
    print("\n".join(table(("STORE", ""), [
        ["schema", safe(database.schema)], ["pending tasks", str(report["pending_tasks"])],
        ["claimed tasks", str(report["claimed_tasks"])],
        ["dead tasks", str(report["dead_tasks"])]])))
    _print_counts(report)
    return 0


def _print_counts(counts: dict[str, object]) -> None:
    for title, key in (("TASK CLASS", "by_task_class"), ("EXCEPTION CLASS", "by_exception_class")):
        by = counts[key]
        assert isinstance(by, dict)
        if by:
            print()
            print("\n".join(table((title, "DEAD TASKS"),
                                  [[safe(str(name)), str(n)] for name, n in by.items()])))


def stats(args: argparse.Namespace) -> int:
    on_database = _database_stats(args)
    if on_database is not None:
        return on_database
    path, prefix = _storage(args)
    from deferq._engine.scan import scan_pending  # noqa: PLC0415 - pending commands only
    scan = scan_pending(OS_ENV, path, prefix)  # W-42: the merge recovery would make
    view = DeadStoreView(path, prefix, read_only=True)  # S-32
    try:
        counts = Operator(view).dead_stats()
    finally:
        view.close()
    report: dict[str, object] = {
        "path": path, "prefix": prefix, "wal_files": len(scan.files),
        "pending_tasks": len(scan.pending),
        "wal_damaged_lines": scan.corrupt_lines,
        **counts,
    }
    if args.json:
        print_json(report)
        return 0
    print("\n".join(table(("STORE", ""), [
        ["path", safe(path)], ["prefix", safe(prefix)], ["WAL files", str(len(scan.files))],
        ["pending tasks", str(report["pending_tasks"])],
        ["damaged WAL lines", str(report["wal_damaged_lines"])],
        ["dead tasks", str(counts["dead_tasks"])]])))
    _print_counts(counts)
    return 0


def verify(args: argparse.Namespace) -> int:
    """``deferq verify``: report records and damage per file (Q-17)."""
    refuse_files_only(args, "verify")
    path, prefix = _storage(args)
    progress = Progress("verify: files scanned")
    try:
        from deferq._engine.verify import verify_directory  # noqa: PLC0415 - verify only
        reports = verify_directory(OS_ENV, path, prefix, on_file=lambda _name: progress.step())
    finally:
        progress.close()
    damaged = [r for r in reports if r.damaged]
    summary = {"files": len(reports), "records": sum(r.records for r in reports),
               "damaged_files": len(damaged)}
    if args.json:
        print_json({"files": [{"file": r.name, "kind": r.kind, "bytes": r.size_bytes,
                               "reserved_bytes": r.reserved_bytes, "records": r.records,
                               "faults": r.faults, "torn_tail_bytes": r.torn_tail_bytes}
                              for r in reports],
                    "summary": summary})
        return EXIT_DAMAGED if damaged else 0
    for r in reports:
        faults = ", ".join(f"{label} x{n}" for label, n in sorted(r.faults.items())) or "none"
        torn = f" (torn tail {r.torn_tail_bytes} bytes)" if r.torn_tail_bytes else ""
        reserved = f" (+{r.reserved_bytes} reserved)" if r.reserved_bytes else ""
        print(f"{r.kind:<4} {safe(r.name)}: {r.size_bytes - r.reserved_bytes} bytes{reserved}, "
              f"{r.records} records, damage: {faults}{torn}")
    print(f"verify: files={summary['files']} records={summary['records']} "
          f"damaged_files={summary['damaged_files']}")
    return EXIT_DAMAGED if damaged else 0


def storage_options() -> Parser:
    """``--path`` and ``--prefix``, for every operator subcommand (Q-24)."""
    # SUPPRESS: the options may also come before the subcommand (``deferq --path P dead
    # list``, added by _cli.build_parser); a default here would overwrite that value.
    common = Parser(add_help=False, parents=[database_options()])
    common.add_argument("--path", default=argparse.SUPPRESS,
                        help=f"storage directory (default: ${PATH_VARIABLE}, else {DEFAULT_PATH})")
    common.add_argument("--prefix", default=argparse.SUPPRESS,
                        help=f"file name prefix (default: ${PREFIX_VARIABLE}, else "
                             f"{DEFAULT_PREFIX})")
    return common


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _filters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task-class", metavar="CLASS",
                        help="only dead tasks of this task class (exact match)")
    parser.add_argument("--exception-class", metavar="CLASS",
                        help="only dead tasks of this exception class (exact match)")


def _json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true",
                        help="print exactly one JSON document (spec/queue.md Q-26)")


def register(sub: Subcommands) -> None:
    """Add ``dead``, ``pending``, ``stats`` and ``verify`` to the ``deferq`` command."""
    common = storage_options()
    raw = argparse.RawDescriptionHelpFormatter

    def command(parent: Subcommands, name: str,
                text: str) -> argparse.ArgumentParser:
        return parent.add_parser(name, parents=[common], help=text, description=text,
                                 epilog=EXIT_STATUSES, formatter_class=raw)

    dead = sub.add_parser("dead", help="inspect, retry and remove dead tasks",
                          epilog=EXIT_STATUSES, formatter_class=raw)
    dead_sub = dead.add_subparsers(dest="dead_command", required=True, metavar="COMMAND")

    listing = command(dead_sub, "list", "list dead tasks, newest first")
    listing.add_argument("--limit", type=_non_negative, metavar="N",
                         help="show at most N tasks (default: all)")
    listing.add_argument("--offset", type=_non_negative, default=0, metavar="N",
                         help="skip the N newest tasks first (default: 0)")
    _filters(listing)
    _json(listing)
    listing.set_defaults(handler=dead_list)

    show = command(dead_sub, "show", "show one dead task in full")
    show.add_argument("id", metavar="ID", help="the dead task's id")
    _json(show)
    show.set_defaults(handler=dead_show)

    for name, handler, text in (
            ("retry", dead_retry, "put dead tasks back into a WAL, under new ids (a running "
                                  "worker's sweep runs them within its sweep interval)"),
            ("remove", dead_remove, "delete dead tasks")):
        bulk = command(dead_sub, name, text)
        bulk.add_argument("ids", nargs="*", metavar="ID", help="the dead tasks' ids")
        bulk.add_argument("--all", action="store_true",
                          help="every dead task the filters select (all without filters)")
        _filters(bulk)
        bulk.add_argument("--dry-run", action="store_true",
                          help="show the selection, change nothing")
        _json(bulk)
        bulk.set_defaults(handler=handler)

    pending = sub.add_parser("pending", help="inspect pending tasks in WAL files",
                             epilog=EXIT_STATUSES, formatter_class=raw)
    pending_sub = pending.add_subparsers(dest="pending_command", required=True,
                                         metavar="COMMAND")
    plist = command(pending_sub, "list", "list pending tasks (a read-only scan of WAL files)")
    _json(plist)
    plist.set_defaults(handler=pending_list)

    check = command(sub, "verify", "scan every file read-only; exit 4 when any line is damaged")
    _json(check)
    check.set_defaults(handler=verify)

    stat = command(sub, "stats", "counts of pending and dead tasks")
    _json(stat)
    stat.set_defaults(handler=stats)
