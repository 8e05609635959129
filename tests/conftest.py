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
