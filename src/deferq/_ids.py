"""Task-id generation: Lamport-seeded ids ``{seed}-{pid}-{n}`` (W-5).

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

import threading
import weakref

from deferq._env import Env
from deferq._limits import SEED_TICK_S


class IdSource:
    """The id generator of one process (one ``Env``). Thread-safe."""

    def __init__(self, env: Env) -> None:
        self._env = env
        self._mutex = threading.Lock()
        self._base = int(env.time()) + 1
        self._start_s = env.monotonic()
        self._ticks = 0
        self._counter = 0

    def _advance(self) -> int:
        ticks = int((self._env.monotonic() - self._start_s) / SEED_TICK_S)
        if ticks > self._ticks:
            self._ticks = ticks
            self._counter = 0
        return self._base + self._ticks

    def raise_floor(self, seed_floor: int) -> None:
        """Make the current seed at least ``seed_floor`` (a seed found in adopted files + 1)."""
        with self._mutex:
            seed = self._advance()
            if seed_floor > seed:
                self._base += seed_floor - seed
                self._counter = 0

    def next_id(self, pid: int) -> str:
        """A new id, never issued before by this source."""
        with self._mutex:
            seed = self._advance()
            self._counter += 1
            return f"{seed}-{pid}-{self._counter}"

    def current_seed(self) -> int:
        """The seed now, for the rotation marker (W-5)."""
        with self._mutex:
            return self._advance()


_SOURCES: weakref.WeakKeyDictionary[Env, IdSource] = weakref.WeakKeyDictionary()
_SOURCES_MUTEX = threading.Lock()


def id_source(env: Env) -> IdSource:
    """The one id source of this Env's process."""
    with _SOURCES_MUTEX:
        source = _SOURCES.get(env)
        if source is None:
            source = _SOURCES[env] = IdSource(env)
        return source
