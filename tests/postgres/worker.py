"""A worker process for the PostgreSQL tests: a real ``Queue`` on a real ``Postgres`` in its own
interpreter, so that SIGKILL and SIGTERM behave as in production.

``python -m tests.postgres.worker DSN SCHEMA LEDGER`` starts a queue (lease 1 s, poll 50 ms)
that runs ``pg.Ledgered`` tasks: each execution appends ``KEY PID`` to LEDGER (one ``write``
of one line, O_APPEND, so concurrent workers never interleave) before it returns. The worker
prints ``ready`` once started and stops gracefully on SIGTERM (printing ``stopped``).

``pg.Slow(key, fail_pid)`` (for the SIGSTOP test, P-41) appends ``start KEY PID``, sleeps 2 s,
then in the process ``fail_pid`` raises (``max_retries=0``: it gives up at once), anywhere
else appends ``end KEY PID``. With a fourth argument N the worker runs N tasks at a time.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import deferq
from deferq.backends import Postgres

REG = deferq.TaskRegistry()
LEDGER_FD = -1


class Ledgered(deferq.Task, name="pg.Ledgered", registry=REG):
    async def perform(self, key: str) -> None:
        await asyncio.sleep(0.05)  # with max_concurrency=2: 60 tasks take >= 1.5 s
        os.write(LEDGER_FD, f"{key} {os.getpid()}\n".encode())


class Slow(deferq.Task, name="pg.Slow", registry=REG):
    max_retries = 0

    async def perform(self, key: str, fail_pid: int) -> None:
        os.write(LEDGER_FD, f"start {key} {os.getpid()}\n".encode())
        await asyncio.sleep(2)
        if os.getpid() == fail_pid:
            raise RuntimeError(f"{key} fails in {fail_pid}")
        os.write(LEDGER_FD, f"end {key} {os.getpid()}\n".encode())


async def serve(dsn: str, schema: str, concurrency: int) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    with Postgres(dsn=dsn, schema=schema, lease_seconds=1, poll_seconds=0.05) as backend:
        # Two at a time, so that a test can kill a worker while it still holds claimed tasks
        # (60 tasks take >= 1.5 s, however fast the database answers).
        queue = deferq.Queue(backend, registry=REG, max_concurrency=concurrency)
        await queue.start()
        print("ready", flush=True)
        await stop.wait()
        await queue.stop(10)
    print("stopped", flush=True)


def main() -> None:
    global LEDGER_FD
    dsn, schema, ledger = sys.argv[1:4]
    LEDGER_FD = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    asyncio.run(serve(dsn, schema, int(sys.argv[4]) if len(sys.argv) > 4 else 2))


if __name__ == "__main__":
    main()
