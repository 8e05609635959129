"""The PostgreSQL store of an operator command, and ``deferq db init|upgrade`` (spec/postgres.md
P-3..P-7).

Rules:
- A command acts on PostgreSQL when it is given ``--dsn``, or when ``DEFERQ_DSN`` is set and
  no ``--path`` was given; ``--dsn`` with ``--path`` is a usage error (two stores). The
  schema comes from ``--schema``, else ``DEFERQ_SCHEMA``, else ``deferq`` (P-7).
- ``db init`` creates the tables (or upgrades them), ``db upgrade`` only upgrades; both say
  which version the schema went from and to, and refuse a schema of a newer deferq (P-5).
- Opening the store never creates it: a schema without tables fails with the message of
  P-4, a ``PostgresError`` that ``main`` prints as one line with exit status 1.
- ``--db-timeout SECONDS`` is the backend's ``timeout_seconds`` (P-47, P-60): how long one
  statement may go unanswered before the command fails.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

from deferq._cli.output import print_json
from deferq._cli.parser import EXIT_USAGE, Parser, Subcommands
from deferq._cli.store import CommandError
from deferq.backends._pgschema import DEFAULT_SCHEMA, check_schema_name

if TYPE_CHECKING:  # imported by the commands that open a database: not on a file store's path
    from deferq.backends.postgres import Postgres

DSN_VARIABLE: Final = "DEFERQ_DSN"
SCHEMA_VARIABLE: Final = "DEFERQ_SCHEMA"
DB_TIMEOUT_DEFAULT_S: Final = 30.0  # the backend's own default (P-47)


def database_of(args: argparse.Namespace,
                environ: Mapping[str, str] = os.environ) -> tuple[str, str] | None:
    """Implements P-7: the command's (dsn, schema) when it acts on PostgreSQL, else None."""
    dsn = getattr(args, "dsn", None)
    path_given = getattr(args, "path", None) is not None
    if dsn is not None and path_given:
        raise CommandError("--dsn and --path name two different stores: give one of them",
                           EXIT_USAGE)
    if dsn is None and not path_given:
        dsn = environ.get(DSN_VARIABLE) or None
    if dsn is None:
        return None
    schema = getattr(args, "schema", None) or environ.get(SCHEMA_VARIABLE) or DEFAULT_SCHEMA
    return dsn, check_schema_name(schema)


def db_timeout_of(args: argparse.Namespace) -> float:
    """Implements P-60: ``--db-timeout``, a number of seconds >= 1, else a usage error."""
    text = getattr(args, "db_timeout", None)
    if text is None:
        return DB_TIMEOUT_DEFAULT_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 1:
        raise CommandError(f"--db-timeout must be a number of seconds >= 1, got {text!r}",
                           EXIT_USAGE)
    return seconds


def open_database(args: argparse.Namespace) -> Postgres | None:
    """The command's PostgreSQL store, opened (never created), or None for a directory."""
    database = database_of(args)
    if database is None:
        return None
    dsn, schema = database
    timeout = db_timeout_of(args)
    from deferq.backends.postgres import Postgres  # noqa: PLC0415 - only with a database
    return Postgres(dsn=dsn, schema=schema, timeout_seconds=timeout)


def refuse_files_only(args: argparse.Namespace, command: str) -> None:
    """A command that reads WAL files (``verify``) has nothing to read in a database: say so
    instead of reading a directory the user did not mean."""
    if database_of(args) is not None:
        raise CommandError(f"{command} reads WAL files in a storage directory; on PostgreSQL "
                           f"use `deferq stats` (--dsn) instead", EXIT_USAGE)


def _migrate(args: argparse.Namespace, *, create: bool) -> int:
    database = database_of(args)
    if database is None:
        raise CommandError(f"db {'init' if create else 'upgrade'} needs a database: give --dsn "
                           f"or set {DSN_VARIABLE}", EXIT_USAGE)
    dsn, schema = database
    timeout = db_timeout_of(args)
    from deferq.backends.postgres import migrate_schema  # noqa: PLC0415 - only with a database
    before, after = migrate_schema(dsn, schema, create=create, timeout_seconds=timeout)
    if args.json:
        print_json({"schema": schema, "version_before": before, "version": after})
    elif before == after:
        print(f"schema {schema!r} is already at version {after}; nothing changed")
    elif before == 0:
        print(f"schema {schema!r}: created deferq's tables at version {after}")
    else:
        print(f"schema {schema!r}: upgraded from version {before} to {after}")
    return 0


def db_init(args: argparse.Namespace) -> int:
    return _migrate(args, create=True)


def db_upgrade(args: argparse.Namespace) -> int:
    return _migrate(args, create=False)


def database_options() -> Parser:
    """``--dsn`` and ``--schema``, for every operator subcommand and ``db`` (P-7)."""
    common = Parser(add_help=False)
    common.add_argument("--dsn", default=argparse.SUPPRESS,
                        help=f"act on PostgreSQL: a libpq connection string or URI (default: "
                             f"${DSN_VARIABLE} when no --path is given)")
    common.add_argument("--schema", default=argparse.SUPPRESS,
                        help=f"the PostgreSQL schema of deferq's tables (default: "
                             f"${SCHEMA_VARIABLE}, else {DEFAULT_SCHEMA})")
    common.add_argument("--db-timeout", default=argparse.SUPPRESS, metavar="SECONDS",
                        help=f"fail when PostgreSQL leaves one statement unanswered this long "
                             f"(default {DB_TIMEOUT_DEFAULT_S:g})")
    return common


def register(sub: Subcommands, epilog: str) -> None:
    """Add ``db init`` and ``db upgrade`` to the ``deferq`` command."""
    raw = argparse.RawDescriptionHelpFormatter
    db = sub.add_parser("db", help="create or upgrade deferq's tables in PostgreSQL",
                        epilog=epilog, formatter_class=raw)
    db_sub = db.add_subparsers(dest="db_command", required=True, metavar="COMMAND")
    for name, handler, text in (
            ("init", db_init, "create deferq's tables in a PostgreSQL schema (or upgrade them)"),
            ("upgrade", db_upgrade, "upgrade deferq's tables to this deferq's version")):
        command = db_sub.add_parser(name, parents=[database_options()], help=text,
                                    description=text, epilog=epilog, formatter_class=raw)
        command.add_argument("--json", action="store_true",
                             help="print exactly one JSON document (spec/queue.md Q-26)")
        command.set_defaults(handler=handler)
