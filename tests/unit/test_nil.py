"""Unit tests of the ``Nil`` backend (src/deferq/backends/disk.py, C-10).

Goal: Nil accepts any options, never touches the filesystem and answers every method
with its documented empty value. Method: build Nil with assorted (even invalid) options
inside an empty temporary working directory, call every method, and check the return
values and that the directory (and a path named in the options) stays empty.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from deferq.backends import Nil


def result_of(method: Callable[..., object], *args: object, **kwargs: object) -> object:
    """Call a method and return what it returned (mypy forbids using a None-typed result)."""
    return method(*args, **kwargs)


@pytest.mark.spec("C-10")
@pytest.mark.parametrize("options", [
    {},
    {"path": "storage", "prefix": "deferred-", "fsync_frequency": 0.5},
    {"path": "", "prefix": "/", "fsync_frequency": -1, "unknown": object()},
])
def test_nil_accepts_any_options(options: dict[str, object]) -> None:
    assert repr(Nil(**options)) == "Nil()"


@pytest.mark.spec("C-10")
def test_nil_methods_do_nothing_and_return_empty_values(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    nil = Nil(path=str(tmp_path / "storage"), prefix="jobs", fsync_frequency=0)
    try:
        raise RuntimeError("boom")
    except RuntimeError as exc:
        error = exc
    assert result_of(nil.add_task, b"ctx") is None
    assert result_of(nil.add_task, b"ctx", 1700000000, "my-id") is None
    assert result_of(nil.remove_task, "my-id") is None
    assert nil.pending_tasks() == []
    assert result_of(nil.sync) is None
    assert result_of(nil.tick) is None
    assert result_of(nil.add_dead_task, "my-id", b"ctx", error, task_class="T", attempts=3) is None
    assert nil.list_dead_tasks() == []
    assert nil.list_dead_tasks(limit=5, offset=2) == []
    assert nil.find_dead_task("my-id") is None
    assert nil.remove_dead_tasks(["my-id", "other"]) == 0
    assert nil.remove_dead_tasks("my-id") == 0
    assert nil.remove_dead_tasks(None) == 0
    assert result_of(nil.close) is None
    assert result_of(nil.close) is None
    assert os.listdir(tmp_path) == []


@pytest.mark.spec("C-10", "C-9", "C-35")
def test_nil_is_a_context_manager_that_creates_no_file(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with Nil(path="storage") as nil:
        assert isinstance(nil, Nil)
        nil.add_task(b"x")
    assert os.listdir(tmp_path) == []


@pytest.mark.spec("C-10")
def test_nil_context_manager_does_not_swallow_exceptions() -> None:
    with pytest.raises(KeyError):
        with Nil():
            raise KeyError("x")
