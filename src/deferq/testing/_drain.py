"""``drain``: run everything a queue holds, delayed tasks and retries included, in no wall time.

Rules: the queue must run on a ``ManualClock``. ``drain`` waits until the queue has no
immediate or running work, then advances the clock to the next deadline a sleeper waits
for (a delayed task, a retry, a backpressure wait), and repeats until nothing sleeps and
nothing runs. A task that keeps scheduling work forever would never drain: after
``max_steps`` advances ``DrainError`` says so. ``until`` bounds the clock instead: drain
stops once the next deadline is past it (work due later stays pending).
"""

from __future__ import annotations

from deferq._core.errors import DeferqError
from deferq._runtime.queue import Queue
from deferq.testing._clock import ManualClock, settle


class DrainError(DeferqError):
    """The queue did not drain: work kept coming, or the queue does not run on a ManualClock."""


async def drain(queue: Queue, *, until: float | None = None, max_steps: int = 10_000) -> int:
    """Run every task of ``queue`` that is due, advancing its clock; return the advances made.

    Raises:
        DrainError: the queue's clock is not a ``ManualClock``, or work was still scheduled
            after ``max_steps`` advances of the clock.
    """
    clock = queue.clock
    if not isinstance(clock, ManualClock):
        raise DrainError(f"drain needs a queue built with clock=ManualClock(), not "
                         f"{type(clock).__name__}")
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        raise ValueError(f"max_steps must be an int >= 1, got {max_steps!r}")
    steps = 0
    while True:
        await queue.wait_idle()
        await settle()
        if queue.running or queue.backlog_size:
            continue
        deadline = clock.next_deadline()
        if deadline is None or (until is not None and deadline > until):
            if until is not None and until > clock.time():
                await clock.advance_to(until)
                await queue.wait_idle()
            return steps
        if steps == max_steps:
            raise DrainError(f"the queue still had work scheduled after {max_steps} advances "
                             f"of the clock (now {clock.time():.0f}): a task that keeps "
                             "scheduling work never drains; pass until= or a larger max_steps")
        steps += 1
        await clock.advance_to(deadline)
