"""Layering rules of the source tree (STYLE.md rules 1-2).

Goal: the pure core stays pure and the engine reaches the world only through
the ``Env`` seam. Method: parse each module's imports with ``ast`` and compare
against the allowed sets below.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "deferq"
PURE = ("_format.py", "_recovery.py", "_limits.py", "_types.py", "_errors.py", "_model.py")
ENGINE = ("_wal.py", "_deadstore.py", "_compact.py", "_io.py", "_env.py", "_ids.py")
WORLD = {"os", "io", "fcntl", "time", "random", "pathlib", "shutil", "tempfile", "socket",
         "subprocess", "signal", "mmap", "glob", "posix", "datetime", "secrets"}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("name", PURE)
def test_pure_modules_import_no_io_and_no_engine(name: str) -> None:
    imports = imported_modules(SRC / name)
    roots = {m.split(".")[0] for m in imports}
    assert not roots & (WORLD | {"threading", "logging"}), f"{name} imports {roots & WORLD}"
    engine = {m for m in imports if m.startswith("deferq.") and
              m.split(".")[1] + ".py" in ENGINE + ("backends.py", "_osenv.py", "_config.py")}
    assert not engine, f"{name} imports engine modules {engine}"


@pytest.mark.parametrize("name", ENGINE)
def test_engine_modules_reach_the_world_only_through_env(name: str) -> None:
    roots = {m.split(".")[0] for m in imported_modules(SRC / name)}
    assert not roots & WORLD, f"{name} imports {roots & WORLD}; use the Env seam"
    assert "deferq.testing" not in imported_modules(SRC / name)


def test_only_the_os_env_and_facades_import_os() -> None:
    # Command-line front ends and the real power-cut harness (which drives real
    # processes, mounts and ioctls) are tools around the engine, not the engine.
    allowed = {"_osenv.py", "_options.py", "backends.py", "_cli.py", "_cli_crash.py",
               "_cli_power.py", "_cli_ops.py"}
    for path in SRC.rglob("*.py"):
        if path.parent.name in ("testing", "_power"):
            continue
        roots = {m.split(".")[0] for m in imported_modules(path)}
        if "os" in roots or "fcntl" in roots:
            assert path.name in allowed, f"{path.name} imports os/fcntl"
