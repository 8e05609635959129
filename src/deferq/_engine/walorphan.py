"""Hand-off WAL files: tasks written for a running worker to adopt (spec/wal.md W-34).

Rules: ``deferq dead retry`` is a short-lived process, not a worker: it must not leave a
worker's WAL behind (a main file reserves 1 MiB ahead of its records, W-25), nor run the
tasks itself. So its tasks are buffered, and ``sync`` writes them into a new WAL file
exactly as large as its records: created, locked and made durable by name as any WAL file
(W-1), then the seed marker (W-28) and one ``add`` record per task, one fsync, and the
lock released. The file is then an orphan like a dead worker's (W-27): the adoption
sweep of a running worker (W-30) or the next worker to open the directory adopts it and
unlinks it. A failed write or fsync unlinks the file durably (W-10's discard) and raises:
nothing was acknowledged. Ids are generated per W-28 from this process's own id source.
"""

from __future__ import annotations

import threading

from deferq._core.walcodec import encode_add
from deferq._engine.env import Env
from deferq._engine.ids import id_source
from deferq._engine.walbase import WalState
from deferq._engine.walfiles import WalFiles


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
        self._mutex = threading.Lock()
        self._held_fds = []
        self._live = {}
        self._ids = id_source(env)
        self.file_names: list[str] = []  # the hand-off files written, in order

    def add_task(self, context: bytes, publish_at: int | None = None,
                 task_id: str | None = None) -> str:
        """Buffer a task under a new id (W-28), or ``task_id`` (the caller's, valid and used
        nowhere else, W-15), and return the id; ``sync`` writes it."""
        self._check_usable()
        if task_id is None:
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
