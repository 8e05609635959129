"""Hand-off WAL files: tasks written for a running worker to adopt (spec/wal.md W-34).

Rules: ``deferq dead retry`` is a short-lived process, not a worker: it must not leave a
worker's WAL behind (a main file reserves 1 MiB ahead of its records, W-25), nor run the
tasks itself. So its tasks are buffered, and ``sync`` writes them into a new WAL file
exactly as large as its records: created, locked and made durable by name as any WAL file
(W-1), then the seed marker (W-28) and one ``add`` record per task, one fsync, and the
lock released. The file is then an orphan like a dead worker's (W-27): the adoption
sweep of a running worker (W-30) or the next worker to open the directory adopts it and
unlinks it. A failed write or fsync unlinks the file durably (W-10's discard) and raises:
nothing was acknowledged. Ids are generated per W-28 from this process's own id source,
whose floor is first raised above every seed in the prefix's WAL files, read read-only
(no lock, no adoption): this process's pid may be an earlier process's (a container), and
a live worker or another hand-off file must never already hold an id generated here, or
the adopting worker would leave the retried task out (W-33).
"""

from __future__ import annotations

import logging

from deferq._core.errors import UnsafeEntryError
from deferq._core.walcodec import encode_add
from deferq._engine.env import Env, OpenFlag
from deferq._engine.ids import id_source
from deferq._engine.io import join
from deferq._engine.walbase import WalState
from deferq._engine.walfiles import WalFiles

log = logging.getLogger("deferq")


class HandoffWal(WalFiles):
    """Buffers tasks and writes them as an exact-size orphan WAL file at ``sync`` (W-34).

    Not thread-safe: one caller (the operator's retry) uses it, then closes it.
    """

    def __init__(self, env: Env, path: str, prefix: str) -> None:
        self._env = env
        self._path = path
        self._prefix = prefix
        self._pid = env.getpid()
        self._state = WalState.OPEN
        self._broken_reason = ""
        self._mutex = env.mutex()
        self._held_fds = []
        self._live = {}
        self._ids = id_source(env)
        self._floor_raised = False  # until the first id is generated (W-34)
        self.file_names: list[str] = []  # the hand-off files written, in order

    def _directory_seed_max(self) -> int:
        """Implements W-34: the largest seed (W-28) in the prefix's WAL files, read read-only.

        A file unlinked between the listing and its open was adopted or rotated away, and
        the copy holding its records and seed may have been created after the listing;
        so the listing is read again, until every file it names was read.
        """
        seed_max = 0
        vanished = True
        while vanished:
            vanished = False
            for name in self._orphan_names():
                try:
                    fd = self._env.open(join(self._path, name), OpenFlag.READ)
                except FileNotFoundError:
                    vanished = True
                    continue
                except UnsafeEntryError as exc:
                    log.warning("skipping %s: %s", name, exc)  # F-16, F-27: not ours to read
                    continue
                try:
                    seed_max = max(seed_max, self._replay([(name, fd)]).seed_max)
                finally:
                    self._close_fds([fd])
        return seed_max

    def add_task(self, context: bytes, publish_at: int | None = None,
                 task_id: str | None = None) -> str:
        """Buffer a task under a new id (W-28), or ``task_id`` (the caller's, valid and used
        nowhere else, W-15), and return the id; ``sync`` writes it."""
        self._check_usable()
        if task_id is None:
            if not self._floor_raised:
                self._ids.raise_floor(self._directory_seed_max() + 1)  # W-34, W-28
                self._floor_raised = True
            task_id = self._ids.next_id(self._pid, self._env.monotonic())
        self._live[task_id] = encode_add(task_id, publish_at, context)
        return task_id

    def sync(self) -> None:
        """Implements W-34: write the buffered tasks into a new file, fsync it, release it."""
        self._check_usable()
        if not self._live:
            return
        name, fd = self._write_fresh_copy()  # W-1, the seed marker, the records, fsync
        self._live = {}
        self.file_names.append(name)
        self._close_fds([fd])  # the lock goes with it: the file is an orphan now (W-27)

    def close(self) -> None:
        """Release any file kept locked after a failed discard; buffered tasks are dropped."""
        if self._state is not WalState.CLOSED:
            self._state = WalState.CLOSED
            self._live = {}
            self._close_fds(self._held_fds)
            self._held_fds = []

    def __enter__(self) -> HandoffWal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
