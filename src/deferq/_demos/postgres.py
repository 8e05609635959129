"""The PostgreSQL demo: two worker processes sharing one throwaway database (issue 19).

``python -m deferq._demos.postgres`` starts a throwaway PostgreSQL cluster (initdb in a temporary
directory, as the unprivileged user ``nobody`` when run as root, on a Unix socket only), starts
two worker processes (``python -m deferq._demos.postgres worker DSN``), each a ``Queue`` on its
own ``Postgres`` backend, then enqueues tasks from this process, which runs no queue: the
workers split them. One task fails once and is retried; one always fails and is given up into
the dead-task store; ``deferq --dsn ... dead list`` then shows it. When no PostgreSQL server
binaries are installed it says so and exits 0, having done nothing.
"""

from __future__ import annotations

import asyncio
import collections
import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import deferq
from deferq.backends import Postgres

SCHEMA = "demo"
REG = deferq.TaskRegistry()
TASKS = 12


class Greet(deferq.Task, name="demo.Greet", registry=REG):
    async def perform(self, who: str) -> None:
        await asyncio.sleep(0.05)  # long enough that both workers get a share
        print(f"ran Greet({who})", flush=True)


class Flaky(deferq.Task, name="demo.Flaky", registry=REG):
    max_retries = 2

    def perform(self, marker: str) -> None:
        if not os.path.exists(marker):
            open(marker, "w", encoding="utf-8").close()
            print("Flaky failed once (will be retried)", flush=True)
            raise ConnectionError("the mail server hung up")
        print("ran Flaky on its retry", flush=True)

    def retry_interval(self, exception: BaseException, attempt: int) -> object:
        return 0


class Doomed(deferq.Task, name="demo.Doomed", registry=REG):
    max_retries = 1

    def perform(self, order: str) -> None:
        print(f"Doomed({order}) failed", flush=True)
        raise ValueError(f"{order} has no address")

    def retry_interval(self, exception: BaseException, attempt: int) -> object:
        return 0


def bin_dir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def server(binaries: Path, root: Path, *argv: str) -> None:
    user = "nobody" if os.geteuid() == 0 else None
    done = subprocess.run([str(binaries / argv[0]), *argv[1:]], user=user, cwd=root,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise RuntimeError(f"{argv[0]} failed ({done.returncode}): {done.stderr.strip()}")


async def serve(dsn: str, name: str) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    with Postgres(dsn=dsn, schema=SCHEMA, lease_seconds=5, poll_seconds=0.05) as backend:
        queue = deferq.Queue(backend, registry=REG, max_concurrency=2)
        await queue.start()
        print("ready", flush=True)
        await stop.wait()
        await queue.stop(10)


def worker(dsn: str, name: str) -> None:
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    asyncio.run(serve(dsn, name))


def run(binaries: Path) -> int:
    root = Path(tempfile.mkdtemp(prefix="deferq-demo-pg-",
                                 dir="/tmp" if os.geteuid() == 0 else None))
    if os.geteuid() == 0:
        shutil.chown(root, user="nobody")
    data, log = root / "data", root / "server.log"
    dsn = f"host={root} port=5432 user=deferq dbname=postgres"
    workers: list[subprocess.Popen[str]] = []
    started = False
    try:
        server(binaries, root, "initdb", "-D", str(data), "-U", "deferq", "--auth=trust",
               "--no-sync", "-E", "UTF8", "--locale=C")
        with open(data / "postgresql.conf", "a", encoding="utf-8") as conf:
            conf.write(f"\nlisten_addresses = ''\nunix_socket_directories = '{root}'\n")
        server(binaries, root, "pg_ctl", "-D", str(data), "-l", str(log), "-w", "start")
        started = True
        print(f"== a throwaway PostgreSQL in {root}; two worker processes share it")
        Postgres(dsn=dsn, schema=SCHEMA, create_schema=True).close()
        for name in ("worker-1", "worker-2"):
            proc = subprocess.Popen([sys.executable, "-m", "deferq._demos.postgres", "worker",
                                     dsn, name], stdout=subprocess.PIPE, text=True)
            if proc.stdout is None or proc.stdout.readline().strip() != "ready":
                raise RuntimeError(f"{name} did not start")
            workers.append(proc)
        marker = str(root / "flaky-failed-once")
        with Postgres(dsn=dsn, schema=SCHEMA) as producer:
            queue = deferq.Queue(producer, registry=REG)  # enqueues only: never started
            for i in range(TASKS):
                queue.enqueue(Greet, f"guest-{i}")
            queue.enqueue(Flaky, marker)
            queue.enqueue(Doomed, "order-17")
            deadline = time.monotonic() + 30
            while producer.list_pending() or not producer.list_dead_tasks():
                if time.monotonic() > deadline:
                    raise RuntimeError("the workers did not finish within 30 s")
                time.sleep(0.05)
        outputs = []
        for proc in workers:
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=20)
            outputs.append(out)
        ran: collections.Counter[str] = collections.Counter()
        for index, (proc, out) in enumerate(zip(workers, outputs)):
            name = f"worker-{index + 1}"
            print(f"-- {name} (pid {proc.pid}):")
            for line in out.splitlines():
                print(f"   {line}")
                ran[name] += line.startswith("ran ")
        print(f"== tasks split across the workers: {dict(ran)}")
        print("== deferq --dsn ... dead list")
        sys.stdout.flush()
        cli = subprocess.run([sys.executable, "-m", "deferq", "dead", "list", "--dsn", dsn,
                              "--schema", SCHEMA], capture_output=True, text=True, timeout=30)
        print(cli.stdout.rstrip())
        if cli.returncode != 0:
            raise RuntimeError(f"deferq dead list failed: {cli.stderr.strip()}")
        return 0
    finally:
        for proc in workers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if started:
            server(binaries, root, "pg_ctl", "-D", str(data), "-m", "fast", "-w", "stop")
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str]) -> int:
    if argv[:1] == ["worker"] and len(argv) == 3:
        worker(argv[1], argv[2])
        return 0
    binaries = bin_dir()
    if binaries is None:
        print("PostgreSQL demo skipped: no PostgreSQL server binaries (initdb, pg_ctl) found; "
              "install the postgresql package (scripts/setup.sh does) to run it.")
        return 0
    try:
        import psycopg  # noqa: F401
    except ImportError:
        print("PostgreSQL demo skipped: psycopg is not installed (pip install 'deferq[postgres]').")
        return 0
    return run(binaries)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
