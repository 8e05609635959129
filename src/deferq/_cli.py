"""The ``deferq`` command (also ``python -m deferq``).

``demo`` walks through a Disk backend, printing what happens and the files on
disk; ``queue-demo`` runs a small service; ``dead``/``pending``/``verify``/
``stats`` are the operator tools; ``crash-test`` and ``power-test`` run the crash
suites against the installed engine.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from deferq import _cli_crash, _cli_ops, _cli_power
from deferq._errors import DeferqError
from deferq.backends import Disk


def _show_files(path: str) -> None:
    print(f"  files in {path}:")
    for name in sorted(os.listdir(path)):
        print(f"    {name:<48} {_cli_ops.file_size_text(os.path.join(path, name))}")


class _Failure(Exception):
    """Raised inside the demo to produce a real traceback for a dead task."""


def _charge_card(order: int) -> None:
    raise _Failure(f"card declined for order {order}")


def demo(path: str) -> int:
    """Add tasks, dead-letter some, list/find/remove them, restart, and show the files."""
    print(f"deferq storage demo in {path}\n")
    print("1. A worker opens a Disk backend and enqueues five tasks (contexts are opaque bytes).")
    with Disk(path=path, fsync_frequency=0.5) as disk:
        ids = [disk.add_task(f'{{"task": "ChargeCard", "order": {n}}}'.encode()) for n in range(5)]
        later = disk.add_task(b'{"task": "SendReport"}', publish_at=int(2e9))
        for task_id in ids:
            print(f"   enqueued {task_id}")
        print(f"   enqueued {later} (delayed until 2033-05-18)")
        disk.sync()
        _show_files(path)

        print("\n2. Orders 0 and 1 succeed and leave the WAL; orders 2-4 give up and are dead-lettered")
        print("   (dead-task record first, WAL removal second: a crash in between duplicates, never loses).")
        for task_id in ids[:2]:
            disk.remove_task(task_id)
        for n, task_id in enumerate(ids[2:], start=2):
            try:
                _charge_card(n)
            except _Failure as exc:
                disk.add_dead_task(task_id, f'{{"order": {n}}}'.encode(), exc,
                                   task_class="ChargeCard", attempts=21)
            disk.remove_task(task_id)
            print(f"   dead-lettered {task_id}")

        print("\n3. An operator lists the dead tasks, newest first, and looks one up.")
        for task in disk.list_dead_tasks(limit=10):
            print(f"   {task.id}  {task.task_class}  attempts={task.attempts}  "
                  f"{task.exception_class}: {task.exception_message}")
        found = disk.find_dead_task(ids[3])
        assert found is not None
        print(f"   find {ids[3]}: context={found.context!r}, {len(found.backtrace)} frame(s), "
              f"innermost {found.backtrace[-1]}")

        print("\n4. The operator removes two of them (one id twice, one unknown id: counted once / not at all).")
        removed = disk.remove_dead_tasks([ids[2], ids[2], ids[4], "no-such-task"])
        print(f"   removed {removed}; left: {[t.id for t in disk.list_dead_tasks()]}")
        _show_files(path)

    print("\n5. The worker restarts: it adopts its old WAL file and replays what is still pending.")
    with Disk(path=path) as disk:
        for pending in disk.pending_tasks():
            print(f"   pending {pending.task_id} publish_at={pending.publish_at} "
                  f"context={pending.context!r}")
        print(f"   dead tasks still stored: {[t.id for t in disk.list_dead_tasks()]}")
    print("\ndemo: ok")
    return 0


Handler = Callable[[argparse.Namespace], int]


def _add_demo(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    demo_parser = sub.add_parser("demo", help="run the storage demo")
    demo_parser.add_argument("--path", default="deferq-demo-storage",
                             help="storage directory (created; default %(default)s)")
    demo_parser.set_defaults(handler=lambda args: demo(str(args.path)))


def build_parser() -> argparse.ArgumentParser:
    """The ``deferq`` argument parser. Each area registers its own subcommands.

    Area modules (``_cli_ops``: operator commands and the queue demo; ``_cli_crash``:
    the simulated crash suite; ``_cli_power``: real power cuts) each expose
    ``register(sub)``, which adds subparsers whose ``handler`` default takes the
    parsed arguments and returns the exit status (one module per job, STYLE.md rule 3).
    """
    parser = argparse.ArgumentParser(
        prog="deferq", description="deferq: durable deferred tasks. Demos, operator tools "
        "(dead, pending, verify, stats) and the crash suites (crash-test, power-test).")
    # Global storage options; the operator subcommands accept them after their name too.
    parser.add_argument("--path", default=argparse.SUPPRESS,
                        help="storage directory (default storage)")
    parser.add_argument("--prefix", default=argparse.SUPPRESS,
                        help="file name prefix (default deferred-)")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_demo(sub)
    for register in (_cli_ops.register, _cli_crash.register, _cli_power.register):
        register(sub)
    return parser



def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except (DeferqError, OSError, ValueError) as exc:
        print(f"deferq: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
