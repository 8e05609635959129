"""Task-id generation: Lamport-seeded ids ``{seed}-{pid}-{n}`` (W-28).

Theory of operation: a seed is an integer that starts above the wall clock and
above every id seed found in the WAL files a worker adopted, and then advances
by one per elapsed second of the monotonic clock (never re-read from the wall
clock, so a clock stepped back cannot move it back). ``n`` counts ids within
one seed value. Ids are unique across processes because the pid is part of
them (A-10), and within a process because every ``Disk`` of one ``Env`` (one
real or simulated process) draws from the same ``IdSource``: two backends open
at once on one directory would otherwise start from the same seed.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Iterator

from deferq._core.errors import LimitExceededError
from deferq._core.limits import INT_FIELD_MAX, SEED_TICK_S
from deferq._engine.env import Env


class IdSource:
    """The id generator of one process (one ``Env``). Thread-safe.

    Hot path: ``next_id`` takes no lock. ``_hot`` is one tuple (the monotonic time
    of the next tick, pid, the id prefix ``{seed}-{pid}-``, the seed's counter),
    replaced whole under the
    mutex whenever the seed or the pid changes, so a reader always pairs a seed
    with that seed's own counter (``next`` on an ``itertools.count`` is atomic
    under the GIL); a reader holding a replaced tuple still draws fresh numbers
    of its older seed, which no later tuple ever reuses (seeds only grow).
    """

    def __init__(self, env: Env) -> None:
        self._env = env
        self._mutex = env.mutex()  # M-15: held across a clock read (a seam call)
        self._base = int(env.time()) + 1
        self._monotonic = env.monotonic
        self._start_s = env.monotonic()
        self._ticks = 0
        self._seed = 0
        self._counter: Iterator[int] = itertools.count(1)
        # No pid is -1, so the first call takes the mutex.
        self._hot: tuple[float, int, str, Iterator[int]] = (0.0, -1, "", self._counter)

    def _advance(self) -> int:
        """The seed now; a new seed value gets a new counter. The mutex is held."""
        ticks = int((self._monotonic() - self._start_s) / SEED_TICK_S)
        if ticks > self._ticks:
            self._ticks = ticks
        seed = self._base + self._ticks
        if seed != self._seed:
            self._seed = seed
            self._counter = itertools.count(1)
        return seed

    def raise_floor(self, seed_floor: int) -> None:
        """Make the current seed at least ``seed_floor`` (a seed found in adopted files + 1)."""
        with self._mutex:
            seed = self._advance()
            if seed_floor > seed:
                self._base += seed_floor - seed
                self._advance()
                self._hot = (0.0, -1, "", self._counter)

    def next_id(self, pid: int, now: float) -> str:
        """A new id, never issued before by this source; ``now`` is the Env's monotonic clock."""
        hot = self._hot
        if hot[1] == pid and now < hot[0]:
            return f"{hot[2]}{next(hot[3])}"
        with self._mutex:
            seed = self._advance()
            if seed > INT_FIELD_MAX:
                # Implements W-28: a seed no reader parses back would let a later start
                # issue the same ids again; only a record deferq refuses to write today
                # (C-24) can bring the seed here.
                raise LimitExceededError(
                    f"no task id can be generated: the seed {seed} is above {INT_FIELD_MAX}, "
                    f"pushed there by an id in the storage directory; pass task_id= instead")
            # The hot tuple serves until the clock reaches the next tick (it may then
            # still serve a moment, with its own seed's counter: see the class doc).
            hot = self._hot = (self._start_s + (self._ticks + 1) * SEED_TICK_S, pid,
                               f"{seed}-{pid}-", self._counter)
            return f"{hot[2]}{next(hot[3])}"

    def current_seed(self) -> int:
        """The seed now, for the rotation marker (W-28), at most what a reader parses back."""
        with self._mutex:
            return min(self._advance(), INT_FIELD_MAX)


_SOURCES: weakref.WeakKeyDictionary[Env, IdSource] = weakref.WeakKeyDictionary()
_SOURCES_MUTEX = threading.Lock()


def id_source(env: Env) -> IdSource:
    """The one id source of this Env's process."""
    # A storage directory's own Env (osenv.DirEnv, F-25) shares its process's source (W-28).
    key: Env = getattr(env, "process_env", env)
    with _SOURCES_MUTEX:
        source = _SOURCES.get(key)
    if source is not None:
        return source
    # Built outside the registry's mutex: building reads the Env's clocks, seam calls at which
    # the simulator may switch threads, and no real lock may be held across one (M-15).
    # Two threads that race here build two; the registry keeps the first.
    fresh = IdSource(key)
    with _SOURCES_MUTEX:
        return _SOURCES.setdefault(key, fresh)
