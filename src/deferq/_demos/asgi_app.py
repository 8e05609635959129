"""A Starlette service whose lifespan runs a deferq queue (docs/asgi.md shows this file).

Run it with ``DEFERQ_PATH=storage ORDERS_LEDGER=ledger.txt uvicorn
deferq._demos.asgi_app:app --workers 2``. Every worker process opens its own ``Disk`` on
the one storage directory (its own WAL) and its own queue; a worker that dies leaves its WAL
to the others' adoption sweep (spec/queue.md Q-70), so an order the service answered 202 for
runs even when the worker that took it is killed. Starlette and uvicorn are not deferq
dependencies: this module is a tool (docs/architecture.md), imported by no library module,
and tests/asgi runs it under a real uvicorn.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import deferq
from deferq.backends import Disk


def env_seconds(name: str, default: float) -> float:
    """A number of seconds from the environment; a bad value stops the start, naming it."""
    text = os.environ.get(name)
    try:
        return default if text is None else float(text)
    except ValueError:
        raise SystemExit(f"{name} must be a number of seconds, got {text!r}") from None


TASKS = deferq.TaskRegistry()
STORAGE = os.environ.get("DEFERQ_PATH", "storage")
LEDGER = os.environ.get("ORDERS_LEDGER", "ledger.txt")
SWEEP_INTERVAL_S = env_seconds("DEFERQ_SWEEP_INTERVAL", 2.0)  # how often orphans are adopted


@deferq.task(name="orders.record", registry=TASKS)
def record_order(order_id: str) -> None:
    """The work: one line per execution, appended (O_APPEND) by whichever worker runs it."""
    fd = os.open(LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{order_id} {os.getpid()}\n".encode())
    finally:
        os.close(fd)


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    # This worker's WAL, power-safe: with fsync_frequency=0 adefer waits for a group commit
    # (Disk's default, 0.5 s, would acknowledge tasks a power loss can still take).
    disk = Disk(path=STORAGE, fsync_frequency=0)
    try:
        # start() replays what this worker's WAL holds; leaving the block (uvicorn got
        # SIGTERM) runs stop(): running tasks finish, the rest stays in the WAL.
        async with deferq.Queue(disk, registry=TASKS,
                                sweep_interval=SWEEP_INTERVAL_S) as queue:
            app.state.queue = queue
            yield
    finally:
        disk.close()


async def create_order(request: Request) -> JSONResponse:
    try:
        body = await request.json()
        order_id, delay_s = body["order_id"], body.get("delay_s", 0)
        if not isinstance(order_id, str):
            raise TypeError("order_id must be a string")
        task = record_order.options(delay=delay_s)  # ValueError for a bad delay
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return JSONResponse({"error": f'expected {{"order_id": str, "delay_s": seconds}}: {exc}'},
                            status_code=400)
    queue: deferq.Queue = request.app.state.queue
    # adefer returns once a group commit made the task durable: only then is it acknowledged.
    task_id = await queue.adefer(task, order_id)
    return JSONResponse({"task_id": task_id, "pid": os.getpid()}, status_code=202)


async def health(request: Request) -> JSONResponse:
    return JSONResponse({"pid": os.getpid()})


app = Starlette(routes=[Route("/orders", create_order, methods=["POST"]),
                        Route("/health", health)], lifespan=lifespan)
