"""The wheel, installed on its own, is the library plus its tools and nothing of the checkout.

Goal: what a user gets from ``pip install deferq`` works without this repository: the version
and licence metadata are right, every package under src/ is in the wheel (the mutant catalogue
too, which ``deferq crash-test`` needs), and the library and its operator commands still load
none of the tools (crash simulator, power harness, demos) when installed.

Method: build the wheel from a copy of the checkout's sources (pip wheel --no-build-isolation
with the running venv's setuptools: only the package registry is reachable, and a stale
build/ in the checkout could otherwise leak deleted modules into it), install it with
``pip install --no-deps --no-index`` into a fresh plain venv (no --system-site-packages, so
neither this checkout nor the editable install can be seen), and run that venv's python from
an empty directory: a probe that calls ``deferq._cli.main`` and prints ``sorted(sys.modules)``,
``python -m deferq``, and ``deferq crash-test`` with its built-in catalogue.
If the wheel cannot be built here (no setuptools >= 77 in this interpreter), the tests skip
saying so, except under CI=true, where that is a failure: CI must run them.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

from deferq._version import __version__

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "src")
TOOLS = ("deferq.crashtest", "deferq.powertest", "deferq._demos")
SETUPTOOLS_NEEDED = (77,)  # pyproject.toml's [build-system] requires


@dataclass(frozen=True)
class Installed:
    wheel: Path
    python: Path
    bin: Path
    workdir: Path  # empty but for a store the probes read: not the checkout


def _unavailable(reason: str) -> NoReturn:
    message = f"cannot build the wheel here: {reason}"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{message} (CI must run the wheel tests: scripts/setup.sh installs it)")
    pytest.skip(message)


def _run(args: list[str | Path], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


def _build_wheel(tmp: Path) -> Path:
    try:
        setuptools_version = importlib.metadata.version("setuptools")
    except importlib.metadata.PackageNotFoundError:
        _unavailable(f"{sys.executable} has no setuptools (pip install 'setuptools>=77')")
    if tuple(int(p) for p in setuptools_version.split(".")[:1]) < SETUPTOOLS_NEEDED:
        _unavailable(f"{sys.executable} has setuptools {setuptools_version}; the build needs "
                     ">= 77 (pip install 'setuptools>=77')")
    source = tmp / "source"
    source.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(REPO / name, source / name)
    dist = tmp / "dist"
    done = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                 "-w", dist, source], cwd=tmp)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "SetuptoolsDeprecationWarning" not in done.stdout + done.stderr
    wheels = sorted(dist.glob("deferq-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    tmp = tmp_path_factory.mktemp("wheel")
    wheel = _build_wheel(tmp)
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False, clear=True).create(env_dir)
    python = env_dir / "bin" / "python"
    done = _run([python, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", wheel],
                cwd=tmp)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    workdir = tmp / "cwd"
    workdir.mkdir()
    store = _run([python, "-c", "from deferq.backends import Disk\n"
                  "with Disk(path='store') as disk:\n"
                  "    disk.add_task(b'{}')\n"
                  "    disk.add_dead_task('t1', b'{}', RuntimeError('x'), task_class='T',"
                  " attempts=1)\n"], cwd=workdir)
    assert store.returncode == 0, store.stderr
    return Installed(wheel=wheel, python=python, bin=env_dir / "bin", workdir=workdir)


_PROBE = """
import json, sys
{setup}
import deferq, importlib.metadata
print(json.dumps({{"file": deferq.__file__, "version": deferq.__version__,
                  "dist_version": importlib.metadata.version("deferq"),
                  "modules": sorted(sys.modules)}}))
"""
CLI = "from deferq._cli import main\nstatus = main({argv!r})\nassert status == 0, status"


@pytest.mark.parametrize("setup", [
    "import deferq",
    CLI.format(argv=["stats", "--path", "store"]),
    CLI.format(argv=["dead", "list", "--path", "store"]),
    CLI.format(argv=["verify", "--path", "store"]),
])
def test_the_installed_library_and_operator_commands_load_no_tool(
        installed: Installed, setup: str) -> None:
    done = _run([installed.python, "-c", _PROBE.format(setup=setup)], cwd=installed.workdir)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    # The wheel's copy, not the checkout's, and its metadata agrees with the module.
    assert Path(report["file"]).is_relative_to(installed.python.parent.parent), report["file"]
    assert report["version"] == report["dist_version"] == __version__
    loaded = [m for m in report["modules"] if m == "deferq" or m.startswith("deferq.")]
    assert "deferq" in loaded
    tools = [m for m in loaded if any(m == t or m.startswith(t + ".") for t in TOOLS)]
    assert tools == [], f"{setup!r} loaded {tools}"


def test_python_m_deferq_runs_the_operator_commands(installed: Installed) -> None:
    stats = _run([installed.python, "-m", "deferq", "stats", "--path", "store"],
                 cwd=installed.workdir)
    assert stats.returncode == 0, stats.stderr
    assert stats.stdout.strip()
    listing = _run([installed.bin / "deferq", "dead", "list", "--path", "store"],
                   cwd=installed.workdir)
    assert listing.returncode == 0, listing.stderr
    assert "t1" in listing.stdout


def test_crash_test_checks_the_whole_shipped_catalogue(installed: Installed,
                                                       tmp_path: Path) -> None:
    from deferq.crashtest.catalogue import MUTANTS

    empty = tmp_path / "empty"
    empty.mkdir()  # nothing of tests/ (or of this checkout) can be found from here
    done = _run([installed.bin / "deferq", "crash-test", "--max-ops", "1", "--model", "prefix"],
                cwd=empty, timeout=300)
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0, (last, done.stdout[-3000:], done.stderr[-3000:])
    assert len(MUTANTS) > 10
    assert f"mutants_caught={len(MUTANTS)}/{len(MUTANTS)} " in last, last
    assert last.startswith("crash-test: ") and last.endswith(" complete=yes"), last
    assert " violations=0 " in last, last
    assert "mutant catalogue deferq.crashtest.catalogue (built in)" in done.stdout


def test_the_wheel_ships_the_licence_the_marker_and_every_package(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as wheel:
        names = set(wheel.namelist())
        info = f"deferq-{__version__}.dist-info"
        metadata = wheel.read(f"{info}/METADATA").decode("utf-8")
    assert f"{info}/licenses/LICENSE" in names
    assert "deferq/py.typed" in names
    assert "deferq/crashtest/catalogue/__init__.py" in names
    # Every module of every package under src/, and nothing from tests/ or benchmarks/.
    sources = {p.relative_to(REPO / "src").as_posix()
               for p in (REPO / "src" / "deferq").rglob("*.py")}
    assert sources <= names, sorted(sources - names)
    stray = sorted(n for n in names if n.endswith(".py") and n not in sources)
    assert stray == []
    headers = [line for line in metadata.splitlines() if ":" in line]
    assert f"Version: {__version__}" in headers
    assert "License-Expression: MIT" in headers
    assert "Classifier: Typing :: Typed" in headers
    assert not [h for h in headers if h.startswith("Classifier: License ::")]
