"""deferq.testing: a kit to test code that uses deferq, fast and deterministic.

- ``Memory`` (``deferq.backends.memory``): ``Disk``'s checks and semantics in memory; it keeps
  dead tasks (``Nil`` throws them away) and survives a queue restart on the same instance.
- ``ManualClock``: wall time that moves only when the test says so; delays, retries and
  backpressure waits sleep on it.
- ``drain(queue)``: run everything the queue holds, delayed tasks and retries included, by
  advancing its ``ManualClock`` to each next deadline, in no wall time.
- ``pytest_plugin``: fixtures ``deferq_clock``, ``deferq_backend`` and ``deferq_kit``
  (``pytest_plugins = ["deferq.testing.pytest_plugin"]`` in a conftest.py).

Example::

    clock = ManualClock()
    queue = deferq.Queue(Memory(now=clock.time), clock=clock, registry=registry)
    await queue.start()
    queue.enqueue(send_email, "a@example.com", delay=3600)
    await drain(queue)          # the hour passes at once; the task ran
"""

from deferq.backends.memory import Memory
from deferq.testing._clock import ManualClock
from deferq.testing._drain import DrainError, drain
from deferq.testing._kit import TestKit

__all__ = ["DrainError", "ManualClock", "Memory", "TestKit", "drain"]
