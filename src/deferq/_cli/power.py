"""``deferq power-test``: its arguments; the harness (``deferq.powertest``) is imported only
when the command runs, so the other commands never load it.
"""

from __future__ import annotations

import argparse

from deferq._cli.parser import Subcommands


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cycles", type=int, default=100,
                        help="crash cycles to run (default %(default)s; a soak: 2000)")
    parser.add_argument("--seed", type=int, default=None,
                        help="random seed (default: chosen and printed)")
    parser.add_argument("--fs", choices=("ext4",), default="ext4",
                        help="filesystem of the image (default %(default)s)")
    parser.add_argument("--workers", choices=("storage", "queue", "mixed"), default="mixed",
                        help="storage: processes that drive Disk directly; queue: real Queue "
                             "processes over Disk (workers and an operator); mixed: both "
                             "(default %(default)s)")
    parser.add_argument("--log", default=None,
                        help="also write every worker event as a JSON line to this file")
    parser.add_argument("--evidence", default=None,
                        help="copy the recovered files of every failing cycle under this directory")
    parser.add_argument("--quiet", action="store_true", help="print only the summary")


def _power_test(args: argparse.Namespace) -> int:
    from deferq.powertest.cli import power_test  # noqa: PLC0415 - the harness, on demand

    return power_test(args)


def register(sub: Subcommands) -> None:
    parser = sub.add_parser("power-test", help="SIGKILLs and power cuts on a loop-mounted ext4"
                            " image (root)")
    add_arguments(parser)
    parser.set_defaults(handler=_power_test)
