"""SimDisk: one simulated machine: its storage, clock, processes and power losses.

Theory of operation. The storage is a ``SimFs`` (``_simfs``): every inode has a
volatile image (what processes read) and a durable image (the medium), and every change
goes to the volatile image at once and to a log of un-persisted operations; ``fsync``
and ``fsync_dir`` move parts of the log into the durable images. Nothing else is ever
durable by itself: what a power loss keeps beyond that is the business of a persistence
model (``_persistence``), which picks a subset of the log. This class adds what a
machine has around its storage: the clock and timers, the fault rules, the flock table,
the process table (each process a ``SimEnv``), and the ways to crash.

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

The machine is thread-safe through one re-entrant lock (``lock``), held around every
call into the ``SimFs``, so engine code that uses threads can run on it; it never
starts threads itself.
"""

from __future__ import annotations

import errno
import itertools
import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from deferq.crashtest._clock import SimClock, Timers
from deferq.crashtest._faults import FaultInjector, FaultRule
from deferq.crashtest._inode import os_error
from deferq.crashtest._oplog import ROOT_PATH, CrashInput, Fill, Image, Node, Op, realize
from deferq.crashtest._persistence import (
    MODELS,
    Bound,
    PersistenceModel,
    choices,
    describe,
    resolve_model,
)
from deferq.crashtest._simenv import SimEnv
from deferq.crashtest._simfs import ROOT_INO, SimFs

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
        self.flocks: dict[int, object] = {}
        self._procs: dict[int, SimEnv] = {}
        self._spawned = 0
        self._last_pid = FIRST_PID - 1
        self.power_loss_count = 0
        if image is None:
            image = Image((Node(ROOT_PATH, ROOT_INO, 0o755, None),))
        # The storage: SimEnv calls it directly, holding ``lock``.
        self.fs = SimFs(self.clock, image)

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
            return self.fs.crash_input()

    def pending_ops(self) -> tuple[Op, ...]:
        """The log of un-persisted operations, in program order."""
        with self.lock:
            return self.fs.pending_ops()

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
            origin = (self._uid, self.fs.version)
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
                if choice.origin != (self._uid, self.fs.version):
                    raise ValueError("that crash state was enumerated from another disk state")
                state = choice
            else:
                state = self._random_state(chosen, choice)
            for pid in list(self._procs):
                self.kill(pid)
            self.flocks.clear()
            self.fs.load_image(state.image)
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
                          self.clock.time_s, self.clock.monotonic_s, (self._uid, self.fs.version))

    def sync(self) -> None:
        """``sync(2)`` plus an fsync of every directory: the whole log becomes durable."""
        with self.lock:
            self.fs.sync()

    # ------------------------------------------------------------------ inspection

    def read(self, path: str) -> bytes:
        """The bytes a process would read from ``path`` now."""
        with self.lock:
            return bytes(self.fs.file_at(path).data)

    def read_durable(self, path: str) -> bytes:
        """The durable bytes of the file ``path`` names now."""
        with self.lock:
            return self.fs.file_at(path).durable

    def exists(self, path: str) -> bool:
        with self.lock:
            try:
                return self.fs.resolve(path).node is not None
            except OSError:
                return False

    def is_dir(self, path: str) -> bool:
        with self.lock:
            try:
                node = self.fs.resolve(path).node
            except OSError:
                return False
            return node is not None and node.is_dir

    def listdir(self, path: str) -> list[str]:
        """The names in a directory now, sorted."""
        with self.lock:
            node = self.fs.resolve(path).node
            if node is None or not node.is_dir:
                raise os_error(errno.ENOTDIR if node else errno.ENOENT, path)
            return sorted(node.entries)

    def files(self) -> dict[str, bytes]:
        """Every file path a process can see now, with its bytes."""
        return self.volatile_image().files()

    def volatile_image(self) -> Image:
        """What processes see now, as an ``Image``."""
        with self.lock:
            return self.fs.volatile_image()

    def durable_image(self) -> Image:
        """What survives a power loss for sure: the durable state without any of the log."""
        with self.lock:
            return self.fs.durable_image()

    def damage_at_rest(self, path: str, offset: int, data: bytes) -> None:
        """Overwrite durable bytes of a file on the medium (and in the cache), logging nothing."""
        with self.lock:
            self.fs.damage_at_rest(path, offset, data)

    def check_invariants(self) -> None:
        """Assert that the volatile state is the durable state plus the log."""
        with self.lock:
            self.fs.check_invariants()
