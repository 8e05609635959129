"""The ``deferq`` command (also ``python -m deferq``): the argument parser and ``main``.

``demo`` walks through a Disk backend, printing what happens and the files on
disk; ``queue-demo`` runs a small service; ``dead``/``pending``/``verify``/
``stats`` are the operator tools; ``crash-test`` and ``power-test`` run the crash
suites against the installed engine.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from deferq._cli import crash, demos, ops, power
from deferq._cli.store import CommandError
from deferq._core.errors import DeferqError

Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    """The ``deferq`` argument parser. Each area registers its own subcommands.

    Area modules (``ops``: operator commands; ``demos``: the two demos; ``crash``: the
    simulated crash suite; ``power``: real power cuts) each expose ``register(sub)``,
    which adds subparsers whose ``handler`` default takes the parsed arguments and
    returns the exit status. Only ``ops`` imports the library at load time: the demos,
    the simulator and the power harness are imported by their handlers, so an operator
    command never loads them.
    """
    parser = argparse.ArgumentParser(
        prog="deferq", description="deferq: durable deferred tasks. Demos, operator tools "
        "(dead, pending, verify, stats) and the crash suites (crash-test, power-test).")
    # Global storage options; the operator subcommands accept them after their name too.
    parser.add_argument("--path", default=argparse.SUPPRESS,
                        help="storage directory (default: $DEFERQ_PATH, else storage)")
    parser.add_argument("--prefix", default=argparse.SUPPRESS,
                        help="file name prefix (default: $DEFERQ_PREFIX, else deferred-)")
    sub = parser.add_subparsers(dest="command", required=True)
    for register in (demos.register, ops.register, crash.register, power.register):
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except CommandError as exc:
        print(f"deferq: error: {exc}", file=sys.stderr)
        return exc.status
    except (DeferqError, OSError, ValueError) as exc:
        print(f"deferq: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
