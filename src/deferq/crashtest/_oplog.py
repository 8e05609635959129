"""The log of un-persisted operations and how a crash plan turns it into a disk image.

Rules and theory of operation. A ``SimDisk`` keeps, for every inode, a *durable* image
(what the medium holds) and a *volatile* one (what processes see through the page
cache). Every change that is not yet guaranteed durable is also appended to one global
log, numbered by ``seq`` in program order:

- data operations, per file inode: ``WriteOp`` (offset, bytes) and ``TruncateOp``
  (new size; ``ftruncate`` and ``O_TRUNC``);
- namespace micro-operations, per directory inode: ``LinkOp`` (bind a name to an
  inode) and ``UnlinkOp`` (remove a name *if it still names that inode*). One user-level
  call is one ``group``: create and mkdir are one ``LinkOp``; unlink is one ``UnlinkOp``;
  ``rename(src, dst)`` is ``UnlinkOp(dst, old)`` when ``dst`` existed, ``LinkOp(dst,
  inode)`` and ``UnlinkOp(src, inode)``, in that order (ALICE's decomposition).

A successful ``fsync`` of a file removes that file's data operations from the log and
applies them to its durable image; ``fsync_dir`` does the same for the micro-operations
recorded in that directory. What remains in the log is exactly what a crash may lose.

A *plan* gives every logged operation an ``Outcome`` (default ``OMIT``); ``realize``
applies the plan to the durable image and returns the new ``Image``. Outcomes of a data
write: ``OMIT``, ``APPLY``, ``SIZE_ONLY`` (the size grows to cover it, its bytes are
holes), ``Torn(keep)`` (the first ``keep`` bytes land) and ``Damaged(keep, end)`` (the
first ``keep`` bytes land and the rest of the write up to the absolute offset ``end``
is garbage). Truncates and micro-operations are ``OMIT`` or ``APPLY``. Persisted
operations of one file apply in program order, so a byte always ends up with the last
persisted write covering it. Bytes that no persisted write covers and that lie beyond
what survived of the durable image are *holes*: the plan's ``Fill`` for that file says
whether they read as zeros or as garbage. Garbage is a deterministic function of the
plan's ``garbage_seed``, the inode and the offset, so every state is reproducible.

This module is pure: no clock, no randomness except the seeded garbage pattern.
"""

from __future__ import annotations

import enum
import hashlib
import random
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final

ROOT_PATH: Final = "/"


@dataclass(frozen=True, slots=True)
class WriteOp:
    """``data`` written at ``offset`` of file ``ino``, not yet fsynced."""

    seq: int
    ino: int
    offset: int
    data: bytes


@dataclass(frozen=True, slots=True)
class TruncateOp:
    """File ``ino`` set to ``size`` bytes, not yet fsynced."""

    seq: int
    ino: int
    size: int


@dataclass(frozen=True, slots=True)
class LinkOp:
    """``name`` in directory ``dir_ino`` bound to ``ino``, not yet dir-fsynced."""

    seq: int
    group: int
    dir_ino: int
    name: str
    ino: int


@dataclass(frozen=True, slots=True)
class UnlinkOp:
    """``name`` in directory ``dir_ino`` removed if it names ``ino``, not yet dir-fsynced."""

    seq: int
    group: int
    dir_ino: int
    name: str
    ino: int


DataOp = WriteOp | TruncateOp
NameOp = LinkOp | UnlinkOp
Op = WriteOp | TruncateOp | LinkOp | UnlinkOp


class Fate(enum.Enum):
    """The outcomes that take no parameter."""

    OMIT = "omit"
    APPLY = "apply"
    SIZE_ONLY = "size-only"


@dataclass(frozen=True, slots=True)
class Torn:
    """A write of which only the first ``keep`` bytes persisted (0 < keep < len)."""

    keep: int


@dataclass(frozen=True, slots=True)
class Damaged:
    """The first ``keep`` bytes persisted, then garbage up to absolute offset ``end``."""

    keep: int
    end: int


Outcome = Fate | Torn | Damaged


class Fill(enum.Enum):
    """What holes of a file read as after the crash."""

    ZEROS = "zeros"
    GARBAGE = "garbage"


@dataclass(frozen=True, slots=True)
class Plan:
    """One crash: an outcome per logged operation (absent = ``OMIT``) and a fill per file."""

    outcomes: Mapping[int, Outcome]
    fills: Mapping[int, Fill] = field(default_factory=dict)
    garbage_seed: int = 0

    def outcome(self, seq: int) -> Outcome:
        return self.outcomes.get(seq, Fate.OMIT)

    def fill(self, ino: int) -> Fill:
        return self.fills.get(ino, Fill.ZEROS)


@dataclass(frozen=True, slots=True)
class DurableInode:
    """The durable part of one inode, as a crash sees it."""

    ino: int
    is_dir: bool
    mode: int
    data: bytes = b""
    entries: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class CrashInput:
    """Everything a persistence model needs: the durable state and the pending log.

    ``barrier_seq`` is the ``seq`` of the last successful fsync or fsync_dir of any
    file or directory (0 when there was none); ``ext4_ordered`` treats it as a
    journal commit.
    """

    root_ino: int
    inodes: Mapping[int, DurableInode]
    ops: tuple[Op, ...]
    barrier_seq: int

    def data_ops(self) -> dict[int, list[DataOp]]:
        """Pending data operations grouped by file, each list in program order."""
        out: dict[int, list[DataOp]] = {}
        for op in self.ops:
            if isinstance(op, (WriteOp, TruncateOp)):
                out.setdefault(op.ino, []).append(op)
        return out

    def linkable(self) -> frozenset[int]:
        """Inodes some crash state could name: durably named, or named by a logged link.

        Operations on other inodes (ghosts of unlinks and renames) cannot change any
        crash state, so models leave them out.
        """
        named = {ino for node in self.inodes.values() for _, ino in node.entries}
        named.update(op.ino for op in self.ops if isinstance(op, LinkOp))
        return frozenset(named)

    def name_groups(self) -> list[list[NameOp]]:
        """Pending namespace micro-operations grouped by user-level call, in program order."""
        groups: dict[int, list[NameOp]] = {}
        for op in self.ops:
            if isinstance(op, (LinkOp, UnlinkOp)):
                groups.setdefault(op.group, []).append(op)
        return list(groups.values())


@dataclass(frozen=True, slots=True)
class Node:
    """One name in an image: a file with its bytes, or a directory (``data`` is None)."""

    path: str
    ino: int
    mode: int
    data: bytes | None


@dataclass(frozen=True, slots=True)
class Image:
    """A whole durable namespace: every path reachable from the root, root first, sorted.

    Two paths may share an inode (a non-atomic rename can leave a hard link).
    """

    nodes: tuple[Node, ...]

    def files(self) -> dict[str, bytes]:
        """Every file path and its bytes."""
        return {n.path: n.data for n in self.nodes if n.data is not None}

    def dirs(self) -> frozenset[str]:
        """Every directory path, the root included."""
        return frozenset(n.path for n in self.nodes if n.data is None)

    def get(self, path: str) -> bytes | None:
        """A file's bytes, or None when the path is not a file in this image."""
        for node in self.nodes:
            if node.path == path:
                return node.data
        return None

    def key(self) -> bytes:
        """A digest of what a reader can observe: paths, kinds, bytes and shared inodes.

        Inode numbers themselves are left out, so two crash states that differ only in
        numbering deduplicate.
        """
        digest = hashlib.blake2b(digest_size=16)
        first_path: dict[int, str] = {}
        for node in self.nodes:
            shared = first_path.setdefault(node.ino, node.path)
            kind = b"D" if node.data is None else b"F"
            digest.update(b"%d:%s%s|%d|%s|" % (len(node.path), node.path.encode(), kind,
                                                len(node.data or b""),
                                                shared.encode() if shared != node.path else b""))
            if node.data is not None:
                digest.update(node.data)
        return digest.digest()


_GARBAGE_BLOCK_BYTES: Final = 4096


class Garbage:
    """The deterministic garbage of one file: byte ``p`` depends only on (seed, ino, p)."""

    __slots__ = ("_blocks", "_ino", "_seed")

    def __init__(self, seed: int, ino: int) -> None:
        self._seed = seed
        self._ino = ino
        self._blocks: dict[int, bytes] = {}

    def _block(self, index: int) -> bytes:
        block = self._blocks.get(index)
        if block is None:
            block = random.Random(f"deferq-garbage/{self._seed}/{self._ino}/{index}").randbytes(
                _GARBAGE_BLOCK_BYTES)
            self._blocks[index] = block
        return block

    def slice(self, start: int, end: int) -> bytes:
        """Garbage for the absolute offsets ``[start, end)``."""
        parts = []
        position = start
        while position < end:
            index, inner = divmod(position, _GARBAGE_BLOCK_BYTES)
            take = min(end - position, _GARBAGE_BLOCK_BYTES - inner)
            parts.append(self._block(index)[inner:inner + take])
            position += take
        return b"".join(parts)


class _FileImage:
    """A file's bytes during realization, with a mask of holes (1 = no write covers it)."""

    __slots__ = ("buf", "holes")

    def __init__(self, data: bytes) -> None:
        self.buf = bytearray(data)
        self.holes = bytearray(len(data))

    def resize(self, size: int) -> None:
        if size <= len(self.buf):
            del self.buf[size:]
            del self.holes[size:]
        else:
            grow = size - len(self.buf)
            self.buf.extend(bytes(grow))
            self.holes.extend(b"\x01" * grow)

    def put(self, offset: int, data: bytes) -> None:
        if offset + len(data) > len(self.buf):
            self.resize(offset + len(data))
        self.buf[offset:offset + len(data)] = data
        self.holes[offset:offset + len(data)] = bytes(len(data))

    def finish(self, fill: Fill, garbage: Garbage) -> tuple[bytes, bool]:
        """The final bytes and whether any hole was filled."""
        if 1 not in self.holes:
            return bytes(self.buf), False
        if fill is Fill.GARBAGE:
            start = self.holes.find(1)
            while start != -1:
                end = self.holes.find(0, start)
                end = len(self.holes) if end == -1 else end
                self.buf[start:end] = garbage.slice(start, end)
                start = self.holes.find(1, end)
        return bytes(self.buf), True


def apply_data_ops(base: bytes, ops: Iterable[DataOp], outcome_of: Mapping[int, Outcome] | None,
                   fill: Fill, garbage_seed: int, ino: int) -> tuple[bytes, bool]:
    """Apply a file's pending operations to its durable bytes; ``None`` outcomes = all APPLY.

    Returns the bytes and whether the result has holes (so a caller can offer the
    garbage variant).
    """
    ops = list(ops)
    if outcome_of is not None and all(outcome_of.get(op.seq, Fate.OMIT) is Fate.OMIT
                                      for op in ops):
        return base, False  # The common case of enumeration: nothing of this file persisted.
    image = _FileImage(base)
    garbage = Garbage(garbage_seed, ino)
    for op in ops:
        outcome = Fate.APPLY if outcome_of is None else outcome_of.get(op.seq, Fate.OMIT)
        if outcome is Fate.OMIT:
            continue
        if isinstance(op, TruncateOp):
            image.resize(op.size)
        elif outcome is Fate.APPLY:
            image.put(op.offset, op.data)
        elif outcome is Fate.SIZE_ONLY:
            if op.offset + len(op.data) > len(image.buf):
                image.resize(op.offset + len(op.data))
        elif isinstance(outcome, Torn):
            image.put(op.offset, op.data[:outcome.keep])
        else:
            assert isinstance(outcome, Damaged)
            start = op.offset + outcome.keep
            image.put(op.offset, op.data[:outcome.keep])
            image.put(start, garbage.slice(start, outcome.end))
    return image.finish(fill, garbage)


def _walk(entries: Mapping[int, dict[str, int]], kinds: Mapping[int, DurableInode],
          root_ino: int) -> Iterator[tuple[str, int]]:
    """Every (path, ino) reachable from the root, depth first, names sorted; no cycles."""
    stack: list[tuple[str, int, frozenset[int]]] = [(ROOT_PATH, root_ino, frozenset())]
    while stack:
        path, ino, ancestors = stack.pop()
        yield path, ino
        if not kinds[ino].is_dir:
            continue
        inner = ancestors | {ino}
        for name in sorted(entries.get(ino, {}), reverse=True):
            child = entries[ino][name]
            if child in inner:
                continue  # A weird subset of directory renames made a cycle; cut it.
            stack.append((f"{path.rstrip('/')}/{name}", child, inner))


def realize(crash: CrashInput, plan: Plan) -> tuple[Image, frozenset[int]]:
    """The image a plan produces, and the files in it that have holes."""
    entries = {ino: dict(node.entries) for ino, node in crash.inodes.items() if node.is_dir}
    for op in crash.ops:
        if isinstance(op, (LinkOp, UnlinkOp)) and plan.outcome(op.seq) is Fate.APPLY:
            names = entries.setdefault(op.dir_ino, {})
            if isinstance(op, LinkOp):
                names[op.name] = op.ino
            elif names.get(op.name) == op.ino:
                del names[op.name]
    data_ops = crash.data_ops()
    nodes: list[Node] = []
    holes: set[int] = set()
    contents: dict[int, bytes] = {}
    for path, ino in _walk(entries, crash.inodes, crash.root_ino):
        durable = crash.inodes[ino]
        if durable.is_dir:
            nodes.append(Node(path, ino, durable.mode, None))
            continue
        if ino not in contents:
            data, has_holes = apply_data_ops(durable.data, data_ops.get(ino, ()), plan.outcomes,
                                             plan.fill(ino), plan.garbage_seed, ino)
            contents[ino] = data
            if has_holes:
                holes.add(ino)
        nodes.append(Node(path, ino, durable.mode, contents[ino]))
    nodes.sort(key=lambda n: n.path)
    return Image(tuple(nodes)), frozenset(holes)
