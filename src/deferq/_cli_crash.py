"""``deferq crash-test``: bounded-exhaustive crash exploration and the mutant catalogue.

Runs ``deferq.testing._explore.explore`` against the installed engine, then checks every
mutant of the catalogue (``--mutants-dir``, or ``tests/mutants`` under the current
directory) is caught while the real engine passes the same checks. The last line of the
output is always::

    crash-test: workloads=W crash_points=P states=S violations=V mutants_caught=K/M

The exit status is 1 when V > 0 or K < M. Every failure prints a one-line replay
command; ``--replay TOKEN`` reruns one case verbosely.
"""

from __future__ import annotations

import argparse
import os
import sys

from deferq.testing._crashrun import Engine
from deferq.testing._explore import BOUNDS, ExploreReport, decode_token, explore, replay
from deferq.testing._mutants import Mutant, check_mutant, load_catalogue

_MODELS = ("weakest", "ext4_ordered", "prefix")
_DEFAULT_MUTANTS_DIR = os.path.join("tests", "mutants")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "crash-test", help="crash-test the storage engine on a simulated disk",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=None,
                        help="time budget of the exploration (default: none); it stops early "
                             "and says so")
    parser.add_argument("--seed", type=int, default=0, help="seed (default %(default)s)")
    parser.add_argument("--model", choices=(*_MODELS, "all"), default="all",
                        help="persistence model for power losses (default %(default)s); the "
                             "process kill is always checked")
    parser.add_argument("--max-ops", type=int, default=2,
                        help="workload length N (default %(default)s; 3 is the long run)")
    parser.add_argument("--bound", choices=sorted(BOUNDS), default="ci",
                        help="crash-state bound (default %(default)s)")
    parser.add_argument("--mutants-dir", default=None,
                        help=f"mutant catalogue directory (default {_DEFAULT_MUTANTS_DIR} "
                             "if it exists)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="worker processes for the exploration (default %(default)s)")
    parser.add_argument("--replay", metavar="TOKEN", default=None,
                        help="rerun one failing case verbosely")
    parser.set_defaults(handler=run)


def _catalogue(args: argparse.Namespace) -> tuple[tuple[Mutant, ...], str]:
    directory = args.mutants_dir
    if directory is None:
        if not os.path.isfile(os.path.join(_DEFAULT_MUTANTS_DIR, "catalogue.py")):
            return (), (f"no mutant catalogue: {_DEFAULT_MUTANTS_DIR}/catalogue.py does not "
                        "exist under the current directory and --mutants-dir was not given")
        directory = _DEFAULT_MUTANTS_DIR
    if not os.path.isfile(os.path.join(directory, "catalogue.py")):
        return (), f"no mutant catalogue: {directory}/catalogue.py does not exist"
    return load_catalogue(directory), f"mutant catalogue {directory}"


def _engine_for(name: str, args: argparse.Namespace) -> Engine:
    if name == Engine().name:
        return Engine()
    mutants, why = _catalogue(args)
    for mutant in mutants:
        if mutant.engine.name == name:
            return mutant.engine
    raise ValueError(f"the replay token names engine {name!r}, which is neither the real "
                     f"engine nor in the catalogue ({why})")


def run(args: argparse.Namespace) -> int:
    if args.replay is not None:
        data = decode_token(args.replay)
        engine = _engine_for(str(data["e"]), args)
        messages = replay(engine, args.replay)
        return 1 if messages else 0
    if args.max_ops < 1:
        raise ValueError("--max-ops must be at least 1")
    models = _MODELS if args.model == "all" else (args.model,)
    bound = BOUNDS[args.bound]
    print(f"crash-test: exploring the installed engine, max_ops={args.max_ops} "
          f"models={','.join(models)} seed={args.seed}")
    print(f"  bound {bound.describe()}")
    report: ExploreReport = explore(Engine(), max_ops=args.max_ops, seed=args.seed,
                                    models=models, bound=bound, seconds=args.seconds,
                                    progress=lambda line: print(line, flush=True),
                                    jobs=max(1, args.jobs))
    print(report.summary())
    for violation in report.violations[:50]:
        print(f"VIOLATION {violation}")
    if len(report.violations) > 50:
        print(f"... and {len(report.violations) - 50} more violations")
    mutants, why = _catalogue(args)
    print(why)
    caught = 0
    for mutant in mutants:
        result = check_mutant(mutant, seed=args.seed, bound=bound, models=models)
        ok = result.caught and not result.real_violations
        caught += 1 if ok else 0
        status = "caught" if result.caught else "NOT CAUGHT"
        print(f"  mutant {mutant.name:<28} {status:<10} ({mutant.caught_by}) "
              f"{result.elapsed_s:.1f}s")
        if result.caught:
            print(f"    e.g. {result.violations[0].splitlines()[0][:300]}")
            for line in result.violations[0].splitlines()[1:2]:
                print(f"    {line.strip()}")
        else:
            print(f"    FAILURE: no check caught {mutant.name}; rerun with: python -m pytest "
                  f"tests/mutants/test_mutants_are_caught.py -k '{mutant.name}'")
        for message in result.real_violations[:3]:
            print(f"    FAILURE: the real engine fails this mutant's check: {message}")
    print(f"crash-test: workloads={report.workloads} crash_points={report.crash_points} "
          f"states={report.states} violations={len(report.violations)} "
          f"mutants_caught={caught}/{len(mutants)}")
    sys.stdout.flush()
    return 1 if report.violations or caught < len(mutants) else 0
