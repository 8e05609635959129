"""SimFs: the inodes, namespace and log of un-persisted operations of one simulated disk.

Theory of operation. Every inode has a volatile image (the page cache: what processes
read) and a durable image (the medium). A file's images are bytes; a directory's are
``name -> inode`` maps. Every change is applied to the volatile image at once and
appended to the log of un-persisted operations (``_oplog``): writes and truncates per
file, link/unlink micro-operations per directory, each with a sequence number in
program order, and the micro-operations of one rename sharing a group. ``persist_file``
(a successful fsync) moves that file's logged operations into its durable bytes (its
data and size, never its name); ``persist_dir`` does the same for the micro-operations
of that directory. Nothing else is ever durable by itself: what a power loss keeps
beyond that is chosen by a persistence model from ``crash_input``, and ``load_image``
boots the result.

Rules. Inodes stay alive while a name or a descriptor refers to them (a *ghost* after
unlink or rename-over keeps working through its descriptors), and while the log
mentions them (a lost unlink may bring a name back). ``version`` grows with every
change, so a crash state enumerated earlier can be told apart from the current state.
This class holds no lock: ``SimDisk`` owns the machine's lock and every caller
(``SimDisk`` and ``SimEnv``) holds it around each call. Syscall semantics (errnos,
permissions, descriptors) belong to ``SimEnv``: these methods take resolved inodes and
trust their arguments.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from typing import Final

from deferq.crashtest._clock import SimClock
from deferq.crashtest._inode import Inode, Resolved, os_error
from deferq.crashtest._oplog import (
    ROOT_PATH,
    CrashInput,
    DurableInode,
    Fill,
    Image,
    LinkOp,
    Node,
    Op,
    Plan,
    TruncateOp,
    UnlinkOp,
    WriteOp,
    apply_data_ops,
    realize,
)

ROOT_INO: Final = 2  # as on ext4


class SimFs:
    """The inodes and log of one simulated disk, booted from ``image``; ``clock`` stamps ctimes."""

    def __init__(self, clock: SimClock, image: Image) -> None:
        self.clock = clock
        self.version = 0
        self._inodes: dict[int, Inode] = {}
        self._next_ino = ROOT_INO + 1
        self._log: dict[int, Op] = {}
        self._by_file: dict[int, list[int]] = {}
        self._by_dir: dict[int, list[int]] = {}
        self._seq = 0
        self._group = 0
        self._barrier_seq = 0
        self.load_image(image)
    def node(self, ino: int) -> Inode:
        """The live inode numbered ``ino``."""
        return self._inodes[ino]

    def resolve(self, path: str) -> Resolved:
        """Look ``path`` up in the volatile namespace (relative paths start at the root)."""
        if not path:
            raise os_error(errno.ENOENT, path)
        comps = [c for c in path.split("/") if c and c != "."]
        slash = path.endswith("/") and bool(comps)
        stack = [self._inodes[ROOT_INO]]
        if not comps:
            return Resolved(stack[0], "", stack[0], False)
        for comp in comps[:-1]:
            if comp == "..":
                if len(stack) > 1:
                    stack.pop()
                continue
            child = stack[-1].entries.get(comp)
            if child is None:
                raise os_error(errno.ENOENT, path)
            node = self._inodes[child]
            if not node.is_dir:
                raise os_error(errno.ENOTDIR, path)
            stack.append(node)
        last = comps[-1]
        if last == "..":
            target = stack[-2] if len(stack) > 1 else stack[0]
            return Resolved(target, "", target, False)
        parent = stack[-1]
        child = parent.entries.get(last)
        found = None if child is None else self._inodes[child]
        if slash and found is not None and not found.is_dir:
            raise os_error(errno.ENOTDIR, path)
        return Resolved(parent, last, found, slash)

    def create_file(self, parent: Inode, name: str, mode: int) -> Inode:
        node = self._new_inode(is_dir=False, mode=mode)
        self._link(parent, name, node, self._new_group())
        return node

    def mkdir(self, parent: Inode, name: str, mode: int) -> Inode:
        node = self._new_inode(is_dir=True, mode=mode)
        self._link(parent, name, node, self._new_group())
        return node

    def unlink(self, parent: Inode, name: str) -> None:
        node = self._inodes[parent.entries[name]]
        self._unlink(parent, name, node, self._new_group())

    def rename(self, src_parent: Inode, src_name: str, dst_parent: Inode, dst_name: str) -> None:
        """Replace ``dst`` with ``src``: logged as unlink old dst, link dst, unlink src."""
        node = self._inodes[src_parent.entries[src_name]]
        group = self._new_group()
        old = dst_parent.entries.get(dst_name)
        if old is not None:
            self._unlink(dst_parent, dst_name, self._inodes[old], group)
        self._link(dst_parent, dst_name, node, group)
        self._unlink(src_parent, src_name, node, group)

    # ------------------------------------------------------------------ data and durability

    def write(self, node: Inode, offset: int, data: bytes) -> None:
        end = offset + len(data)
        if end > len(node.data):
            node.data.extend(bytes(end - len(node.data)))
        node.data[offset:end] = data
        self._log_op(node.ino, self._by_file, WriteOp(self._next_seq(), node.ino, offset, data))
        self._touch(node)

    def truncate(self, node: Inode, size: int) -> None:
        if size < len(node.data):
            del node.data[size:]
        else:
            node.data.extend(bytes(size - len(node.data)))
        self._log_op(node.ino, self._by_file, TruncateOp(self._next_seq(), node.ino, size))
        self._touch(node)

    def persist_file(self, ino: int) -> None:
        """A successful fsync: the file's logged data and size become durable (A-3)."""
        seqs = self._by_file.pop(ino, [])
        if seqs:
            ops = [op for seq in seqs if isinstance(op := self._log.pop(seq), WriteOp | TruncateOp)]
            node = self._inodes[ino]
            node.durable, _ = apply_data_ops(node.durable, ops, None, Fill.ZEROS, 0, ino)
            self.version += 1

    def persist_dir(self, ino: int) -> None:
        """A successful fsync_dir: the directory's logged micro-operations become durable (A-4)."""
        node = self._inodes[ino]
        for seq in self._by_dir.pop(ino, []):
            op = self._log.pop(seq)
            if isinstance(op, LinkOp):
                node.durable_entries[op.name] = op.ino
            elif isinstance(op, UnlinkOp) and node.durable_entries.get(op.name) == op.ino:
                del node.durable_entries[op.name]
            self.version += 1

    def barrier(self) -> None:
        """Record a successful fsync or fsync_dir (a journal commit for ext4_ordered)."""
        self._barrier_seq = self._next_seq()
        self.version += 1

    def drop_dirty(self, node: Inode, keep_cache: bool) -> None:
        """A writeback error: dirty data is marked clean and never reaches the medium (A-7)."""
        for seq in self._by_file.pop(node.ino, []):
            del self._log[seq]
        if not keep_cache:
            size = len(node.data)
            node.data = bytearray(node.durable[:size].ljust(size, b"\x00"))
        node.diverged = True
        node.wb_err += 1
        node.wb_err_seen = False
        self.version += 1

    def sync(self) -> None:
        """``sync(2)`` plus an fsync of every directory: the whole log becomes durable."""
        for ino in list(self._by_file):
            self.persist_file(ino)
        for ino in list(self._by_dir):
            self.persist_dir(ino)
        self.barrier()

    def now_ns(self) -> int:
        """The machine's wall clock in nanoseconds: what a change stamps as ctime."""
        return int(self.clock.time_s * 1_000_000_000)

    # ------------------------------------------------------------------ the whole state

    def crash_input(self) -> CrashInput:
        """The durable state and the log of un-persisted operations, frozen."""
        inodes = {ino: DurableInode(ino, node.is_dir, node.mode, node.durable,
                                    tuple(node.durable_entries.items()))
                  for ino, node in self._inodes.items()}
        return CrashInput(ROOT_INO, inodes, tuple(self._log.values()), self._barrier_seq)

    def pending_ops(self) -> tuple[Op, ...]:
        """The log of un-persisted operations, in program order."""
        return tuple(self._log.values())

    def durable_image(self) -> Image:
        """What survives a power loss for sure: the durable state without any of the log."""
        return realize(self.crash_input(), Plan({}))[0]

    def volatile_image(self) -> Image:
        """What processes see now, as an ``Image``."""
        nodes = [Node(path, node.ino, node.mode, None if node.is_dir else bytes(node.data))
                 for path, node in self._walk_volatile()]
        return Image(tuple(sorted(nodes, key=lambda n: n.path)))

    def file_at(self, path: str) -> Inode:
        """The regular file ``path`` names now (ENOENT, EISDIR otherwise)."""
        node = self.resolve(path).node
        if node is None:
            raise os_error(errno.ENOENT, path)
        if node.is_dir:
            raise os_error(errno.EISDIR, path)
        return node

    def damage_at_rest(self, path: str, offset: int, data: bytes) -> None:
        """Overwrite durable bytes of a file on the medium (and in the cache), logging nothing."""
        node = self.file_at(path)
        if offset < 0 or offset + len(data) > len(node.durable):
            raise ValueError("damage must lie inside the durable bytes")
        node.durable = node.durable[:offset] + data + node.durable[offset + len(data):]
        end = min(len(node.data), offset + len(data))
        if offset < end:
            node.data[offset:end] = data[:end - offset]
        self.version += 1

    def check_invariants(self) -> None:
        """Assert that the volatile state is the durable state plus the log."""
        crash = self.crash_input()
        data_ops = crash.data_ops()
        for ino, node in self._inodes.items():
            if node.is_dir:
                expected = dict(node.durable_entries)
                for seq in self._by_dir.get(ino, []):
                    op = self._log[seq]
                    if isinstance(op, LinkOp):
                        expected[op.name] = op.ino
                    elif isinstance(op, UnlinkOp) and expected.get(op.name) == op.ino:
                        del expected[op.name]
                assert expected == node.entries, f"directory {ino} disagrees with its log"
            elif not node.diverged:
                data, _ = apply_data_ops(node.durable, data_ops.get(ino, ()), None,
                                         Fill.ZEROS, 0, ino)
                assert data == bytes(node.data), f"file {ino} disagrees with its log"
        links: dict[int, int] = {}
        for node in self._inodes.values():
            for child in node.entries.values():
                links[child] = links.get(child, 0) + 1
        for ino, node in self._inodes.items():
            if not node.is_dir:
                assert node.nlink == links.get(ino, 0), f"inode {ino} link count"
        assert all(seq in self._log for seqs in self._by_file.values() for seq in seqs)

    def load_image(self, image: Image) -> None:
        """Boot: the image becomes both the durable and the volatile state; the log is empty."""
        self._inodes = {}
        paths: dict[str, int] = {}
        for node in image.nodes:
            if node.ino not in self._inodes:
                self._inodes[node.ino] = Inode(node.ino, node.data is None, node.mode,
                                               node.data or b"", ctime_ns=self.now_ns())
            paths[node.path] = node.ino
        assert paths.get(ROOT_PATH) == ROOT_INO, "an image's root is inode ROOT_INO"
        for node in image.nodes:
            if node.path == ROOT_PATH:
                continue
            head, _, name = node.path.rpartition("/")
            parent = self._inodes[paths[head or ROOT_PATH]]
            parent.entries[name] = node.ino
            parent.durable_entries[name] = node.ino
            self._inodes[node.ino].nlink += 1
        self._next_ino = max(self._next_ino, max(self._inodes) + 1)
        self._log.clear()
        self._by_file.clear()
        self._by_dir.clear()
        self._barrier_seq = 0
        self.version += 1

    # ------------------------------------------------------------------ internals

    def _walk_volatile(self) -> Iterator[tuple[str, Inode]]:
        stack: list[tuple[str, Inode, frozenset[int]]] = [
            (ROOT_PATH, self._inodes[ROOT_INO], frozenset())]
        while stack:
            path, node, ancestors = stack.pop()
            yield path, node
            if node.is_dir:
                inner = ancestors | {node.ino}
                for name, child in node.entries.items():
                    if child not in inner:
                        stack.append((f"{path.rstrip('/')}/{name}", self._inodes[child], inner))

    def _new_inode(self, *, is_dir: bool, mode: int) -> Inode:
        node = Inode(self._next_ino, is_dir, mode, ctime_ns=self.now_ns())
        self._next_ino += 1
        self._inodes[node.ino] = node
        return node

    def _new_group(self) -> int:
        self._group += 1
        return self._group

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _log_op(self, ino: int, index: dict[int, list[int]], op: Op) -> None:
        self._log[op.seq] = op
        index.setdefault(ino, []).append(op.seq)
        self.version += 1

    def _touch(self, node: Inode) -> None:
        node.ctime_ns = self.now_ns()

    def _link(self, parent: Inode, name: str, node: Inode, group: int) -> None:
        parent.entries[name] = node.ino
        node.nlink += 1
        self._log_op(parent.ino, self._by_dir,
                     LinkOp(self._next_seq(), group, parent.ino, name, node.ino))
        self._touch(parent)
        self._touch(node)

    def _unlink(self, parent: Inode, name: str, node: Inode, group: int) -> None:
        del parent.entries[name]
        node.nlink -= 1
        self._log_op(parent.ino, self._by_dir,
                     UnlinkOp(self._next_seq(), group, parent.ino, name, node.ino))
        self._touch(parent)
        self._touch(node)
