"""Operator subcommands of ``deferq``: ``dead list|show|retry|remove``, ``pending list``, ``stats``.

Rules (spec/queue.md Q-12..Q-15, Q-17, Q-24, Q-25):
- Every subcommand takes ``--path`` and ``--prefix`` itself, because the top-level
  parser is shared; their defaults come from ``DEFERQ_PATH`` and ``DEFERQ_PREFIX``,
  else ``storage`` and ``deferred-`` (Q-24).
- The directory must hold a store of that prefix, or the command fails with status 5
  and names the prefixes it does hold (Q-25): it never creates a store, and a typo
  never reads as an empty one (``_cli.store``).
- ``dead list/show/remove`` and ``stats`` open only the dead-task store (its
  lock, bounded waits): they create no WAL file and work while workers run.
- ``dead retry`` opens a ``Disk`` (a WAL of its own, fsync on every add), adds
  each task under a new id, fsyncs, and only then removes the dead records;
  the retried tasks run at the next start of a worker (a running worker does
  not adopt another process's WAL file).
- ``pending list`` scans WAL files read-only without claiming them (a live
  worker holds its file's lock), so it shows what is on disk now.
- Bulk actions (``--all``) act only on what the filters select and print how
  many tasks they touched; ``--dry-run`` prints the selection and changes
  nothing. Exit status: 0 done, 1 error, 2 usage, 3 some ids not found, 4 damage found
  (verify), 5 no store of that prefix there.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from collections.abc import Iterable

from deferq._cli.store import PATH_VARIABLE, PREFIX_VARIABLE, require_store, storage_of
from deferq._core.format import check_task_id, is_wal_file_name
from deferq._core.limits import DEFAULT_PATH, DEFAULT_PREFIX
from deferq._core.types import DeadTask
from deferq._engine.deadstore import DeadTaskStore
from deferq._engine.env import OpenFlag
from deferq._engine.io import records_end
from deferq._engine.osenv import OS_ENV
from deferq._engine.scan import scan_pending
from deferq._engine.verify import verify_directory
from deferq._runtime.operator import Operator, dead_stats
from deferq._runtime.serialize import (
    JSON_CODEC,
    ContextCodec,
    ContextError,
    decode_context,
)
from deferq.backends import Disk

NOT_FOUND_STATUS = 3


class DeadStoreView:
    """The dead-task half of a backend, without opening a WAL."""

    def __init__(self, path: str, prefix: str) -> None:
        self._store = DeadTaskStore(OS_ENV, path, prefix)

    def list_dead_tasks(self, *, limit: int | None = None, offset: int = 0) -> list[DeadTask]:
        return self._store.list_tasks(limit, offset)

    def find_dead_task(self, task_id: str) -> DeadTask | None:
        return self._store.find(check_task_id(task_id))

    def remove_dead_tasks(self, ids: str | Iterable[str] | None) -> int:
        if ids is None:
            return 0
        wanted = [ids] if isinstance(ids, str) else list(ids)
        return self._store.remove({check_task_id(i, argument="id") for i in wanted})

    def close(self) -> None:
        self._store.close()



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


def _when(epoch: int) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%SZ")


def _context_view(context: bytes) -> object:
    try:
        decoded = decode_context(context)
    except ContextError:
        return context.decode("utf-8", "backslashreplace")
    return {"task": decoded.task, "args": list(decoded.args), "kwargs": decoded.kwargs,
            "attempts": decoded.attempts}


def _dead_json(task: DeadTask) -> dict[str, object]:
    return {"id": task.id, "task_class": task.task_class, "attempts": task.attempts,
            "enqueued_at": task.enqueued_at, "failed_at": task.failed_at,
            "exception_class": task.exception_class, "exception_message": task.exception_message,
            "backtrace": list(task.backtrace), "context": _context_view(task.context)}


def _one_line(text: str, width: int = 80) -> str:
    first = text.splitlines()[0] if text else ""
    return first if len(first) <= width else first[: width - 3] + "..."


def _print_dead_line(task: DeadTask) -> None:
    print(f"{task.id}  {task.task_class}  attempts={task.attempts}  failed={_when(task.failed_at)}"
          f"  {task.exception_class}: {_one_line(task.exception_message)}")


def _with_view(args: argparse.Namespace) -> tuple[DeadStoreView, Operator]:
    view = DeadStoreView(*_storage(args))
    return view, Operator(view)


def dead_list(args: argparse.Namespace) -> int:
    view, operator = _with_view(args)
    try:
        tasks = operator.list_dead(limit=args.limit, offset=args.offset,
                                   task_class=args.task_class,
                                   exception_class=args.exception_class)
    finally:
        view.close()
    if args.json:
        print(json.dumps([_dead_json(t) for t in tasks], indent=2, ensure_ascii=False))
    else:
        for task in tasks:
            _print_dead_line(task)
        print(f"{len(tasks)} dead task(s)")
    return 0


def dead_show(args: argparse.Namespace) -> int:
    view, operator = _with_view(args)
    try:
        task = operator.find_dead(args.id)
    finally:
        view.close()
    if task is None:
        print(f"deferq: no dead task with id {args.id!r}", file=sys.stderr)
        return NOT_FOUND_STATUS
    if args.json:
        print(json.dumps(_dead_json(task), indent=2, ensure_ascii=False))
        return 0
    print(f"id:          {task.id}\ntask class:  {task.task_class}\nattempts:    {task.attempts}\n"
          f"enqueued at: {_when(task.enqueued_at)}\nfailed at:   {_when(task.failed_at)}\n"
          f"exception:   {task.exception_class}: {task.exception_message}\n"
          f"context:     {json.dumps(_context_view(task.context), ensure_ascii=False)}\nbacktrace:")
    for frame in task.backtrace:
        print(f"  {frame}")
    return 0


def _select(operator: Operator, args: argparse.Namespace) -> list[str] | None:
    """The ids a bulk command acts on, or None after a usage error was printed."""
    if args.all == bool(args.ids):
        print("deferq: error: give task ids or --all, not both and not neither", file=sys.stderr)
        return None
    if args.all:
        return [t.id for t in operator.list_dead(task_class=args.task_class,
                                                 exception_class=args.exception_class)]
    if args.task_class is not None or args.exception_class is not None:
        print("deferq: error: --task-class and --exception-class select with --all only",
              file=sys.stderr)
        return None
    return list(dict.fromkeys(args.ids))


def _dry_run(operator: Operator, ids: list[str], verb: str) -> int:
    found = [t for t in (operator.find_dead(i) for i in ids) if t is not None]
    for task in found:
        _print_dead_line(task)
    print(f"dry run: would {verb} {len(found)} dead task(s)")
    return 0 if len(found) == len(ids) else NOT_FOUND_STATUS


def _codec(args: argparse.Namespace) -> ContextCodec:
    """The pickle key comes from an environment variable, never from the command line (Q-19)."""
    name = getattr(args, "pickle_key_env", None)
    if name is None:
        return JSON_CODEC
    key = os.environ.get(name)
    if not key:
        raise ValueError(f"environment variable {name} (--pickle-key-env) is not set")
    return ContextCodec(pickle_key=key.encode("utf-8"), use_pickle=True)


def dead_retry(args: argparse.Namespace) -> int:
    path, prefix = _storage(args)
    view = DeadStoreView(path, prefix)
    try:
        ids = _select(Operator(view), args)
        if ids is None:
            return 2
        if args.dry_run:
            return _dry_run(Operator(view), ids, "retry")
    finally:
        view.close()
    if not ids:
        print("retried 0 dead task(s)")
        return 0
    codec = _codec(args)
    with Disk(path=path, prefix=prefix, fsync_frequency=0) as disk:
        retried, missing = Operator(disk, disk, codec=codec).retry_dead(ids)
    for item in retried:
        print(f"retried {item.old_id} as {item.new_id}")
    for task_id in missing:
        print(f"deferq: no dead task with id {task_id!r}", file=sys.stderr)
    print(f"retried {len(retried)} dead task(s); they run at the next start of a worker")
    return NOT_FOUND_STATUS if missing else 0


def dead_remove(args: argparse.Namespace) -> int:
    view, operator = _with_view(args)
    try:
        ids = _select(operator, args)
        if ids is None:
            return 2
        if args.dry_run:
            return _dry_run(operator, ids, "remove")
        removed = operator.remove_dead(ids) if ids else 0
    finally:
        view.close()
    print(f"removed {removed} dead task(s)")
    return 0 if removed == len(ids) else NOT_FOUND_STATUS


def pending_list(args: argparse.Namespace) -> int:
    path, prefix = _storage(args)
    scans = scan_pending(OS_ENV, path, prefix)
    rows = []
    for scan in scans:
        for task in scan.pending:
            rows.append({"file": scan.name, "id": task.task_id, "publish_at": task.publish_at,
                         "context": _context_view(task.context)})
    if args.json:
        print(json.dumps(rows, indent=2, ensure_ascii=False))
        return 0
    for row in rows:
        context = row["context"]
        name = context.get("task") if isinstance(context, dict) else "<undecodable>"
        attempts = context.get("attempts") if isinstance(context, dict) else "?"
        publish_at = row["publish_at"]
        when = "now" if not isinstance(publish_at, int) else _when(publish_at)
        print(f"{row['id']}  {name}  attempts={attempts}  at={when}  ({row['file']})")
    corrupt = sum(s.corrupt_lines for s in scans)
    print(f"{len(rows)} pending task(s) in {len(scans)} WAL file(s)"
          + (f"; {corrupt} damaged line(s) skipped" if corrupt else ""))
    return 0


def stats(args: argparse.Namespace) -> int:
    path, prefix = _storage(args)
    scans = scan_pending(OS_ENV, path, prefix)
    view, operator = _with_view(args)
    try:
        dead = operator.list_dead()
    finally:
        view.close()
    report: dict[str, object] = {
        "path": path, "prefix": prefix, "wal_files": len(scans),
        "pending_tasks": sum(len(s.pending) for s in scans),
        "wal_damaged_lines": sum(s.corrupt_lines for s in scans),
        **dead_stats(dead),
    }
    if args.json:
        print(json.dumps(report, indent=2, ensure_ascii=False))
    else:
        for key, value in report.items():
            print(f"{key}: {value}")
    return 0


def _storage_options() -> argparse.ArgumentParser:
    # SUPPRESS: the options may also come before the subcommand (``deferq --path P dead
    # list``, added by _cli.build_parser); a default here would overwrite that value.
    common = argparse.ArgumentParser(add_help=False)
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
    parser.add_argument("--task-class", help="only dead tasks of this task class (exact)")
    parser.add_argument("--exception-class", help="only dead tasks of this exception class (exact)")


EXIT_DAMAGED = 4


def verify(args: argparse.Namespace) -> int:
    """``deferq verify``: report records and damage per file (Q-17)."""
    path, prefix = _storage(args)
    reports = verify_directory(OS_ENV, path, prefix)
    if args.json:
        print(json.dumps([{"file": r.name, "kind": r.kind, "bytes": r.size_bytes,
                           "reserved_bytes": r.reserved_bytes,
                           "records": r.records, "faults": r.faults,
                           "torn_tail_bytes": r.torn_tail_bytes} for r in reports], indent=2))
    else:
        for r in reports:
            faults = ", ".join(f"{label} x{n}" for label, n in sorted(r.faults.items())) or "none"
            torn = f" (torn tail {r.torn_tail_bytes} bytes)" if r.torn_tail_bytes else ""
            reserved = f" (+{r.reserved_bytes} reserved)" if r.reserved_bytes else ""
            print(f"{r.kind:<4} {r.name}: {r.size_bytes - r.reserved_bytes} bytes{reserved}, "
                  f"{r.records} records, damage: {faults}{torn}")
    damaged = [r for r in reports if r.damaged]
    print(f"verify: files={len(reports)} records={sum(r.records for r in reports)} "
          f"damaged_files={len(damaged)}")
    return EXIT_DAMAGED if damaged else 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``dead``, ``pending`` and ``stats`` to the ``deferq`` command."""
    common = _storage_options()
    dead = sub.add_parser("dead", help="inspect, retry and remove dead tasks")
    dead_sub = dead.add_subparsers(dest="dead_command", required=True)

    listing = dead_sub.add_parser("list", parents=[common], help="list dead tasks, newest first")
    listing.add_argument("--limit", type=_non_negative)
    listing.add_argument("--offset", type=_non_negative, default=0)
    _filters(listing)
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(handler=dead_list)

    show = dead_sub.add_parser("show", parents=[common], help="show one dead task")
    show.add_argument("id")
    show.add_argument("--json", action="store_true", help="print JSON")
    show.set_defaults(handler=dead_show)

    for name, handler, text in (("retry", dead_retry, "put dead tasks back into a WAL"),
                                ("remove", dead_remove, "delete dead tasks")):
        bulk = dead_sub.add_parser(name, parents=[common], help=text)
        bulk.add_argument("ids", nargs="*", metavar="ID")
        bulk.add_argument("--all", action="store_true", help="every dead task the filters select")
        _filters(bulk)
        bulk.add_argument("--dry-run", action="store_true", help="show the selection, change nothing")
        if name == "retry":
            bulk.add_argument("--pickle-key-env", metavar="VAR",
                              help="read the HMAC key of pickled contexts from this environment "
                                   "variable (to reset their attempts)")
        bulk.set_defaults(handler=handler)

    pending = sub.add_parser("pending", help="inspect pending tasks in WAL files")
    pending_sub = pending.add_subparsers(dest="pending_command", required=True)
    plist = pending_sub.add_parser("list", parents=[common],
                                   help="list pending tasks (read-only scan of WAL files)")
    plist.add_argument("--json", action="store_true", help="print JSON")
    plist.set_defaults(handler=pending_list)

    check = sub.add_parser("verify", parents=[common],
                           help="scan every file read-only; exit 4 when any line is damaged")
    check.add_argument("--json", action="store_true", help="print JSON")
    check.set_defaults(handler=verify)

    stat = sub.add_parser("stats", parents=[common], help="counts of pending and dead tasks")
    stat.add_argument("--json", action="store_true", help="print JSON")
    stat.set_defaults(handler=stats)
