"""The argument parser of every ``deferq`` command and subcommand.

Rules: a usage error raises ``CommandError`` with status ``EXIT_USAGE`` (after printing the
usage line) instead of exiting, so that ``main`` reports it like any other failure: one line
on standard error, and with ``--json`` the JSON document of Q-26.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Final, NoReturn, TypeAlias

from deferq._cli.store import CommandError

EXIT_USAGE: Final = 2


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose usage errors reach ``main``; subparsers are of this class."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        raise CommandError(f"{self.prog}: {message}", EXIT_USAGE)

    def _get_formatter(self) -> argparse.HelpFormatter:
        # argparse sizes every formatter with shutil.get_terminal_size, and building the
        # parser makes one per argument: importing shutil (and with it bz2, lzma) was a
        # tenth of `deferq dead list`'s start-up. Same width, from os and $COLUMNS.
        formatter = self.formatter_class
        if isinstance(formatter, type) and issubclass(formatter, argparse.HelpFormatter):
            return formatter(prog=self.prog, width=_terminal_columns() - 2)
        return super()._get_formatter()


def _terminal_columns() -> int:
    """``shutil.get_terminal_size().columns``, without importing shutil."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns if columns > 0 else 80


# A string: ``_SubParsersAction`` cannot be subscripted at run time, only by mypy.
Subcommands: TypeAlias = "argparse._SubParsersAction[Parser]"
