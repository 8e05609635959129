"""``TestKit``: a ``Memory`` backend, a ``ManualClock`` and a registry, wired together."""

from __future__ import annotations

import random
from collections.abc import Iterable

from deferq._runtime.backpressure import Backpressure
from deferq._runtime.hooks import Hooks
from deferq._runtime.queue import Queue
from deferq._runtime.task import TaskRegistry
from deferq.backends.memory import Memory
from deferq.testing._clock import ManualClock
from deferq.testing._drain import drain


class TestKit:
    """What a test of code that enqueues tasks needs: build queues, run them dry, look inside.

    ``queue()`` builds an unstarted ``Queue`` over the kit's backend and clock (a seeded
    random source, so retry backoff is repeatable); start it with ``await queue.start()``.
    A second queue on the same kit replays what the first left pending.
    """

    __test__ = False  # not a pytest test class, despite its name

    def __init__(self, *, registry: TaskRegistry | None = None, seed: int = 0) -> None:
        self.clock = ManualClock()
        self.backend = Memory(now=self.clock.time)
        self.registry = registry
        self.seed = seed

    def queue(self, *, backpressure: Backpressure | None = None,
              hooks: Iterable[Hooks] = ()) -> Queue:
        """A new, unstarted queue over this kit's backend and clock (with ``hooks``, Q-100)."""
        return Queue(self.backend, registry=self.registry, clock=self.clock,
                     rng=random.Random(self.seed), backpressure=backpressure, hooks=hooks)

    async def drain(self, queue: Queue, *, until: float | None = None) -> int:
        """``deferq.testing.drain(queue, until=until)``."""
        return await drain(queue, until=until)
