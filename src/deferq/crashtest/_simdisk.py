"""SimDisk: the storage, clock and process table of one simulated machine.

Theory of operation. Every inode has a volatile image (the page cache: what processes
read) and a durable image (the medium). A file's images are bytes; a directory's are
``name -> inode`` maps. Every change is applied to the volatile image at once and
appended to the log of un-persisted operations (``_oplog``): writes and truncates per
file, link/unlink micro-operations per directory. ``fsync`` of a file moves that file's
logged operations into its durable bytes (its data and size, never its name);
``fsync_dir`` does the same for the micro-operations of that directory. Nothing else is
ever durable by itself: what a power loss keeps beyond that is the business of a
persistence model (``_persistence``), which picks a subset of the log.

Three ways to crash:
- ``kill(pid)``: the process dies; its descriptors close, its flocks and timers go; the
  page cache (volatile state and log) survives, so nothing the kernel accepted is lost.
- ``power_loss(model, choice)``: every process dies and the machine reboots into a
  state the model allows: the durable image plus some of the log (chosen at random from
  a seed, or an enumerated ``CrashState``); then volatile := durable and the log is empty.
- ``crash_states(model, bound)``: the distinct states a power loss could leave now,
  deduplicated by a digest of the image, as ``CrashState`` values that can boot a new
  ``SimDisk`` (``to_disk``) without changing this one.
A crash during recovery is just more of the same: boot, let the engine run a few
operations, crash again; nothing here treats a rebooted disk differently.

Inodes stay alive while a name or a descriptor refers to them (a *ghost* after unlink
or rename-over keeps working through its descriptors), and while the log mentions them
(a lost unlink may bring a name back). The disk is thread-safe through one re-entrant
lock, so engine code that uses threads can run on it; it never starts threads itself.
"""

from __future__ import annotations

import errno
import itertools
import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from deferq.crashtest._clock import SimClock, Timers
from deferq.crashtest._faults import FaultInjector, FaultRule
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
from deferq.crashtest._simenv import SimEnv
from deferq.crashtest._persistence import (
    MODELS,
    Bound,
    PersistenceModel,
    choices,
    describe,
    resolve_model,
)


ROOT_INO: Final = 2  # as on ext4
FIRST_PID: Final = 1000
_disk_ids = itertools.count(1)


def model_label(model: PersistenceModel) -> str:
    """A registered model's name, or the ``repr`` of a configured variant (for repros)."""
    return model.name if MODELS.get(model.name) is model else repr(model)


@dataclass(frozen=True, slots=True)
class CrashState:
    """One state a power loss may leave: a durable image and how it was chosen.

    ``str(state)`` is a one-line repro: model, index, source set and the options taken.
    """

    model: str
    index: int
    source: str
    description: str
    image: Image
    seed: int
    time_s: float
    monotonic_s: float
    origin: tuple[int, int]

    def files(self) -> dict[str, bytes]:
        return self.image.files()

    def to_disk(self) -> SimDisk:
        """A new machine booted into this state (same seed and clock as the original)."""
        return SimDisk(self.seed, clock=SimClock(self.time_s, self.monotonic_s), image=self.image)

    def __str__(self) -> str:
        return f"{self.model} state #{self.index} ({self.source}): {self.description}"


class SimDisk:
    """The storage, clock and processes of one simulated machine.

    Args:
        seed: seeds every simulated process's ``random_u32`` and random power losses.
        clock: the machine's clock (default: fixed start values, see ``_clock``).
        image: boot from this durable image instead of an empty root directory.
    """

    def __init__(self, seed: int = 0, *, clock: SimClock | None = None,
                 image: Image | None = None) -> None:
        self.seed = seed
        self.clock = clock if clock is not None else SimClock()
        self.timers = Timers()
        self.faults = FaultInjector()
        self.lock = threading.RLock()
        self._uid = next(_disk_ids)
        self._version = 0
        self._inodes: dict[int, Inode] = {}
        self._next_ino = ROOT_INO + 1
        self._log: dict[int, Op] = {}
        self._by_file: dict[int, list[int]] = {}
        self._by_dir: dict[int, list[int]] = {}
        self._seq = 0
        self._group = 0
        self._barrier_seq = 0
        self.flocks: dict[int, object] = {}
        self._procs: dict[int, SimEnv] = {}
        self._spawned = 0
        self._last_pid = FIRST_PID - 1
        self.power_loss_count = 0
        if image is None:
            image = Image((Node(ROOT_PATH, ROOT_INO, 0o755, None),))
        self._load_image(image)

    # ------------------------------------------------------------------ processes and time

    def process(self, pid: int | None = None) -> SimEnv:
        """Start a simulated process and return its ``Env``."""
        with self.lock:
            if pid is None:
                pid = self._last_pid + 1  # pids grow, as on a real machine; pass one to reuse
            if pid in self._procs:
                raise ValueError(f"process {pid} is already running")
            if not 0 < pid < 10**10:
                raise ValueError(f"pid {pid} out of range")
            self._spawned += 1
            self._last_pid = max(self._last_pid, pid)
            env = SimEnv(self, pid, random.Random(f"deferq-sim/{self.seed}/{pid}/{self._spawned}"))
            self._procs[pid] = env
            return env

    def processes(self) -> list[int]:
        """The pids of the running processes."""
        with self.lock:
            return sorted(self._procs)

    def kill(self, pid: int) -> None:
        """Process death: close its descriptors, release its flocks, drop its timers (A-5, A-8)."""
        with self.lock:
            env = self._procs.pop(pid, None)
            if env is None:
                raise ValueError(f"no running process {pid}")
            env.die()
            self.timers.drop_process(pid)

    def advance(self, seconds: float) -> None:
        """Move the machine's clocks forward (timers do not fire by themselves)."""
        with self.lock:
            self.clock.advance(seconds)

    def fire_timers(self) -> list[Exception]:
        """Call every due timer of every process; return the exceptions they raised."""
        return self.timers.fire_due(self.clock)

    def inject(self, rule: FaultRule) -> FaultRule:
        """Add a fault rule (see ``_faults``)."""
        with self.lock:
            return self.faults.add(rule)

    # ------------------------------------------------------------------ crashes

    def crash_input(self) -> CrashInput:
        """The durable state and the log of un-persisted operations, frozen."""
        with self.lock:
            inodes = {ino: DurableInode(ino, node.is_dir, node.mode, node.durable,
                                        tuple(node.durable_entries.items()))
                      for ino, node in self._inodes.items()}
            return CrashInput(ROOT_INO, inodes, tuple(self._log.values()), self._barrier_seq)

    def pending_ops(self) -> tuple[Op, ...]:
        """The log of un-persisted operations, in program order."""
        with self.lock:
            return tuple(self._log.values())

    def crash_states(self, model: str | PersistenceModel = "weakest",
                     bound: Bound | None = None) -> Iterator[CrashState]:
        """Every distinct state a power loss could leave now, within ``bound``.

        This disk is not changed; boot a state with ``state.to_disk()`` or apply it here
        with ``power_loss(model, state)``.
        """
        chosen = resolve_model(model)
        limits = bound if bound is not None else Bound()
        with self.lock:
            crash = self.crash_input()
            origin = (self._uid, self._version)
            time_s, monotonic_s = self.clock.time_s, self.clock.monotonic_s
        dims = chosen.dimensions(crash)
        seen: set[bytes] = set()
        index = 0
        for source, combo in choices(dims, limits, chosen, random.Random(limits.seed)):
            image, holes = realize(crash, chosen.plan(dims, combo, {}, limits.seed))
            variants = [(image, "")]
            if holes and Fill.GARBAGE in chosen.fills:
                fills = dict.fromkeys(holes, Fill.GARBAGE)
                variants.append((realize(crash, chosen.plan(dims, combo, fills, limits.seed))[0],
                                 " holes=garbage"))
            for variant, note in variants:
                key = variant.key()
                if key in seen:
                    continue
                seen.add(key)
                yield CrashState(model_label(chosen), index, source, describe(dims, combo) + note,
                                 variant,
                                 self.seed, time_s, monotonic_s, origin)
                index += 1

    def power_loss(self, model: str | PersistenceModel = "weakest",
                   choice: random.Random | int | CrashState | None = None) -> CrashState:
        """Every process dies and the disk reboots into a state the model allows.

        Args:
            model: a persistence model or its name (``weakest``, ``ext4_ordered``, ``prefix``).
            choice: a ``CrashState`` from ``crash_states`` of this disk in its current
                state, or a ``random.Random`` / seed to draw one at random (default: a
                seed derived from the disk's seed and how many power losses it had).

        Returns:
            The state the disk is now in (its ``str`` is a repro line).
        """
        chosen = resolve_model(model)
        with self.lock:
            if isinstance(choice, CrashState):
                if choice.origin != (self._uid, self._version):
                    raise ValueError("that crash state was enumerated from another disk state")
                state = choice
            else:
                state = self._random_state(chosen, choice)
            for pid in list(self._procs):
                self.kill(pid)
            self.flocks.clear()
            self._load_image(state.image)
            self.power_loss_count += 1
            return state

    def _random_state(self, model: PersistenceModel,
                      choice: random.Random | int | None) -> CrashState:
        if isinstance(choice, random.Random):
            rng = choice
        else:
            seed = choice if choice is not None else f"{self.seed}/{self.power_loss_count}"
            rng = random.Random(f"deferq-power-loss/{seed}")
        crash = self.crash_input()
        dims = model.dimensions(crash)
        combo = model.random_choice(dims, rng)
        fills = {ino: rng.choice(model.fills) for ino in crash.data_ops()}
        garbage_seed = rng.getrandbits(32)
        image, _ = realize(crash, model.plan(dims, combo, fills, garbage_seed))
        return CrashState(model_label(model), 0, "random", describe(dims, combo), image, self.seed,
                          self.clock.time_s, self.clock.monotonic_s, (self._uid, self._version))

    def sync(self) -> None:
        """``sync(2)`` plus an fsync of every directory: the whole log becomes durable."""
        with self.lock:
            for ino in list(self._by_file):
                self.persist_file(ino)
            for ino in list(self._by_dir):
                self.persist_dir(ino)
            self.barrier()

    # ------------------------------------------------------------------ inspection

    def read(self, path: str) -> bytes:
        """The bytes a process would read from ``path`` now."""
        with self.lock:
            return bytes(self._file_at(path).data)

    def read_durable(self, path: str) -> bytes:
        """The durable bytes of the file ``path`` names now."""
        with self.lock:
            return self._file_at(path).durable

    def exists(self, path: str) -> bool:
        with self.lock:
            try:
                return self.resolve(path).node is not None
            except OSError:
                return False

    def is_dir(self, path: str) -> bool:
        with self.lock:
            try:
                node = self.resolve(path).node
            except OSError:
                return False
            return node is not None and node.is_dir

    def listdir(self, path: str) -> list[str]:
        """The names in a directory now, sorted."""
        with self.lock:
            node = self.resolve(path).node
            if node is None or not node.is_dir:
                raise os_error(errno.ENOTDIR if node else errno.ENOENT, path)
            return sorted(node.entries)

    def files(self) -> dict[str, bytes]:
        """Every file path a process can see now, with its bytes."""
        return self.volatile_image().files()

    def volatile_image(self) -> Image:
        """What processes see now, as an ``Image``."""
        with self.lock:
            nodes = [Node(path, node.ino, node.mode, None if node.is_dir else bytes(node.data))
                     for path, node in self._walk_volatile()]
            return Image(tuple(sorted(nodes, key=lambda n: n.path)))

    def durable_image(self) -> Image:
        """What survives a power loss for sure: the durable state without any of the log."""
        return realize(self.crash_input(), Plan({}))[0]

    def damage_at_rest(self, path: str, offset: int, data: bytes) -> None:
        """Overwrite durable bytes of a file on the medium (and in the cache), logging nothing."""
        with self.lock:
            node = self._file_at(path)
            if offset < 0 or offset + len(data) > len(node.durable):
                raise ValueError("damage must lie inside the durable bytes")
            node.durable = node.durable[:offset] + data + node.durable[offset + len(data):]
            end = min(len(node.data), offset + len(data))
            if offset < end:
                node.data[offset:end] = data[:end - offset]
            self._version += 1

    def check_invariants(self) -> None:
        """Assert that the volatile state is the durable state plus the log."""
        with self.lock:
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

    # ------------------------------------------------------------------ namespace (for SimEnv)

    def node(self, ino: int) -> Inode:
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

    # ------------------------------------------------------------------ data (for SimEnv)

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
            self._version += 1

    def persist_dir(self, ino: int) -> None:
        """A successful fsync_dir: the directory's logged micro-operations become durable (A-4)."""
        node = self._inodes[ino]
        for seq in self._by_dir.pop(ino, []):
            op = self._log.pop(seq)
            if isinstance(op, LinkOp):
                node.durable_entries[op.name] = op.ino
            elif isinstance(op, UnlinkOp) and node.durable_entries.get(op.name) == op.ino:
                del node.durable_entries[op.name]
            self._version += 1

    def barrier(self) -> None:
        """Record a successful fsync or fsync_dir (a journal commit for ext4_ordered)."""
        self._barrier_seq = self._next_seq()
        self._version += 1

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
        self._version += 1

    def now_ns(self) -> int:
        return int(self.clock.time_s * 1_000_000_000)

    # ------------------------------------------------------------------ internals

    def _file_at(self, path: str) -> Inode:
        node = self.resolve(path).node
        if node is None:
            raise os_error(errno.ENOENT, path)
        if node.is_dir:
            raise os_error(errno.EISDIR, path)
        return node

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
        self._version += 1

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

    def _load_image(self, image: Image) -> None:
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
        self._version += 1

