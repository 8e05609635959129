"""``deferq crash-test``: bounded-exhaustive crash exploration and the mutant catalogue.

Runs ``deferq.crashtest._explore.explore`` against the installed engine, then checks every
mutant of the catalogue (``deferq.crashtest.catalogue``, which ships with the package, or
``--mutants-dir``) is caught while the real engine passes the same checks. The last line of
the output is always::

    crash-test: workloads=W crash_points=P states=S violations=V mutants_caught=K/M complete=C

The exit status is 1 when V > 0 or K < M, 3 when nothing failed but the run was incomplete
(it stopped on its time budget, or checked no mutant: each said on an ``INCOMPLETE`` line and
as ``complete=no``), and 0 only for a complete, clean run. Every failure prints a one-line
replay command; ``--replay TOKEN`` reruns one case verbosely.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from deferq.crashtest._crashengine import Engine
from deferq.crashtest._explore import BOUNDS, explore
from deferq.crashtest._explorereport import ExploreReport, decode_token
from deferq.crashtest._mutants import Mutant, check_mutant, load_catalogue
from deferq.crashtest._replay import replay

EXIT_INCOMPLETE = 3  # deferq._cli.crash documents it


def _catalogue(args: argparse.Namespace) -> tuple[tuple[Mutant, ...], str]:
    """The built-in catalogue (it ships in the wheel), or the one ``--mutants-dir`` names."""
    directory = args.mutants_dir
    if directory is None:
        from deferq.crashtest.catalogue import MUTANTS  # noqa: PLC0415 - imports the engine's internals

        return MUTANTS, "mutant catalogue deferq.crashtest.catalogue (built in)"
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


def _progress_printer() -> Callable[[str], None] | None:
    """Progress lines on a terminal; none when the output is piped (the summary always)."""
    if not sys.stdout.isatty():
        return None
    return lambda line: print(line, flush=True)


def run(args: argparse.Namespace) -> int:
    if args.replay is not None:
        data = decode_token(args.replay)
        engine = _engine_for(str(data["e"]), args)
        messages = replay(engine, args.replay)
        return 1 if messages else 0
    if args.max_ops < 1:
        raise ValueError("--max-ops must be at least 1")
    models: tuple[str, ...] = args.models  # resolved from --model by deferq._cli.crash
    bound = BOUNDS[args.bound]
    print(f"crash-test: exploring the installed engine, max_ops={args.max_ops} "
          f"models={','.join(models)} seed={args.seed}")
    print(f"  bound {bound.describe()}")
    report: ExploreReport = explore(Engine(), max_ops=args.max_ops, seed=args.seed,
                                    models=models, bound=bound, seconds=args.seconds,
                                    progress=_progress_printer(),
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
            print(f"    FAILURE: no check caught {mutant.name}, which breaks: {mutant.breaks}")
        for message in result.real_violations[:3]:
            print(f"    FAILURE: the real engine fails this mutant's check: {message}")
    incomplete = []
    if report.stopped_early:
        incomplete.append(f"the exploration stopped early ({report.stopped_early})")
    if not mutants:
        incomplete.append("no mutant was checked, so nothing shows the checks can fail")
    for reason in incomplete:
        print(f"crash-test: INCOMPLETE: {reason}")
    print(f"crash-test: workloads={report.workloads} crash_points={report.crash_points} "
          f"states={report.states} violations={len(report.violations)} "
          f"mutants_caught={caught}/{len(mutants)} complete={'no' if incomplete else 'yes'}")
    sys.stdout.flush()
    if report.violations or caught < len(mutants):
        return 1
    return EXIT_INCOMPLETE if incomplete else 0
