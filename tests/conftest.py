"""Shared fixtures for the deferq test suite.

Goal: keep every test hermetic. Method: each test gets its own storage
directory under pytest's ``tmp_path``; Hypothesis profiles bound run time so
the full suite stays well inside CI's budget (``HYPOTHESIS_PROFILE=soak`` for long runs).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

pytest_plugins = ["pytester"]

settings.register_profile(
    "ci", max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "soak", max_examples=5000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def storage(tmp_path: Path) -> Path:
    """A storage directory path that does not exist yet (Disk creates it)."""
    return tmp_path / "storage"


@pytest.fixture(autouse=True)
def _fresh_id_sources() -> object:
    """Each test starts with fresh per-process id sources (W-28).

    Why: the id source is one per process, and a test that opens a store holding a seed near
    2^63 - 1 (the corpus's edge cases, the bound tests) raises it for good; under xdist the
    next test in that worker could then generate no id at all. A real process keeps its
    source for its whole life, which is what W-28 requires.
    """
    from deferq._engine import ids

    yield None
    with ids._SOURCES_MUTEX:
        ids._SOURCES.clear()
