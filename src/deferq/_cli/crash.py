"""``deferq crash-test``: its arguments; the simulator and the explorer (``deferq.crashtest``)
are imported only when the command runs, so the other commands never load them.
"""

from __future__ import annotations

import argparse
from typing import Final

from deferq._cli.parser import Subcommands

# The names of deferq.crashtest._explore.MODELS and BOUNDS, and crashtest.cli's exit status
# for an incomplete run: repeated here so that parsing never loads the simulator (a test
# compares them).
MODELS: Final = ("weakest", "ext4_ordered", "prefix")
BOUND_NAMES: Final = ("ci", "full")
EXIT_INCOMPLETE: Final = 3
DESCRIPTION: Final = """\
Explore every workload of up to --max-ops operations on a simulated disk, crashing before
every system call, inside every write and at every fsync, and check every recovery each
persistence model allows; then check that every mutant of the catalogue (deliberately broken
engines, shipped with deferq) is caught while the real engine passes the same checks.

The last line is always:
  crash-test: workloads=W crash_points=P states=S violations=V mutants_caught=K/M complete=C

Exit status: 0 complete and clean; 1 a violation, or a mutant not caught; 3 nothing failed
but the run was incomplete (stopped on --seconds, or no mutant checked), said on an
INCOMPLETE line; 2 usage.
"""


def register(sub: Subcommands) -> None:
    parser = sub.add_parser(
        "crash-test", help="crash-test the storage engine on a simulated disk",
        description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=None,
                        help="time budget of the exploration (default: none); it stops early "
                             "and says so")
    parser.add_argument("--seed", type=int, default=0, help="seed (default %(default)s)")
    parser.add_argument("--model", choices=(*MODELS, "all"), default="all",
                        help="persistence model for power losses (default %(default)s); the "
                             "process kill is always checked")
    parser.add_argument("--max-ops", type=int, default=2,
                        help="workload length N (default %(default)s; 3 is the long run)")
    parser.add_argument("--bound", choices=BOUND_NAMES, default="ci",
                        help="crash-state bound (default %(default)s)")
    parser.add_argument("--mutants-dir", default=None,
                        help="directory of another mutant catalogue (a catalogue.py defining "
                             "MUTANTS); default: the built-in catalogue")
    parser.add_argument("--jobs", type=int, default=1,
                        help="worker processes for the exploration (default %(default)s)")
    parser.add_argument("--replay", metavar="TOKEN", default=None,
                        help="rerun one failing case verbosely")
    parser.set_defaults(handler=_crash_test)


def _crash_test(args: argparse.Namespace) -> int:
    from deferq.crashtest.cli import run  # noqa: PLC0415 - the simulator, on demand

    args.models = MODELS if args.model == "all" else (args.model,)
    return run(args)
