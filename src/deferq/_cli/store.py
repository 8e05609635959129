"""Which store an operator command acts on, and the refusal to act on none (spec/queue.md Q-24, Q-25).

Rules:
- The storage directory comes from ``--path``, else the ``DEFERQ_PATH`` environment
  variable, else ``storage``; the prefix from ``--prefix``, else ``DEFERQ_PREFIX``, else
  ``deferred-`` (Q-24).
- A command never creates a store, and a wrong path or prefix must never look like an
  empty store: before any file is opened, the directory must exist and hold at least one
  file of the prefix (a WAL file, F-1, or the dead-task data or lock file, F-9). Otherwise
  the command fails with status ``EXIT_NO_STORE``, naming the path, the prefix and the
  prefixes the directory does hold (Q-25).
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Iterable, Mapping
from typing import Final

from deferq._core.limits import DEFAULT_PATH, DEFAULT_PREFIX
from deferq._core.names import dead_data_name, dead_lock_name, is_wal_file_name
from deferq.backends._options import check_path, check_prefix

EXIT_NO_STORE: Final = 5
PATH_VARIABLE: Final = "DEFERQ_PATH"
PREFIX_VARIABLE: Final = "DEFERQ_PREFIX"
# A WAL file name is ``{prefix}{version}-{YYYYMMDD}-{pid}-{rand}`` (F-1): what precedes the
# version is a candidate prefix, confirmed by is_wal_file_name.
_WAL_NAME: Final = re.compile(r"^(.+-)\d+-\d{8}-\d+-[0-9a-z]+$")
_DATA_SUFFIX: Final = dead_data_name("")
_LOCK_SUFFIX: Final = dead_lock_name("")


class CommandError(Exception):
    """A command cannot do what it was asked: ``main`` prints the message and exits ``status``."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def storage_of(args: argparse.Namespace,
               environ: Mapping[str, str] = os.environ) -> tuple[str, str]:
    """Implements Q-24: the (path, prefix) of a command, from its options or the environment."""
    path = getattr(args, "path", None)
    if path is None:
        path = environ.get(PATH_VARIABLE) or DEFAULT_PATH
    prefix = getattr(args, "prefix", None)
    if prefix is None:
        prefix = environ.get(PREFIX_VARIABLE) or DEFAULT_PREFIX
    return check_path(path), check_prefix(prefix)


def prefixes_in(names: Iterable[str]) -> list[str]:
    """Every prefix that names a store file among ``names`` (F-1, F-9), sorted."""
    found: set[str] = set()
    for name in names:
        for suffix in (_DATA_SUFFIX, _LOCK_SUFFIX):
            if name.endswith(suffix) and len(name) > len(suffix):
                found.add(name[:-len(suffix)])
        match = _WAL_NAME.match(name)
        if match and is_wal_file_name(match.group(1), name):
            found.add(match.group(1))
    return sorted(found)


def require_store(path: str, prefix: str) -> None:
    """Implements Q-25: fail unless ``path`` is a directory holding a store of ``prefix``."""
    try:
        names = os.listdir(path)
    except FileNotFoundError:
        raise CommandError(f"no storage directory {path!r} (give --path, or set "
                           f"{PATH_VARIABLE})", EXIT_NO_STORE) from None
    except NotADirectoryError:
        raise CommandError(f"{path!r} is not a directory (give --path, or set "
                           f"{PATH_VARIABLE})", EXIT_NO_STORE) from None
    found = prefixes_in(names)
    if prefix in found:
        return
    if found:
        others = ", ".join(repr(p) for p in found)
        hint = f"it holds the store(s) of prefix {others}: give --prefix, or set {PREFIX_VARIABLE}"
    else:
        hint = "it holds no deferq store at all: check --path"
    raise CommandError(f"no store with prefix {prefix!r} in {path!r}; {hint}", EXIT_NO_STORE)
