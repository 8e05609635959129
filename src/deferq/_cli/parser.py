"""The argument parser of every ``deferq`` command and subcommand.

Rules: a usage error raises ``CommandError`` with status ``EXIT_USAGE`` (after printing the
usage line) instead of exiting, so that ``main`` reports it like any other failure: one line
on standard error, and with ``--json`` the JSON document of Q-26.
"""

from __future__ import annotations

import argparse
import sys
from typing import Final, NoReturn, TypeAlias

from deferq._cli.store import CommandError

EXIT_USAGE: Final = 2


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose usage errors reach ``main``; subparsers are of this class."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        raise CommandError(f"{self.prog}: {message}", EXIT_USAGE)


# A string: ``_SubParsersAction`` cannot be subscripted at run time, only by mypy.
Subcommands: TypeAlias = "argparse._SubParsersAction[Parser]"
