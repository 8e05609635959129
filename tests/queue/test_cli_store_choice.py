"""Which store an operator command acts on (spec/queue.md Q-24, Q-25), through the real command.

Goal: a wrong ``--path`` or ``--prefix`` must never look like an empty store, and a reading
command must never create one. Method: build a real store with ``Disk``, then run
``python -m deferq`` in subprocesses with a typo'd prefix, a missing or non-directory path
and an empty directory, and check the exit status, the message and that no file appeared;
then check the ``DEFERQ_PATH`` / ``DEFERQ_PREFIX`` defaults and that options win over them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deferq._cli.store import EXIT_NO_STORE, prefixes_in
from deferq.backends import Disk

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = (["dead", "list"], ["dead", "show", "1-1-1"], ["dead", "retry", "--all"],
            ["dead", "remove", "--all"], ["pending", "list"], ["stats"], ["verify"])


def deferq(*args: str, env: dict[str, str] | None = None,
           cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("DEFERQ_")}
    environ.update(env or {})
    return subprocess.run([sys.executable, "-m", "deferq", *args], cwd=cwd, env=environ,
                          capture_output=True, text=True, timeout=60, check=False)


def _store(path: Path, prefix: str = "deferred-") -> None:
    with Disk(path=path, prefix=prefix) as disk:
        task_id = disk.add_task(b"{}")
        disk.add_dead_task(task_id, b"{}", RuntimeError("x"), task_class="t", attempts=1)
        disk.remove_task(task_id)


def _listing(path: Path) -> list[str]:
    return sorted(os.listdir(path))


@pytest.mark.slow
@pytest.mark.spec("Q-25")
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c))
def test_a_wrong_prefix_is_refused_naming_the_prefixes_found_and_creates_nothing(
        tmp_path: Path, command: list[str]) -> None:
    storage = tmp_path / "storage"
    _store(storage)
    before = _listing(storage)
    result = deferq(*command, "--path", str(storage), "--prefix", "deferq-")
    assert result.returncode == EXIT_NO_STORE, result
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith("deferq: error: no store with prefix 'deferq-' in ")
    assert "'deferred-'" in line and "--prefix" in line
    assert _listing(storage) == before


@pytest.mark.slow
@pytest.mark.spec("Q-25")
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c))
def test_a_missing_path_a_file_and_an_empty_directory_are_refused(tmp_path: Path,
                                                                    command: list[str]) -> None:
    missing = tmp_path / "nowhere"
    plain = tmp_path / "a-file"
    plain.write_text("not a store")
    empty = tmp_path / "empty"
    empty.mkdir()
    for path, says in ((missing, "no storage directory"), (plain, "is not a directory"),
                       (empty, "holds no deferq store at all")):
        result = deferq(*command, "--path", str(path))
        assert result.returncode == EXIT_NO_STORE, (path, result)
        assert says in result.stderr and result.stdout == ""
    assert not missing.exists() and _listing(empty) == [] and plain.read_text() == "not a store"


@pytest.mark.slow
@pytest.mark.spec("Q-24", "Q-118")
def test_the_environment_gives_the_defaults_and_options_win(tmp_path: Path) -> None:
    storage = tmp_path / "store"
    _store(storage, prefix="jobs-")
    env = {"DEFERQ_PATH": str(storage), "DEFERQ_PREFIX": "jobs-"}
    listed = deferq("dead", "list", "--json", env=env, cwd=tmp_path)
    assert listed.returncode == 0, listed
    assert len(json.loads(listed.stdout)) == 1
    # An option beats its variable: the prefix given names no store there.
    refused = deferq("stats", "--prefix", "other-", env=env, cwd=tmp_path)
    assert refused.returncode == EXIT_NO_STORE and "'jobs-'" in refused.stderr
    # Without the variables the defaults (./storage, deferred-) apply: nothing there.
    bare = deferq("stats", cwd=tmp_path)
    assert bare.returncode == EXIT_NO_STORE and "'storage'" in bare.stderr
    assert not (tmp_path / "storage").exists()
    helped = deferq("dead", "list", "--help")
    assert "$DEFERQ_PATH" in helped.stdout and "$DEFERQ_PREFIX" in helped.stdout


@pytest.mark.spec("Q-25")
def test_prefixes_are_found_from_every_kind_of_store_file() -> None:
    names = ["a-dead_tasks-0", "b-dead_tasks.lock", "c-0-20261204-12-1a", "d-0-2026-1-1",
             "dead_tasks.lock", "notes.txt", "e-dead_tasks-0.tmp"]
    assert prefixes_in(names) == ["a-", "b-", "c-"]
