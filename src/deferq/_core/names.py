"""PURE: the file names of a store (spec/format.md F-1, F-9).

Theory of operation: every file of a store starts with the caller's prefix.
WAL files are ``{prefix}{version}-{YYYYMMDD}-{pid}-{rand base36}``, one per
writer, and ``is_wal_file_name`` accepts exactly that pattern and nothing
looser, so a stray file beside the store is never replayed. The dead-task store
has a data file, a lock file that is never renamed or unlinked, and a staging
file for compaction.

This module imports nothing that does I/O; CrossHair checks its contracts.
"""

from __future__ import annotations

from deferq._core.limits import DEAD_STORAGE_VERSION, WAL_STORAGE_VERSION


def wal_glob_prefix(prefix: str) -> str:
    """Every WAL file name of ``prefix`` starts with this (F-1)."""
    return f"{prefix}{WAL_STORAGE_VERSION}-"


def to_base36(number: int) -> str:
    """Lowercase base 36 without padding (F-1).

    pre: number >= 0
    post: int(__return__, 36) == number
    """
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    text = ""
    while True:
        number, rest = divmod(number, 36)
        text = digits[rest] + text
        if number == 0:
            return text


def wal_file_name(prefix: str, date_yyyymmdd: str, pid: int, rand_u32: int) -> str:
    """``{prefix}{version}-{YYYYMMDD}-{pid}-{rand base36}`` (F-1).

    pre: len(date_yyyymmdd) == 8 and date_yyyymmdd.isascii() and date_yyyymmdd.isdigit()
    pre: 0 <= pid < 10 ** 10 and 0 <= rand_u32 < 2 ** 32
    post: is_wal_file_name(prefix, __return__)
    """
    return f"{wal_glob_prefix(prefix)}{date_yyyymmdd}-{pid}-{to_base36(rand_u32)}"


def is_wal_file_name(prefix: str, name: str) -> bool:
    """Whether ``name`` is a WAL file of ``prefix`` (F-1): exactly the pattern, nothing looser."""
    start = wal_glob_prefix(prefix)
    if not name.startswith(start):
        return False
    parts = name[len(start):].split("-")
    if len(parts) != 3:
        return False
    date, pid, rand = parts
    return (
        len(date) == 8 and date.isascii() and date.isdigit()
        and 0 < len(pid) <= 10 and pid.isascii() and pid.isdigit()
        and 0 < len(rand) <= 7 and all(c in "0123456789abcdefghijklmnopqrstuvwxyz" for c in rand)
        and int(rand, 36) < 2 ** 32
    )


def dead_data_name(prefix: str) -> str:
    """The dead-task store's data file (F-9)."""
    return f"{prefix}dead_tasks-{DEAD_STORAGE_VERSION}"


def dead_lock_name(prefix: str) -> str:
    """The dead-task store's lock file, never renamed or unlinked (F-9)."""
    return f"{prefix}dead_tasks.lock"


def dead_tmp_name(prefix: str) -> str:
    """The dead-task store's compaction staging file (F-9)."""
    return f"{dead_data_name(prefix)}.tmp"


def dead_cache_name(prefix: str) -> str:
    """The dead-task store's index cache, never a source of truth (F-60)."""
    return f"{dead_data_name(prefix)}.index"


def schedules_data_name(prefix: str) -> str:
    """The periodic schedules' record file, replaced whole by a rename (F-42)."""
    return f"{prefix}schedules-1"


def schedules_lock_name(prefix: str) -> str:
    """The periodic schedules' leader lock file, never renamed or unlinked (F-42, L-9)."""
    return f"{prefix}schedules.lock"


def schedules_tmp_name(prefix: str) -> str:
    """The staging file a new record file is written to before its rename (F-42)."""
    return f"{schedules_data_name(prefix)}.tmp"
