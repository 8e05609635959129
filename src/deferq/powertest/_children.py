"""Children: the role processes of the fault loop, forked, read through pipes, killed.

Rules. Each role runs as a forked child (``_workers.child_main``) that writes one JSON
event per line to its pipe; each start of a role is a new *incarnation* (``w0#3``),
the name the ledgers know it by. A pipe is read without blocking while the child
lives and to its end once it is dead (SIGKILL does not lose what was already written,
so every line before death is valid). A role that exits on its own is restarted at
once: work continues. Every event goes to the ``feed`` callback in the order the
events happened across pipes; a killed incarnation goes to ``forget`` once its pipe
is drained.

Theory of operation: one selector over the pipes' read ends; ``pump`` reads until a
deadline, merges the batches read by the time each event carries, and restarts the
roles that hit end of file. The harness decides when and whom to kill; this class
only knows how.
"""

from __future__ import annotations

import errno
import heapq
import json
import os
import random
import selectors
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from deferq.powertest._workers import Event, Role, child_main


@dataclass(slots=True)
class Child:
    """One incarnation of a role: its pid, the read end of its pipe, a partial line."""

    role: Role
    incarnation: str
    pid: int
    fd: int
    buf: bytes = b""
    alive: bool = True


class Children:
    """The running role processes over ``storage``; see the module doc."""

    def __init__(self, storage: str, rng: random.Random, feed: Callable[[Child, Event], None],
                 forget: Callable[[str], None]) -> None:
        self.storage = storage
        self.rng = rng
        self.feed = feed
        self.forget = forget
        self.procs: dict[str, Child] = {}
        self.selector = selectors.DefaultSelector()
        self.incarnations: dict[str, int] = {}

    def spawn(self, role: Role) -> None:
        """Fork a new incarnation of ``role``, its pipe registered with the selector."""
        n = self.incarnations[role.name] = self.incarnations.get(role.name, 0) + 1
        incarnation = f"{role.name}#{n}"
        read_fd, write_fd = os.pipe()
        seed = self.rng.getrandbits(64)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            try:
                os.close(read_fd)
                for proc in self.procs.values():
                    os.close(proc.fd)
                self.selector.close()
            finally:
                child_main(role, incarnation, self.storage, seed, write_fd)
        os.close(write_fd)
        os.set_blocking(read_fd, False)
        proc = Child(role, incarnation, pid, read_fd)
        self.procs[role.name] = proc
        self.selector.register(read_fd, selectors.EVENT_READ, proc)

    def _take(self, proc: Child, data: bytes) -> list[Event]:
        """The complete event lines of ``data`` (what follows the last newline waits)."""
        proc.buf += data
        *lines, proc.buf = proc.buf.split(b"\n")
        return [json.loads(line) for line in lines]

    def _feed_merged(self, batches: list[tuple[Child, list[Event]]]) -> None:
        """Feed several processes' events in the order they happened.

        Each pipe is in order, but pipes are read one after the other: a process may
        act on another's acknowledged write (an operator removes a dead task it just
        listed) while the harness has not read the first pipe yet. So the streams are
        merged by the time each event carries (an event without one keeps its stream's
        last time), never reordering a stream.
        """
        heads: list[tuple[float, int, int]] = []
        last = [0.0] * len(batches)

        def when(b: int, i: int) -> float:
            t = batches[b][1][i].get("t")
            if isinstance(t, float):
                last[b] = t
            return last[b]

        for b, (_, events) in enumerate(batches):
            if events:
                heapq.heappush(heads, (when(b, 0), b, 0))
        while heads:
            _, b, i = heapq.heappop(heads)
            proc, events = batches[b]
            self.feed(proc, events[i])
            if i + 1 < len(events):
                heapq.heappush(heads, (when(b, i + 1), b, i + 1))

    def _close(self, proc: Child) -> None:
        """Reap a dead child and close its pipe (once)."""
        if not proc.alive:
            return
        proc.alive = False
        self.selector.unregister(proc.fd)
        os.close(proc.fd)
        os.waitpid(proc.pid, 0)

    def _read(self, proc: Child, *, to_eof: bool = False) -> tuple[list[Event], bool]:
        """Everything readable now (``to_eof``: until the writer is gone); (events, at EOF)."""
        os.set_blocking(proc.fd, to_eof)
        events: list[Event] = []
        while True:
            try:
                data = os.read(proc.fd, 1 << 16)
            except BlockingIOError:
                return events, False
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                raise
            if not data:
                return events, True
            events += self._take(proc, data)

    def _read_all(self, dead: list[Child]) -> None:
        """Read the ``dead`` processes' pipes to their end and what the others hold, merged."""
        batches = [(proc, self._read(proc, to_eof=True)[0]) for proc in dead]
        others = [p for p in self.procs.values() if p.alive and p not in dead]
        batches += [(proc, self._read(proc)[0]) for proc in others]
        self._feed_merged(batches)

    def pump(self, until: float) -> None:
        """Read every pipe until the monotonic time ``until``; restart roles that exited."""
        while (left := until - time.monotonic()) > 0:
            ready = self.selector.select(timeout=left)
            batches: list[tuple[Child, list[Event]]] = []
            gone: list[Child] = []
            for key, _ in ready:
                proc = key.data
                assert isinstance(proc, Child)
                events, eof = self._read(proc)
                batches.append((proc, events))
                if eof:
                    gone.append(proc)
            self._feed_merged(batches)
            for proc in gone:
                self._close(proc)
                self.spawn(proc.role)  # work continues

    def kill(self, proc: Child) -> None:
        """SIGKILL, then read the pipe to its end: lines written before death are valid."""
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._read_all([proc])
        self.forget(proc.incarnation)
        self._close(proc)

    def kill_all(self) -> None:
        """SIGKILL every live child, then drain every pipe (merged) and forget them all."""
        victims = [proc for proc in self.procs.values() if proc.alive]
        for proc in victims:
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._read_all(victims)
        for proc in victims:
            self.forget(proc.incarnation)
            self._close(proc)
        self.procs.clear()
