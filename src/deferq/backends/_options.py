"""Validation of the Disk backend's options, shared by ``Disk`` and ``Config`` (spec/api.md).

Rules: every check raises ``ValueError`` (also for a wrong type, so one except clause covers configuration mistakes)
with a message that names the option, the bad value and what is supported
(C-3..C-6). Nothing here touches the filesystem.
"""

from __future__ import annotations

import math
import os

from deferq._core.limits import (
    FILE_NAME_BYTES_MAX,
    FSYNC_FREQUENCY_MAX_S,
    FSYNC_FREQUENCY_MIN_S,
    PREFIX_BYTES_MAX,
    SWEEP_FILES_LIMIT,
    SWEEP_INTERVAL_MAX_S,
    SWEEP_INTERVAL_MIN_S,
)


def check_path(path: object) -> str:
    """A non-empty ``str`` or ``os.PathLike`` without NUL (C-3)."""
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str):
        raise ValueError(f"path must be a str or os.PathLike, not {type(path).__name__}")
    if not path or "\x00" in path:
        raise ValueError(f"path {path!r} must be a non-empty directory path without NUL")
    return path


def check_prefix(prefix: object) -> str:
    """A prefix with meaning, no path separator or NUL; '-' appended if missing (C-4)."""
    if not isinstance(prefix, str):
        raise ValueError(f"prefix must be a str, not {type(prefix).__name__}")
    for bad in ("/", "\\", "\x00", "\n"):
        if bad in prefix:
            raise ValueError(f"prefix {prefix!r} must not contain {bad!r}: it is part of file names")
    if not prefix.strip("- \t") or prefix in (".", ".."):
        raise ValueError(f"prefix {prefix!r} is empty of meaning: use letters or digits,"
                         " e.g. 'deferred-'")
    normalized = prefix if prefix.endswith("-") else prefix + "-"
    size = len(normalized.encode("utf-8", "surrogatepass"))
    if size > PREFIX_BYTES_MAX:  # Implements C-19: every file name must fit NAME_MAX.
        raise ValueError(f"prefix is {size} UTF-8 bytes (with its '-'); at most "
                         f"{PREFIX_BYTES_MAX} keep every file name within {FILE_NAME_BYTES_MAX} bytes")
    return normalized


def check_fsync_frequency(value: object) -> float:
    """Seconds between WAL fsyncs: 0, or from FSYNC_FREQUENCY_MIN_S to FSYNC_FREQUENCY_MAX_S (C-20)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"fsync_frequency must be a number of seconds, not {type(value).__name__}")
    seconds = float(value) if isinstance(value, float) or abs(value) <= 2**53 else math.inf
    if not math.isfinite(seconds) or seconds < 0 or seconds > FSYNC_FREQUENCY_MAX_S:
        raise ValueError(f"fsync_frequency {value!r} must be a finite number of seconds from 0"
                         f" (fsync every write) to {FSYNC_FREQUENCY_MAX_S:g}")
    if 0 < seconds < FSYNC_FREQUENCY_MIN_S:
        raise ValueError(f"fsync_frequency {value!r} is below {FSYNC_FREQUENCY_MIN_S:g} s: a timer"
                         " that fires more often only burns CPU; use 0 to fsync every write")
    return seconds


def check_files_max(value: object) -> int:
    """Orphaned WAL files one sweep may adopt: an int from 1 to SWEEP_FILES_LIMIT (C-27)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"files_max must be an int, not {type(value).__name__}")
    if not 1 <= value <= SWEEP_FILES_LIMIT:
        raise ValueError(f"files_max {value!r} must be from 1 to {SWEEP_FILES_LIMIT}")
    return value


def check_sweep_interval(value: object) -> float:
    """Seconds between adoption sweeps (Q-72): finite, from SWEEP_INTERVAL_MIN_S to _MAX_S."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"sweep_interval must be a number of seconds, not {type(value).__name__}")
    seconds = float(value) if isinstance(value, float) or abs(value) <= 2**53 else math.inf
    if not math.isfinite(seconds) or not SWEEP_INTERVAL_MIN_S <= seconds <= SWEEP_INTERVAL_MAX_S:
        raise ValueError(f"sweep_interval {value!r} must be a finite number of seconds from "
                         f"{SWEEP_INTERVAL_MIN_S:g} to {SWEEP_INTERVAL_MAX_S:g}")
    return seconds
