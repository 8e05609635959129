"""The queue's commit thread: runs each group commit's fsync off the event loop (Q-20, Q-23),
and on a shared database the queue's writes (``sharedwrites.py``, Q-179..Q-181).

Theory of operation: ``asyncio.to_thread`` would do the same through the loop's default
executor, but on the 2-vCPU VMs this project measures on that round trip cost 50-90 us with
nothing to do (a thread pool's future, its chaining to an asyncio future, a context copy),
about as much as the fsync it carries. One long-lived thread per queue takes the call
from a ``SimpleQueue`` and hands the outcome back with one ``call_soon_threadsafe``.
Commits never overlap (Q-20 allows one at a time), so one thread is enough, and calls run
in the order they were submitted.

The thread starts with the first call and ends when ``close`` is called (the queue's
``stop``) or, as a daemon, with the interpreter. A result for a future that was cancelled
meanwhile, or for a loop that was closed meanwhile, is dropped.
"""

from __future__ import annotations

import asyncio
import functools
import queue
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class Committer:
    """One daemon thread running blocking calls for one event loop, one at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop, name: str) -> None:
        self._loop = loop
        self._name = name
        # Each call bound to its future (``_call``), or None: the thread ends.
        self._calls: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def run(self, call: Callable[[], T]) -> asyncio.Future[T]:
        """Run ``call()`` on the thread; the future gets its outcome on the loop."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
            self._thread.start()
        future: asyncio.Future[T] = self._loop.create_future()
        self._calls.put(functools.partial(_call, self._loop, call, future))
        return future

    def close(self) -> None:
        """Let the thread end once the calls already submitted have run."""
        if self._thread is not None:
            self._calls.put(None)
            self._thread = None

    def _serve(self) -> None:
        while True:
            item = self._calls.get()
            if item is None:
                return
            item()


def _call(loop: asyncio.AbstractEventLoop, call: Callable[[], T], future: asyncio.Future[T]
          ) -> None:
    """On the thread: run ``call`` and hand its outcome to ``future`` on the loop."""
    try:
        value = call()
    except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
        settle = functools.partial(_failed, future, exc)
    else:
        settle = functools.partial(_settle, future, value)
    try:
        loop.call_soon_threadsafe(settle)
    except RuntimeError:
        pass  # the loop was closed meanwhile: nobody awaits the outcome any more


def _settle(future: asyncio.Future[T], value: T) -> None:
    if not future.done():  # (done: cancelled while the call ran)
        future.set_result(value)


def _failed(future: asyncio.Future[T], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
