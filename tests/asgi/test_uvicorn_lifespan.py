"""The queue in an ASGI lifespan, under a real uvicorn: a worker SIGKILLed mid-stream loses no
acknowledged task.

Goal: Q-115 and Q-116 (with Q-59's ``async with``, Q-20's group commit and Q-70's sweep) as a
web service sees them. Method: start real uvicorn processes running
``deferq._demos.asgi_app`` (the example docs/asgi.md shows verbatim) on one storage directory,
either ``uvicorn --workers 2`` or two single-process uvicorns on two ports; POST real HTTP
requests from three threads (half of them with a 2 s delay, so the worker that gets killed
holds due-later tasks in its WAL); SIGKILL the worker process that just answered 202 for a
delayed order; keep sending; then require that every order answered 202 ("acknowledged") was
recorded in the ledger the task appends to, that the ledger holds nothing that was never
sent, SIGTERM the servers and require a clean exit and an empty WAL and dead-task store. A
request that failed (the killed worker's connections) is not acknowledged and is never
counted as lost. Every wait has a deadline and the servers are killed in a ``finally``.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from deferq.backends import Disk

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "src" / "deferq" / "_demos" / "asgi_app.py"
DELAY_S = 2  # a delayed order is due at least 1 s after its 202 (delays are whole seconds)
ACKS_BEFORE_KILL = 20
ACKS_AFTER_KILL = 30
DEADLINE_S = 20.0  # for any one phase; a healthy run takes a few seconds in all


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Server:
    """One uvicorn command: its process, port and log file."""

    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def _start(tmp: Path, name: str, *, workers: int) -> Server:
    port = _free_port()
    log = tmp / f"{name}.log"
    env = {**os.environ, "DEFERQ_PATH": str(tmp / "storage"),
           "ORDERS_LEDGER": str(tmp / "ledger.txt"), "DEFERQ_SWEEP_INTERVAL": "0.2",
           "PYTHONPATH": str(ROOT / "src")}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "deferq._demos.asgi_app:app", "--host",
             "127.0.0.1", "--port", str(port), "--workers", str(workers)],
            cwd=tmp, env=env, stdout=out, stderr=subprocess.STDOUT)
    return Server(proc, port, log)


def _request(port: int, method: str, path: str, body: object = None,
             timeout_s: float = 5.0) -> tuple[int, dict[str, object]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        data = None if body is None else json.dumps(body).encode()
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def _wait_ready(server: Server, workers: int) -> None:
    """Until every worker of ``server`` finished its lifespan startup (its log says so)."""
    deadline = time.monotonic() + DEADLINE_S
    while server.log_text().count("Application startup complete.") < workers:
        if server.proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"uvicorn did not start:\n{server.log_text()}")
        time.sleep(0.05)
    # A single uvicorn process binds its socket after the lifespan startup, so the first
    # requests may be refused.
    while True:
        try:
            status, _ = _request(server.port, "GET", "/health")
            break
        except ConnectionRefusedError:
            if server.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"uvicorn never listened:\n{server.log_text()}") from None
            time.sleep(0.05)
    assert status == 200


@dataclass
class Traffic:
    """Orders sent by a few threads, round-robin over the ports, until told to stop."""

    ports: list[int]
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)
    sent: list[str] = field(default_factory=list)
    acked: dict[str, int] = field(default_factory=dict)  # order id -> pid that answered 202
    acked_delayed: list[tuple[str, int]] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # an unexpected answer (not a refusal)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self, count: int) -> None:
        for n in range(count):
            thread = threading.Thread(target=self._send, args=(n,), daemon=True)
            thread.start()
            self.threads.append(thread)

    def _send(self, sender: int) -> None:
        i = 0
        while not self.stop.is_set() and i < 2000:
            order_id = f"o{sender}-{i}"
            delay_s = DELAY_S if i % 2 else 0
            port = self.ports[i % len(self.ports)]
            i += 1
            with self.lock:
                self.sent.append(order_id)
            try:
                status, body = _request(port, "POST", "/orders",
                                        {"order_id": order_id, "delay_s": delay_s})
            except (OSError, http.client.HTTPException):
                with self.lock:
                    self.failed.append(order_id)  # not acknowledged: may or may not run
                time.sleep(0.01)
                continue
            with self.lock:
                if status != 202 or not isinstance(body.get("pid"), int):
                    self.errors.append(f"{order_id}: {status} {body}")
                    continue
                pid = body["pid"]
                assert isinstance(pid, int)
                self.acked[order_id] = pid
                if delay_s:
                    self.acked_delayed.append((order_id, pid))

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(10)
            assert not thread.is_alive(), "a sender thread hung"

    def wait(self, predicate: object, what: str) -> None:
        assert callable(predicate)
        deadline = time.monotonic() + DEADLINE_S
        while True:
            with self.lock:
                if predicate():
                    return
                assert not self.errors, self.errors
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.01)


def _children(pid: int) -> list[int]:
    """The child processes of ``pid`` (Linux /proc), e.g. uvicorn's workers."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(c) for c in text.split()]


def _ledger(tmp: Path) -> list[tuple[str, int]]:
    path = tmp / "ledger.txt"
    if not path.exists():
        return []
    runs = []
    for line in path.read_text().splitlines():
        match = re.fullmatch(r"(o\d+-\d+) (\d+)", line)
        assert match, f"a torn or foreign ledger line: {line!r}"
        runs.append((match[1], int(match[2])))
    return runs


def _run_scenario(tmp: Path, *, two_servers: bool) -> None:
    servers = ([_start(tmp, "a", workers=1), _start(tmp, "b", workers=1)] if two_servers
               else [_start(tmp, "uvicorn", workers=2)])
    traffic = Traffic([s.port for s in servers])
    try:
        for server in servers:
            _wait_ready(server, 1 if two_servers else 2)
        traffic.start(3)
        # Kill the worker that just acknowledged a delayed order: that order is in its WAL
        # and not due for at least a second, so only another worker can run it.
        traffic.wait(lambda: len(traffic.acked) >= ACKS_BEFORE_KILL and traffic.acked_delayed,
                     "acknowledged orders before the kill")
        with traffic.lock:
            victim = traffic.acked_delayed[-1][1]
            os.kill(victim, signal.SIGKILL)
            orphaned = [o for o, pid in traffic.acked_delayed if pid == victim]
            acked_at_kill = len(traffic.acked)
        traffic.wait(lambda: sum(pid != victim for pid in traffic.acked.values())
                     >= ACKS_AFTER_KILL and len(traffic.acked) >= acked_at_kill + ACKS_AFTER_KILL,
                     "acknowledged orders after the kill")
        traffic.finish()
        # every acknowledged order ran, also those only the
        # killed worker held (its WAL adopted by a survivor's sweep, or by uvicorn's
        # replacement worker at its start).
        deadline = time.monotonic() + DEADLINE_S
        while set(traffic.acked) - {o for o, _ in _ledger(tmp)}:
            assert time.monotonic() < deadline, (
                f"acknowledged orders never ran: "
                f"{sorted(set(traffic.acked) - {o for o, _ in _ledger(tmp)})[:10]}")
            time.sleep(0.05)
        runs = _ledger(tmp)
        assert {o for o, _ in runs} <= set(traffic.sent), "the ledger holds an order never sent"
        ran_by = {o: pid for o, pid in runs}
        assert orphaned and all(ran_by[o] != victim for o in orphaned[-1:]), (
            "the killed worker's last delayed order must have run in another process")
        if two_servers:  # no replacement worker: the survivor's sweep adopted it
            survivor = next(s for s in servers if s.proc.pid != victim)
            assert all(ran_by[o] == survivor.proc.pid for o in orphaned[-1:])
        # SIGTERM -> lifespan shutdown -> queue.stop; exit 0; nothing left pending.
        for server in servers:
            if server.proc.poll() is None:
                server.proc.send_signal(signal.SIGTERM)
        for server in servers:
            code = server.proc.wait(DEADLINE_S)
            if server.proc.pid == victim:
                assert code == -signal.SIGKILL
            else:
                # uvicorn's supervisor exits 0; a single-process uvicorn re-raises the
                # SIGTERM it caught once its shutdown is complete (uvicorn's Server.
                # capture_signals), so a clean exit is death by that signal.
                assert code == (-signal.SIGTERM if two_servers else 0), server.log_text()
                log = server.log_text()
                assert "Traceback" not in log and "ERROR" not in log, log
                assert "Application shutdown complete." in log, log
                for pid in {p for p in traffic.acked.values() if p != victim}:
                    if two_servers or f"process [{pid}]" in log:
                        assert f"Finished server process [{pid}]" in log, log
    finally:
        traffic.stop.set()
        for server in servers:
            if server.proc.poll() is None:  # a failed run: its workers first, then uvicorn
                for pid in _children(server.proc.pid):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                server.proc.kill()
                server.proc.wait(10)
    with Disk(path=tmp / "storage") as disk:  # claims any WAL left behind: there is none
        assert disk.pending_tasks() == []
        assert disk.list_dead_tasks(limit=10) == []
    print(f"sent={len(traffic.sent)} acked={len(traffic.acked)} failed={len(traffic.failed)} "
          f"runs={len(runs)} orphaned_delayed={len(orphaned)}")


@pytest.mark.spec("Q-115", "Q-116", "Q-59", "Q-70")
def test_uvicorn_workers_2_sigkill_one_every_acknowledged_order_runs(tmp_path: Path) -> None:
    _run_scenario(tmp_path, two_servers=False)


@pytest.mark.spec("Q-115", "Q-116", "Q-70")
def test_two_uvicorns_on_one_directory_the_survivors_sweep_runs_the_killed_ones_orders(
        tmp_path: Path) -> None:
    _run_scenario(tmp_path, two_servers=True)


@pytest.mark.spec("Q-115")
def test_the_docs_show_the_example_app_verbatim() -> None:
    doc = (ROOT / "docs" / "asgi.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, flags=re.S)
    assert APP.read_text() in blocks, "docs/asgi.md must show src/deferq/_demos/asgi_app.py"


@pytest.mark.spec("Q-115")
def test_a_bad_sweep_interval_stops_uvicorn_naming_the_variable(tmp_path: Path) -> None:
    env = {**os.environ, "DEFERQ_PATH": str(tmp_path / "storage"),
           "DEFERQ_SWEEP_INTERVAL": "soon", "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(
        [sys.executable, "-m", "uvicorn", "deferq._demos.asgi_app:app", "--host", "127.0.0.1",
         "--port", str(_free_port())],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=DEADLINE_S)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "DEFERQ_SWEEP_INTERVAL must be a number of seconds, got 'soon'")
    assert "Traceback" not in done.stderr


@pytest.mark.spec("Q-171")
def test_the_example_acknowledges_an_order_only_once_it_survives_a_power_loss(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # docs/asgi.md promises that adefer returned only after a group commit: that holds only on a
    # power-safe Disk (fsync_frequency=0). Disk's own default (0.5 s) acknowledges a task a
    # power loss can still take, which this test caught in the example.
    import asyncio

    from deferq._demos import asgi_app

    monkeypatch.setattr(asgi_app, "STORAGE", str(tmp_path / "storage"))

    async def main() -> None:
        async with asgi_app.lifespan(asgi_app.app):
            queue = asgi_app.app.state.queue
            assert isinstance(queue.backend, Disk)
            assert queue.backend.fsync_frequency == 0 and queue.backend.group_commit

    asyncio.run(main())
