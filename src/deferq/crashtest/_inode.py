"""Inodes and path lookups of the simulated disk, and OS-style errors.

Rules: plain mutable records, no behaviour beyond construction; ``SimDisk`` owns every
change to them. An inode holds both images (volatile: the page cache; durable: the
medium), its volatile link count and its Linux errseq state for fsync errors.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


def os_error(code: int, path: str | None = None) -> OSError:
    """An ``OSError`` as the real OS raises it (``FileNotFoundError`` for ENOENT, ...)."""
    if path is None:
        return OSError(code, os.strerror(code))
    return OSError(code, os.strerror(code), path)


class Inode:
    """One file or directory: volatile and durable images, link count, fsync error state."""

    __slots__ = ("ctime_ns", "data", "diverged", "durable", "durable_entries", "entries", "ino",
                 "is_dir", "mode", "nlink", "wb_err", "wb_err_seen")

    def __init__(self, ino: int, is_dir: bool, mode: int, data: bytes = b"",
                 entries: dict[str, int] | None = None, ctime_ns: int = 0) -> None:
        self.ino = ino
        self.is_dir = is_dir
        self.mode = mode
        self.data = bytearray(data)
        self.durable = bytes(data)
        self.entries: dict[str, int] = dict(entries or {})
        self.durable_entries: dict[str, int] = dict(entries or {})
        self.nlink = 0
        self.ctime_ns = ctime_ns
        # Linux errseq: how many writeback errors hit this inode, and whether the latest
        # has been reported to anyone.
        self.wb_err = 0
        self.wb_err_seen = True
        # The cache holds bytes the log does not explain (after an fsync error).
        self.diverged = False


@dataclass(slots=True)
class Resolved:
    """A path looked up in the volatile namespace."""

    parent: Inode
    name: str  # "" for the root
    node: Inode | None
    slash: bool
