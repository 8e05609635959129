"""The ``deferq`` command (also ``python -m deferq``): the argument parser and ``main``.

``demo`` walks through a Disk backend, printing what happens and the files on
disk; ``queue-demo`` runs a small service; ``dead``/``pending``/``verify``/
``stats`` are the operator tools (``dead`` and ``stats`` also on PostgreSQL, with ``--dsn``);
``db init``/``db upgrade`` create and upgrade the PostgreSQL tables; ``crash-test`` and ``power-test`` run the crash
suites against the installed engine; ``conformance`` checks any reader against the corpus.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Final

from deferq import __version__
from deferq._cli import conformance, crash, db, demos, ops, power
from deferq._cli.output import print_json, safe
from deferq._cli.parser import Parser, Subcommands
from deferq._cli.store import CommandError
from deferq._core.errors import DeferqError

Handler = Callable[[argparse.Namespace], int]

# The area that registers each command. A command line that starts with one of these names
# builds only that area's parsers: building every command's parser was about a tenth of a
# `deferq dead list` (most of it gettext lookups, one per argument). Anything else (an
# option first, no command, a typo, --help) builds them all. A test checks this table
# against what each area registers.
AREA_OF: Final = {"demo": "demos", "queue-demo": "demos", "dead": "ops", "pending": "ops",
                  "stats": "ops", "verify": "ops", "crash-test": "crash",
                  "power-test": "power", "conformance": "conformance", "db": "db"}


def build_parser(command: str | None = None) -> Parser:
    """The ``deferq`` argument parser. Each area registers its own subcommands.

    Area modules (``ops``: operator commands; ``demos``: the two demos; ``crash``: the
    simulated crash suite; ``power``: real power cuts) each expose ``register(sub)``,
    which adds subparsers whose ``handler`` default takes the parsed arguments and
    returns the exit status. Only ``ops`` imports the library at load time: the demos,
    the simulator and the power harness are imported by their handlers, so an operator
    command never loads them. With ``command`` (the first word of the command line) named
    in ``AREA_OF``, only its area registers.
    """
    parser = Parser(
        prog="deferq", description="deferq: durable deferred tasks. Demos, operator tools "
        "(dead, pending, verify, stats) and the crash suites (crash-test, power-test).",
        epilog=ops.EXIT_STATUSES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"deferq {__version__}",
                        help="print deferq's version and exit")
    # Global storage options; the operator subcommands accept them after their name too.
    parser.add_argument("--path", default=argparse.SUPPRESS,
                        help="storage directory (default: $DEFERQ_PATH, else storage)")
    parser.add_argument("--prefix", default=argparse.SUPPRESS,
                        help="file name prefix (default: $DEFERQ_PREFIX, else deferred-)")
    parser.add_argument("--dsn", default=argparse.SUPPRESS,
                        help="act on PostgreSQL instead (default: $DEFERQ_DSN when no --path)")
    parser.add_argument("--schema", default=argparse.SUPPRESS,
                        help="PostgreSQL schema (default: $DEFERQ_SCHEMA, else deferq)")
    parser.add_argument("--db-timeout", default=argparse.SUPPRESS, metavar="SECONDS",
                        help="PostgreSQL: the longest one statement may go unanswered "
                             "(default 30)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    areas: dict[str, Callable[[Subcommands], None]] = {
        "demos": demos.register, "ops": ops.register, "crash": crash.register,
        "power": power.register, "conformance": conformance.register,
        "db": lambda sub: db.register(sub, ops.EXIT_STATUSES)}
    only = AREA_OF.get(command) if command is not None else None
    for area, register in areas.items():
        if only is None or area == only:
            register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return its exit status (``ops.EXIT_STATUSES``).

    Every failure is one line on standard error, ``deferq: error: ...``, and with ``--json``
    also the one JSON document on standard output (Q-26). A reader that closes the pipe
    early (``deferq dead list | head -1``) ends the command quietly.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        command = argv[0] if argv and not argv[0].startswith("-") else None
        args = build_parser(command).parse_args(argv)
    except CommandError as exc:
        return _failed(argparse.Namespace(json="--json" in argv), str(exc), exc.status)
    handler: Handler = args.handler
    try:
        try:
            return handler(args)
        except CommandError as exc:
            return _failed(args, str(exc), exc.status)
        except (DeferqError, OSError, ValueError) as exc:
            if isinstance(exc, BrokenPipeError):
                raise
            return _failed(args, str(exc), 1)
    except BrokenPipeError:
        # The reader is gone: nothing more can be said to it. Point stdout at /dev/null so
        # that the interpreter's final flush does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 1


def _failed(args: argparse.Namespace, message: str, status: int) -> int:
    print(f"deferq: error: {safe(message)}", file=sys.stderr)
    if getattr(args, "json", False):
        print_json({"error": message, "status": status})
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
