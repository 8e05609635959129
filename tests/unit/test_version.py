"""One version source (src/deferq/_version.py).

Goal: the version a user sees in ``deferq.__version__`` is the one pip recorded for the
installed distribution, so the two cannot drift. Method: compare ``deferq.__version__`` with
``importlib.metadata.version("deferq")`` (the editable install of .venv here; the wheel test,
tests/packaging, checks the same in a fresh venv), and check pyproject.toml names no second
version literal.
"""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

import deferq
from deferq import _version

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_the_installed_metadata_has_the_packages_version() -> None:
    assert importlib.metadata.version("deferq") == deferq.__version__ == _version.__version__


def test_pyproject_reads_the_version_from_the_module() -> None:
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))
    assert "version" not in project["project"]
    assert project["project"]["dynamic"] == ["version"]
    dynamic = project["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "deferq._version.__version__"}
