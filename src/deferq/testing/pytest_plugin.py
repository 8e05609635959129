"""pytest fixtures for tests of code that uses deferq (opt in from a conftest.py)::

    pytest_plugins = ["deferq.testing.pytest_plugin"]

- ``deferq_clock``: a fresh ``ManualClock``;
- ``deferq_backend``: a fresh ``Memory`` backend on that clock;
- ``deferq_kit``: a ``TestKit`` (its own clock and backend; ``kit.queue()``, ``kit.drain()``).

The fixtures are plain (not async), so they work with any async test runner.
"""

from __future__ import annotations

import pytest

from deferq.backends.memory import Memory
from deferq.testing._clock import ManualClock
from deferq.testing._kit import TestKit


@pytest.fixture
def deferq_clock() -> ManualClock:
    """A ``ManualClock`` at a fixed epoch second."""
    return ManualClock()


@pytest.fixture
def deferq_backend(deferq_clock: ManualClock) -> Memory:
    """A ``Memory`` backend whose dead tasks take their time from ``deferq_clock``."""
    return Memory(now=deferq_clock.time)


@pytest.fixture
def deferq_kit() -> TestKit:
    """A ``TestKit``: build queues with ``kit.queue()``, run them with ``await kit.drain(q)``."""
    return TestKit()
