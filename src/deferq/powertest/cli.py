"""``deferq power-test``: real SIGKILLs and power cuts on a loop-mounted ext4 image.

The command checks that it runs as root with loop devices and the tools it
needs (exit 2 with a message otherwise), re-executes itself inside a private
mount namespace (``unshare -m --propagation private``) so no mount can leak,
runs the fault loop of ``deferq.powertest`` and prints, as its LAST line,
``power-test: cycles=C kills=K power_cuts=P acknowledged=A violations=V``.
Exit status: 0 with no violation, 1 with violations, 2 when the machine cannot
run it. ``deferq._cli.power`` registers the subcommand and imports this module only
when it runs.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys

from deferq.powertest._fs import (
    NAMESPACE_ENV,
    MountError,
    in_private_namespace,
    missing_requirements,
    namespace_command,
)

EXIT_UNSUPPORTED = 2
VIOLATIONS_SHOWN = 20


def power_test(args: argparse.Namespace) -> int:
    """The handler: check the machine, enter a private mount namespace, run, summarize."""
    if args.cycles < 1:
        print("power-test: --cycles must be at least 1", file=sys.stderr)
        return EXIT_UNSUPPORTED
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "big")
    problem = missing_requirements()
    if problem is not None:
        print(problem, file=sys.stderr)
        print("power-test: cycles=0 kills=0 power_cuts=0 acknowledged=0 violations=0")
        return EXIT_UNSUPPORTED
    if not in_private_namespace():
        argv = [sys.executable, "-m", "deferq", "power-test", "--cycles", str(args.cycles),
                "--seed", str(seed), "--fs", args.fs, "--workers", args.workers]
        argv += ["--log", args.log] if args.log else []
        argv += ["--evidence", args.evidence] if args.evidence else []
        argv += ["--quiet"] if args.quiet else []
        env = dict(os.environ, **{NAMESPACE_ENV: "1"})
        sys.stdout.flush()
        probe = subprocess.run(namespace_command(["true"]), capture_output=True, text=True,
                               check=False)
        if probe.returncode != 0:
            print(f"power-test: cannot create a private mount namespace (needs CAP_SYS_ADMIN): "
                  f"{probe.stderr.strip()}", file=sys.stderr)
            print("power-test: cycles=0 kills=0 power_cuts=0 acknowledged=0 violations=0")
            return EXIT_UNSUPPORTED
        try:
            return subprocess.run(namespace_command(argv), env=env, check=False).returncode
        except OSError as exc:
            print(f"power-test: cannot start unshare: {exc}", file=sys.stderr)
            return EXIT_UNSUPPORTED
    return _run_inside(args, seed)


def _run_inside(args: argparse.Namespace, seed: int) -> int:
    from deferq.powertest import PowerConfig, run_power_test

    # Stop cleanly on SIGTERM or SIGINT (even when started with SIGINT ignored, as a
    # background job is): the harness's finally blocks unmount and delete the image.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    # The engine warns about every torn tail it repairs and every write that fails after a
    # power cut: expected here by the thousand. The harness counts those itself.
    logging.getLogger("deferq").setLevel(logging.ERROR)
    quiet = bool(args.quiet)
    if not quiet:
        print(f"power-test: {args.cycles} cycles on a fresh {args.fs} image, seed {seed}, "
              f"{args.workers} workers", flush=True)
    config = PowerConfig(cycles=args.cycles, seed=seed, fs=args.fs, workers=args.workers,
                         log_path=args.log, evidence_dir=args.evidence,
                         progress=None if quiet or not sys.stdout.isatty() else sys.stdout)
    try:
        summary = run_power_test(config)
    except KeyboardInterrupt:
        print("power-test: interrupted; the image was unmounted and deleted", file=sys.stderr)
        return 130
    except MountError as exc:
        print(f"power-test: cannot create or mount the test filesystem (needs root with "
              f"CAP_SYS_ADMIN and a loop device): {exc}", file=sys.stderr)
        print("power-test: cycles=0 kills=0 power_cuts=0 acknowledged=0 violations=0")
        return EXIT_UNSUPPORTED
    for violation in summary.violations[:VIOLATIONS_SHOWN]:
        print(f"VIOLATION {violation}")
    if len(summary.violations) > VIOLATIONS_SHOWN:
        print(f"... and {len(summary.violations) - VIOLATIONS_SHOWN} more")
    print(f"power-test: image {summary.workdir} (removed)")
    if not quiet:
        print(summary.details())
        print(f"  reproduce with: deferq power-test --cycles {args.cycles} --seed {seed} "
              f"--workers {args.workers}")
    print(summary.line(), flush=True)
    return 1 if summary.violations else 0
