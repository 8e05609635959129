"""Unit tests of option validation and ``Config`` (src/deferq/backends/_options.py, _config.py; C-1..C-6).

Goal: every accepted and rejected form of ``config.backend`` and of each Disk option is
pinned, with error messages that name the bad value and what is supported. Method: call
the validators and the ``Config`` setter directly with values at and around each rule;
``build_backend`` is exercised for real in ``tmp_path`` (or a temporary working
directory for the default relative path) and every Disk it builds is closed.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import pytest

from deferq import Config, DiskOptions
from deferq.backends._options import check_fsync_frequency, check_path, check_prefix
from deferq.backends import Disk, Nil


class BytesPath:
    """An os.PathLike whose path is bytes, which deferq does not accept."""

    def __fspath__(self) -> bytes:
        return b"/tmp/x"


# ----------------------------------------------------------------------------- Config (C-1, C-2, C-6)


@pytest.mark.spec("C-1")
def test_config_defaults_to_disk_with_default_options() -> None:
    config = Config()
    assert config.backend == DiskOptions(path="storage", prefix="deferred-", fsync_frequency=0.5)
    assert not config.configured


@pytest.mark.spec("C-1", "C-2")
def test_unset_config_builds_a_default_disk(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    backend = Config().build_backend()
    assert isinstance(backend, Disk)
    try:
        assert (backend.path, backend.prefix, backend.fsync_frequency) == (
            "storage", "deferred-", 0.5)
        assert (tmp_path / "storage").is_dir()
    finally:
        backend.close()


@pytest.mark.spec("C-2")
def test_disk_string_selects_disk_with_defaults() -> None:
    config = Config()
    config.backend = "disk"
    assert config.backend == DiskOptions()
    assert config.configured


@pytest.mark.spec("C-2")
def test_disk_tuple_sets_the_given_options(tmp_path: Path) -> None:
    config = Config()
    config.backend = ("disk", {"path": tmp_path / "s", "prefix": "jobs", "fsync_frequency": 2})
    assert config.backend == DiskOptions(path=str(tmp_path / "s"), prefix="jobs-",
                                         fsync_frequency=2.0)


@pytest.mark.spec("C-2")
def test_disk_tuple_with_no_options_takes_the_defaults() -> None:
    config = Config()
    config.backend = ("disk", {})
    assert config.backend == DiskOptions()


@pytest.mark.spec("C-2")
def test_an_option_given_as_none_takes_its_default() -> None:
    config = Config()
    config.backend = ("disk", {"path": None, "prefix": None, "fsync_frequency": None})
    assert config.backend == DiskOptions()
    config.backend = ("disk", {"path": "p", "prefix": None})
    assert config.backend == DiskOptions(path="p")


@pytest.mark.spec("C-2", "C-10")
def test_none_selects_nil() -> None:
    config = Config()
    config.backend = None
    assert config.backend is None
    first, second = config.build_backend(), config.build_backend()
    assert isinstance(first, Nil) and isinstance(second, Nil)
    assert first is not second


@pytest.mark.spec("C-2")
def test_build_backend_returns_a_new_disk_each_call(tmp_path: Path) -> None:
    config = Config()
    config.backend = ("disk", {"path": tmp_path / "s", "prefix": "jobs", "fsync_frequency": 0})
    first = config.build_backend()
    try:
        second = config.build_backend()
        try:
            assert isinstance(first, Disk) and isinstance(second, Disk)
            assert first is not second
            for backend in (first, second):
                assert (backend.path, backend.prefix, backend.fsync_frequency) == (
                    str(tmp_path / "s"), "jobs-", 0.0)
        finally:
            second.close()
    finally:
        first.close()


@pytest.mark.spec("C-4")
def test_disk_appends_a_dash_to_its_prefix_and_names_its_files_with_it(tmp_path: Path) -> None:
    with Disk(path=tmp_path / "s", prefix="jobs", fsync_frequency=0) as disk:
        assert disk.prefix == "jobs-"
        names = os.listdir(tmp_path / "s")
    assert names and all(name.startswith("jobs-") for name in names)


@pytest.mark.spec("C-6")
@pytest.mark.parametrize("value", ["memory", "Disk", "", 1, ("redis", {}), ["disk", {}]])
def test_unsupported_backend_names_the_value_and_the_supported_ones(value: object) -> None:
    config = Config()
    with pytest.raises(ValueError) as info:
        config.backend = value
    message = str(info.value)
    bad = value[0] if isinstance(value, tuple) else value
    assert repr(bad) in message
    assert "'disk'" in message and "None" in message


@pytest.mark.spec("C-6")
@pytest.mark.parametrize("value", [("disk",), ("disk", {}, {}), ()])
def test_backend_tuple_of_the_wrong_length_is_rejected(value: tuple[object, ...]) -> None:
    config = Config()
    with pytest.raises(ValueError, match="'disk', \\('disk', \\{options\\}\\) or None"):
        config.backend = value


@pytest.mark.spec("C-6")
@pytest.mark.parametrize("options", [[("path", "x")], "path=x", None])
def test_backend_options_must_be_a_mapping(options: object) -> None:
    config = Config()
    with pytest.raises(ValueError, match="mapping"):
        config.backend = ("disk", options)


@pytest.mark.spec("C-6")
def test_unknown_option_keys_are_named_with_the_supported_ones() -> None:
    config = Config()
    with pytest.raises(ValueError) as info:
        config.backend = ("disk", {"pathh": "x", "fsync": 1, "prefix": "ok"})
    message = str(info.value)
    assert "'pathh'" in message and "'fsync'" in message
    assert "'path', 'prefix', 'fsync_frequency'" in message


@pytest.mark.parametrize(("options", "pattern"), [
    ({"path": ""}, "path ''"),
    ({"prefix": "a/b"}, re.escape("prefix 'a/b'")),
    ({"fsync_frequency": -1}, "fsync_frequency -1"),
])
@pytest.mark.spec("C-3", "C-4", "C-20")
def test_config_validates_each_option_when_it_is_set(options: dict[str, object],
                                                     pattern: str) -> None:
    config = Config()
    with pytest.raises(ValueError, match=pattern):
        config.backend = ("disk", options)


def test_a_rejected_backend_leaves_the_configuration_unchanged() -> None:
    config = Config()
    config.backend = None
    with pytest.raises(ValueError):
        config.backend = "memory"
    assert config.backend is None


# ----------------------------------------------------------------------------- path (C-3)


@pytest.mark.spec("C-3")
def test_path_accepts_str_and_pathlike(tmp_path: Path) -> None:
    assert check_path("storage") == "storage"
    assert check_path(" ") == " "
    assert check_path(tmp_path / "x") == str(tmp_path / "x")


@pytest.mark.spec("C-3")
@pytest.mark.parametrize("path", ["", "a\x00b", "\x00"])
def test_empty_path_or_path_with_nul_is_rejected(path: str) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(path))):
        check_path(path)


@pytest.mark.spec("C-3")
@pytest.mark.parametrize("path", [None, 1, b"storage", ["storage"], BytesPath()])
def test_non_str_path_is_rejected(path: object) -> None:
    with pytest.raises(ValueError, match="path must be a str or os.PathLike"):
        check_path(path)


@pytest.mark.spec("C-3")
def test_disk_rejects_a_bad_path_before_creating_anything(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for path in ("", "a\x00b"):
        with pytest.raises(ValueError):
            Disk(path=path)
    assert os.listdir(tmp_path) == []


# ----------------------------------------------------------------------------- prefix (C-4)


@pytest.mark.spec("C-4")
@pytest.mark.parametrize(("prefix", "expected"), [
    ("jobs", "jobs-"),
    ("jobs-", "jobs-"),
    ("deferred-", "deferred-"),
    ("a.b", "a.b-"),
    ("a b", "a b-"),
    ("-a", "-a-"),
    ("x--", "x--"),
    ("...", "...-"),
    ("\u00e9", "\u00e9-"),
])
def test_valid_prefix_gets_a_dash_appended_when_missing(prefix: str, expected: str) -> None:
    assert check_prefix(prefix) == expected


@pytest.mark.spec("C-4")
@pytest.mark.parametrize("prefix", ["a/b", "/", "a\\b", "a\x00", "a\nb"])
def test_prefix_with_a_separator_nul_or_newline_is_rejected(prefix: str) -> None:
    with pytest.raises(ValueError, match="must not contain"):
        check_prefix(prefix)


@pytest.mark.spec("C-4")
@pytest.mark.parametrize("prefix", ["", "-", "--", "  ", "\t", " - ", ".", ".."])
def test_prefix_empty_of_meaning_is_rejected(prefix: str) -> None:
    with pytest.raises(ValueError, match="empty of meaning"):
        check_prefix(prefix)


@pytest.mark.spec("C-4")
@pytest.mark.parametrize("prefix", [None, 1, b"jobs"])
def test_non_str_prefix_is_rejected(prefix: object) -> None:
    with pytest.raises(ValueError, match="prefix must be a str"):
        check_prefix(prefix)


# ----------------------------------------------------------------------------- fsync_frequency (C-20)


@pytest.mark.spec("C-20")
@pytest.mark.parametrize(("value", "seconds"), [
    (0, 0.0), (0.0, 0.0), (0.001, 0.001), (0.5, 0.5), (2, 2.0), (3600, 3600.0), (3600.0, 3600.0),
])
def test_fsync_frequency_accepts_finite_seconds_from_zero_to_an_hour(value: float,
                                                                     seconds: float) -> None:
    result = check_fsync_frequency(value)
    assert result == seconds and type(result) is float


@pytest.mark.spec("C-20")
@pytest.mark.parametrize("value", [
    math.nan, math.inf, -math.inf, -1, -0.001, 3601, 3600.001, 10**400, -(10**400),
    1e-9, 0.0009, 5e-324,
])
def test_fsync_frequency_out_of_range_is_rejected(value: float) -> None:
    with pytest.raises(ValueError, match="fsync_frequency"):
        check_fsync_frequency(value)


@pytest.mark.spec("C-20")
@pytest.mark.parametrize("value", [True, False, "1", None, b"1", [1]])
def test_fsync_frequency_of_a_non_number_or_bool_is_rejected(value: object) -> None:
    with pytest.raises(ValueError, match="must be a number of seconds"):
        check_fsync_frequency(value)


@pytest.mark.spec("C-19")
def test_a_prefix_is_bounded_so_that_every_file_name_fits(tmp_path: Path) -> None:
    longest = "p" * 225  # 226 bytes with its '-'
    assert check_prefix(longest) == longest + "-"
    with pytest.raises(ValueError, match="at most 226 keep every file name within 255 bytes"):
        check_prefix(longest + "pp")
    with pytest.raises(ValueError, match="UTF-8 bytes"):
        check_prefix("é" * 114)  # 228 bytes
    # The longest prefix works on a real filesystem, every time (pid and random vary).
    for _ in range(3):
        with Disk(path=tmp_path / "s", prefix=longest) as disk:
            disk.add_task(b"x")
            disk.add_dead_task("1-1-1", b"x", RuntimeError("x"), task_class="t", attempts=0)
            assert disk.remove_dead_tasks(["1-1-1"]) == 1
