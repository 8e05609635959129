"""``deferq conformance [--corpus DIR] -- COMMAND...``: its arguments; the checker
(``deferq.conformance``) is imported only when the command runs.
"""

from __future__ import annotations

import argparse
import sys
from typing import Final

from deferq._cli.parser import Subcommands

DESCRIPTION: Final = """\
Run a storage reader (any language) once per case of the conformance corpus as
  COMMAND... DIRECTORY PREFIX
and compare the JSON it prints with the case's expected.json (conformance/README.md).
Each difference is one line: FAIL case path: expected X, got Y. The last line is always:
  conformance: cases=N passed=P failed=F

deferq's own reader: deferq conformance -- python -m deferq.conformance.deferq_reader

Exit status: 0 every case passed (and there was at least one); 1 otherwise; 2 usage.
"""


def register(sub: Subcommands) -> None:
    parser = sub.add_parser(
        "conformance", help="check a third-party reader against the conformance corpus",
        description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default=None,
                        help="corpus directory (default: the corpus shipped with deferq)")
    parser.add_argument("reader", nargs=argparse.REMAINDER, metavar="-- COMMAND...",
                        help="the reader to run, after --")
    parser.set_defaults(handler=_conformance)


def _conformance(args: argparse.Namespace) -> int:
    from deferq.conformance.cases import default_corpus  # noqa: PLC0415 - the tool, on demand
    from deferq.conformance.runner import command_reader, run  # noqa: PLC0415

    command = list(args.reader)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        print("deferq conformance: error: no reader command given (after --)", file=sys.stderr)
        return 2
    from pathlib import Path  # noqa: PLC0415 - not on the operator commands' start-up
    corpus = default_corpus() if args.corpus is None else Path(args.corpus)
    return run(corpus, command_reader(command), sys.stdout)
