"""The bounded thread pool a plain (sync) ``perform`` runs in (spec/queue.md Q-38).

Rules:
- A plain ``perform`` of a task that is not ``inline`` runs in this pool, so it never
  blocks the event loop; at most ``threads`` of them run at once (and at most
  ``max_concurrency`` executions of any kind, Q-37).
- The pool is created by its first use and shut down by ``stop``: work not begun is
  dropped (its task stays in the WAL), and no thread is waited for, since a thread cannot
  be stopped: a perform still running goes on, and its outcome is never recorded (Q-38).
- Each call runs in a copy of the ``contextvars`` context it was submitted from, as
  ``asyncio.to_thread`` does.

Theory of operation: ``concurrent.futures.ThreadPoolExecutor`` behind
``loop.run_in_executor``; the asyncio future it returns is what the execution awaits.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
from collections.abc import Callable
from typing import Final

THREAD_NAME_PREFIX: Final = "deferq-sync"


class SyncPool:
    """A lazily started, bounded pool of threads for plain performs."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._closed = False

    def submit(self, loop: asyncio.AbstractEventLoop, call: Callable[[], object]
               ) -> asyncio.Future[object]:
        """Run ``call()`` in a thread of the pool: its future on ``loop``."""
        pool = self._pool
        if pool is None:
            if self._closed:
                raise RuntimeError("the queue's thread pool was shut down by stop()")
            pool = self._pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=self.threads, thread_name_prefix=THREAD_NAME_PREFIX)
        return loop.run_in_executor(pool, contextvars.copy_context().run, call)

    def shutdown(self) -> None:
        """Implements Q-38 for ``stop``: drop the work not begun, wait for no thread."""
        self._closed = True
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
