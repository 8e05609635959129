"""``deferq dead list|show|retry|remove``: the dead-task commands (spec/queue.md Q-33, Q-13,
Q-24..Q-28).

Rules:
- ``list``, ``show`` and ``remove`` open only the dead-task store (its lock, bounded
  waits): they create no WAL file and work while workers run.
- ``retry`` writes each task under a new id into a hand-off WAL file exactly as large as its
  records (``HandoffWal``, W-34), fsyncs it and releases it, and only then removes the dead
  records (Q-33); a running worker's adoption sweep runs them within its interval (Q-70),
  or the next worker to start does.
- With ``--dsn`` (or ``DEFERQ_DSN``) every command acts on PostgreSQL instead
  (spec/postgres.md P-7); ``retry`` then adds free tasks that running workers claim.
- Bulk actions (``--all``) act only on what the filters select; ``--dry-run`` shows the
  selection and changes nothing. Every id asked for and not found is named, on standard
  error (and in the JSON document), and makes the exit status 3.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Final, TypeVar

from deferq._cli.db import open_database
from deferq._cli.output import (
    context_text,
    dead_json,
    one_line,
    print_json,
    safe,
    table,
    when,
)
from deferq._cli.parser import EXIT_USAGE
from deferq._cli.progress import Progress
from deferq._cli.store import EXIT_NO_STORE, CommandError, require_store, storage_of
from deferq._core.names import dead_data_name, dead_lock_name
from deferq._core.taskid import check_task_id
from deferq._core.types import DeadTask
from deferq._engine.deadstore import DeadTaskStore
from deferq._engine.osenv import DirEnv
from deferq._runtime.operator import Operator, Retried

if TYPE_CHECKING:  # a database's store is opened by open_database, on demand
    from deferq.backends.postgres import Postgres

EXIT_NOT_FOUND: Final = 3
DEAD_HEADERS: Final = ("ID", "TASK CLASS", "ATTEMPTS", "FAILED AT", "EXCEPTION")


R = TypeVar("R")

class DeadStoreView:
    """The dead-task half of a backend, without opening a WAL.

    ``read_only`` (S-32): the lock file is opened for reading and nothing is created or
    fsynced; a store whose dead-task files do not exist yet reads as empty.
    """

    def __init__(self, path: str, prefix: str, *, read_only: bool = False) -> None:
        # F-25, F-27, F-28: the directory held open and checked, and, as root, every file
        # the store creates given to the directory's owner, so workers can open it after.
        # Implements Q-81: a read-only view creates nothing and opens nothing for writing.
        self._env = DirEnv(path)
        self._store: DeadTaskStore | None = None
        try:
            self._store = DeadTaskStore(self._env, path, prefix, read_only=read_only)
        except FileNotFoundError:
            if not read_only:
                self._env.close_directory()
                raise
            names = self._env.listdir(path)
            self._env.close_directory()
            if dead_data_name(prefix) in names:
                raise CommandError(f"the dead-task lock file {dead_lock_name(prefix)} is missing "
                                   f"in {path}: a read-only command cannot lock the store to read "
                                   "it", EXIT_NO_STORE) from None
            # No data file and no lock file: no dead task was ever stored here (S-32).
        except BaseException:
            self._env.close_directory()
            raise

    def list_dead_tasks(self, *, limit: int | None = None, offset: int = 0) -> list[DeadTask]:
        return [] if self._store is None else self._store.list_tasks(limit, offset)

    def iter_dead_tasks(self, *, offset: int = 0, limit: int | None = None
                        ) -> Iterator[DeadTask]:
        """The store read in lock steps (S-27): what the operator's long reads use (Q-90)."""
        return iter(()) if self._store is None else self._store.iter_tasks(offset, limit)

    def fold_dead_tasks(self, fold: Callable[[Iterator[DeadTask]], R]) -> R | None:
        """``fold`` over every dead task through the index cache (S-86); None: read in steps."""
        return fold(iter(())) if self._store is None else self._store.fold_tasks(fold)

    @property
    def undecodable_logged(self) -> int:
        """How many undecodable records the reads so far logged and left out (S-43, Q-190)."""
        return 0 if self._store is None else self._store.undecodable_logged

    def find_dead_task(self, task_id: str) -> DeadTask | None:
        tid = check_task_id(task_id)
        return None if self._store is None else self._store.find(tid)

    def remove_dead_tasks(self, ids: str | Iterable[str] | None) -> int:
        if ids is None:
            return 0
        assert self._store is not None, "remove on a read-only view"
        wanted = [ids] if isinstance(ids, str) else list(ids)
        assert self._store is not None, "a writable view always has a store"
        return self._store.remove({check_task_id(i, argument="id") for i in wanted})

    def close(self) -> None:
        if self._store is None:
            return
        try:
            self._store.close()
        finally:
            self._env.close_directory()


def _view(args: argparse.Namespace, *, read_only: bool = False
          ) -> tuple[str, str, DeadStoreView | Postgres]:
    database = open_database(args)  # P-7: --dsn / DEFERQ_DSN, never created
    if database is not None:
        return "", "", database
    path, prefix = storage_of(args)
    require_store(path, prefix)
    return path, prefix, DeadStoreView(path, prefix, read_only=read_only)


def dead_row(task: DeadTask) -> list[str]:
    """One dead task as a row of ``DEAD_HEADERS``, escaped for a terminal."""
    return [safe(task.id), safe(task.task_class), str(task.attempts), when(task.failed_at),
            f"{safe(task.exception_class)}: {one_line(task.exception_message)}"]


def _print_dead_table(tasks: list[DeadTask]) -> None:
    if tasks:
        print("\n".join(table(DEAD_HEADERS, [dead_row(t) for t in tasks])))


def _not_found(task_id: str) -> None:
    print(f"deferq: error: no dead task with id {safe(task_id)!r}", file=sys.stderr)


def dead_list(args: argparse.Namespace) -> int:
    _, _, view = _view(args, read_only=True)
    try:
        tasks = Operator(view).list_dead(limit=args.limit, offset=args.offset,
                                         task_class=args.task_class,
                                         exception_class=args.exception_class)
    finally:
        view.close()
    if args.json:
        print_json([dead_json(t) for t in tasks])
        return 0
    _print_dead_table(tasks)
    left_out = view.undecodable_logged if isinstance(view, DeadStoreView) else 0
    print(list_footer(len(tasks), left_out, args.offset, args.limit))
    return 0


def list_footer(shown: int, left_out: int, offset: int, limit: int | None) -> str:
    """Implements Q-190: a page shortened by undecodable records says so, and where to go on."""
    footer = f"{shown} dead task(s)"
    if left_out:
        footer += (f"; {left_out} undecodable record(s) left out of this page (each one"
                   " logged; `deferq verify` counts them)")
        if limit is not None:
            footer += f"; the next page starts at --offset {offset + limit}"
    return footer


def dead_show(args: argparse.Namespace) -> int:
    _, _, view = _view(args, read_only=True)
    try:
        task = Operator(view).find_dead(args.id)
    finally:
        view.close()
    if task is None:
        _not_found(args.id)
        if args.json:
            print_json(None)
        return EXIT_NOT_FOUND
    if args.json:
        print_json(dead_json(task))
        return 0
    fields = [("id", safe(task.id)), ("task class", safe(task.task_class)),
              ("attempts", str(task.attempts)), ("enqueued at", when(task.enqueued_at)),
              ("failed at", when(task.failed_at)),
              ("exception", f"{safe(task.exception_class)}: {safe(task.exception_message)}"),
              ("context", context_text(task.context))]
    for name, value in fields:
        print(f"{name + ':':<13}{value}")
    meta = task.meta
    print("meta:" if meta else "meta:        (none)")
    for key, value in meta.items():
        print(f"  {safe(key)}: {safe(value)}")
    print("backtrace:")
    for frame in task.backtrace:
        print(f"  {safe(frame)}")
    return 0


def _select(operator: Operator, args: argparse.Namespace) -> list[str]:
    """The ids a bulk command acts on (every id once, in the order given)."""
    if args.all == bool(args.ids):
        raise CommandError("give task ids or --all, not both and not neither", EXIT_USAGE)
    if args.all:
        return operator.select_ids(task_class=args.task_class,
                                   exception_class=args.exception_class)
    if args.task_class is not None or args.exception_class is not None:
        raise CommandError("--task-class and --exception-class select with --all only",
                           EXIT_USAGE)
    for task_id in args.ids:
        check_task_id(task_id, argument="id")
    return list(dict.fromkeys(args.ids))


def _split(operator: Operator, ids: list[str]) -> tuple[list[DeadTask], list[str]]:
    """The dead tasks of ``ids`` that exist now, and the ids that do not."""
    found: list[DeadTask] = []
    missing: list[str] = []
    progress = Progress("looking up ids", len(ids))
    try:
        for task_id in ids:
            progress.step()
            task = operator.find_dead(task_id)
            if task is None:
                missing.append(task_id)
            else:
                found.append(task)
    finally:
        progress.close()
    return found, missing


def _dry_run(operator: Operator, ids: list[str], verb: str, json_out: bool) -> int:
    found, missing = _split(operator, ids)
    for task_id in missing:
        _not_found(task_id)
    if json_out:
        print_json({"dry_run": True, f"would_{verb}": [dead_json(t) for t in found],
                    "missing": missing})
    else:
        _print_dead_table(found)
        print(f"dry run: would {verb} {len(found)} dead task(s)")
    return EXIT_NOT_FOUND if missing else 0


def dead_retry(args: argparse.Namespace) -> int:
    path, prefix, view = _view(args)
    try:
        ids = _select(Operator(view), args)
        if args.dry_run:
            return _dry_run(Operator(view), ids, "retry", args.json)
    finally:
        view.close()
    retried: list[Retried] = []
    missing: list[str] = []
    if ids:
        progress = Progress("retry: steps", 2 * len(ids))
        try:
            database = open_database(args)
            if database is not None:
                # On PostgreSQL (P-7) the retried tasks are free rows that running workers
                # claim at once (P-72).
                with database:
                    retried, missing = Operator(database, database).retry_dead(
                        ids, on_task=progress.step)
            else:
                dead = DeadStoreView(path, prefix)
                # F-25, F-28: the hand-off file is made through the directory held open and,
                # as root, given to the directory's owner, so a worker can adopt it.
                handoff_env = DirEnv(path)
                try:
                    from deferq._engine.walorphan import HandoffWal  # noqa: PLC0415
                    with HandoffWal(handoff_env, path, prefix) as handoff:
                        retried, missing = Operator(dead, handoff).retry_dead(
                            ids, on_task=progress.step)
                finally:
                    dead.close()
                    handoff_env.close_directory()
        finally:
            progress.close()
    for task_id in missing:
        _not_found(task_id)
    if args.json:
        print_json({"retried": [{"id": r.old_id, "new_id": r.new_id} for r in retried],
                    "missing": missing})
    else:
        for item in retried:
            print(f"retried {safe(item.old_id)} as {item.new_id}")
        runs = ("running workers claim them now" if path == "" else
                "a running worker adopts them within its sweep interval (2 s by default),"
                " or the next worker to start does")
        print(f"retried {len(retried)} dead task(s); {runs}")
    return EXIT_NOT_FOUND if missing else 0


def dead_remove(args: argparse.Namespace) -> int:
    _, _, view = _view(args)
    operator = Operator(view)
    try:
        ids = _select(operator, args)
        if args.dry_run:
            return _dry_run(operator, ids, "remove", args.json)
        # Explicit ids are looked up first so that a missing one can be named;
        # ``--all`` selected ids that exist.
        missing = [] if args.all else _split(operator, ids)[1]
        wanted = [i for i in ids if i not in set(missing)]
        removed = operator.remove_dead(wanted) if wanted else 0
    finally:
        view.close()
    for task_id in missing:
        _not_found(task_id)
    if args.json:
        print_json({"removed": removed, "missing": missing})
    else:
        print(f"removed {removed} dead task(s)")
    return EXIT_NOT_FOUND if missing or removed < len(wanted) else 0
