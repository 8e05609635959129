"""The queue's commit thread (deferq._runtime.committer): off the loop, in order, outcomes delivered."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest

from deferq._runtime.committer import Committer


@pytest.mark.spec("Q-20", "Q-23", "Q-145")
def test_calls_run_in_order_on_one_thread_that_is_not_the_loops() -> None:
    ran: list[tuple[int, str]] = []

    async def main() -> None:
        committer = Committer(asyncio.get_running_loop(), "test-commit")
        def note(n: int) -> Callable[[], None]:
            return lambda: ran.append((n, threading.current_thread().name))

        futures = [committer.run(note(n)) for n in range(5)]
        await asyncio.gather(*futures)
        committer.close()

    asyncio.run(main())
    assert [n for n, _ in ran] == [0, 1, 2, 3, 4]
    assert {name for _, name in ran} == {"test-commit"} != {threading.current_thread().name}


@pytest.mark.spec("Q-20")
def test_a_failed_call_raises_in_the_awaiting_coroutine_and_the_next_call_still_runs() -> None:
    def fail() -> None:
        raise OSError(5, "fsync failed")

    async def main() -> tuple[BaseException | None, BaseException | None]:
        committer = Committer(asyncio.get_running_loop(), "test-commit")
        try:
            return await asyncio.gather(committer.run(fail), committer.run(lambda: None),
                                        return_exceptions=True)
        finally:
            committer.close()

    failed, succeeded = asyncio.run(main())
    assert isinstance(failed, OSError) and failed.errno == 5
    assert succeeded is None


def test_a_cancelled_wait_drops_the_outcome_and_close_ends_the_thread() -> None:
    release = threading.Event()
    ran: list[str] = []

    def slow_call() -> None:
        release.wait(5)
        ran.append("slow")

    async def main() -> Committer:
        committer = Committer(asyncio.get_running_loop(), "test-commit")
        slow = committer.run(slow_call)
        slow.cancel()  # as when the commit's task is cancelled: the call still runs
        after = committer.run(lambda: ran.append("after"))
        release.set()
        await after
        assert slow.cancelled()
        thread = committer._thread
        committer.close()
        assert thread is not None
        await asyncio.to_thread(thread.join, 5)
        assert not thread.is_alive()
        return committer

    asyncio.run(main())
    assert ran == ["slow", "after"]


def test_an_outcome_for_a_closed_loop_is_dropped_without_an_error() -> None:
    loop = asyncio.new_event_loop()
    release = threading.Event()
    done = threading.Event()
    def slow_call() -> None:
        release.wait(5)
        done.set()

    committer = Committer(loop, "test-commit")
    committer.run(slow_call)
    thread = committer._thread
    committer.close()
    loop.close()  # before the call ends: its call_soon_threadsafe finds a closed loop
    release.set()
    assert thread is not None
    thread.join(5)
    assert done.is_set() and not thread.is_alive()
