"""The dead-task store's adds: group commit and the durable append (spec/dead-tasks.md S-4, S-14).

Rules: a line is serialized before any lock is taken (S-4); it is acknowledged
only after the write that holds it and an fsync of the data file succeeded; a
failed write or fsync is cut back so no partial or unacknowledged line stays for
the next add to build on, and a failed fsync fail-stops the store (D-10, A-7).

Theory of operation: threads of one process that add at once are committed as a
group (S-14). A caller that finds no leader and nothing queued leads at once with
its own line. Otherwise it queues a request and waits; the thread that leads
takes the locks (L-1..L-3) and, in up to ``GROUP_COMMIT_ROUNDS_MAX`` rounds,
takes every queued line and appends them in one write and one fsync
(``_append_batch``, ``_append_durably``). Every caller of a batch gets the
batch's outcome; lines still queued when the locks cannot be taken fail with
that error, none of them written (L-3, D-8).

``DeadAdds`` is a mixin of ``deadstore.DeadTaskStore``, not a separate object: the
add path is tuned to microseconds (attribute reads on one object, no extra call
layer), the queue shares the store's state (its locks, its index, the compaction
mark), and the crash catalogue's mutants override ``add`` and ``_append_durably``
on the store. The attributes and methods declared below without a body are the
store's (``deadstore.py``), its reads' (``deadreads.py``) or its compaction's
(``compact.py``).
"""

from __future__ import annotations

import contextlib
import copy
import threading
from typing import TYPE_CHECKING, Final

from deferq._core.deadcodec import encode_dead
from deferq._core.errors import StorageBrokenError
from deferq._core.limits import FILE_MODE, GROUP_COMMIT_ROUNDS_MAX
from deferq._core.types import DeadTask
from deferq._engine.deadindex import DeadIndex
from deferq._engine.env import Condition, Env, FileStat, Mutex, OpenFlag
from deferq._engine.io import name_file, repair_tail, write_all

_APPEND: Final = OpenFlag.READ | OpenFlag.WRITE | OpenFlag.APPEND  # computed once: enum | costs
_APPEND_CREATE: Final = _APPEND | OpenFlag.CREATE


class _AddRequest:
    """One caller's line waiting for a group commit (S-14)."""

    __slots__ = ("claimed", "committer", "error", "finished", "line")

    def __init__(self, line: bytes) -> None:
        self.line = line
        self.claimed = False  # a leader took it: only that leader may finish it
        self.finished = False
        self.error: BaseException | None = None
        self.committer = 0  # the thread id of the leader that wrote it


class DeadAdds:
    """The adds of ``DeadTaskStore``: the group-commit queue and the durable append."""

    # The store's state (deadstore.DeadTaskStore.__init__ / _init_process_state).
    _env: Env
    _path: str
    _data: str
    _index: DeadIndex | None
    _mutex: Mutex  # the condition's lock (S-14)
    _cond: Condition
    _queue: list[_AddRequest]
    _leading: bool
    _waiting: int  # threads inside cond.wait() (S-14)

    if TYPE_CHECKING:  # defined by DeadTaskStore, DeadReads and DeadCompaction
        def _locked(self, operation: str) -> contextlib.AbstractContextManager[None]: ...
        def _open_data(self, flags: OpenFlag) -> int | None: ...
        def _fail_stop(self, message: str, exc: OSError) -> StorageBrokenError: ...
        def _checked_index(self, fd: int, stat: FileStat, *,
                           build: bool = False) -> DeadIndex | None: ...
        def _drop_index(self) -> None: ...
        def _settle_compaction(self) -> None: ...

    # ------------------------------------------------------------------ group commit

    def add(self, task: DeadTask) -> str:
        """Append one dead task durably (S-4), committed with concurrent adds (S-14).

        ``task`` was validated by the caller.
        """
        line = encode_dead(task)  # Implements S-4: serialize before locking.
        with self._mutex:
            # Implements S-14. A caller that finds no leader and nothing queued leads at once
            # with its own line as the first batch: no request to hand over, its error is
            # its own (the usual case, one thread adding).
            solo = not self._leading and not self._queue
            if solo:
                self._leading = True
        if solo:
            try:
                self._lead_adds(line)
            finally:
                self._end_lead()
            return task.id
        return self._add_queued(_AddRequest(line), task.id)

    def _add_queued(self, request: _AddRequest, task_id: str) -> str:
        """S-14 with a leader at work or lines queued: queue, then wait or lead."""
        cond = self._cond
        with self._mutex:
            self._queue.append(request)
            # Implements S-14: one thread of this process at a time tries to take the locks
            # for the queued lines (the leader); the others wait for its outcome.
            while not request.finished and self._leading:
                self._waiting += 1
                try:
                    cond.wait()
                finally:
                    self._waiting -= 1
            lead = not request.finished
            if lead:
                self._leading = True
        if lead:
            try:
                self._lead_adds()
            finally:
                self._end_lead()
        error = request.error
        if error is not None:
            if request.committer == threading.get_ident():
                raise error
            # Another thread's batch failed with this line in it (S-14): the same error,
            # as a copy, so that each thread's traceback is its own.
            clone = copy.copy(error)
            clone.__cause__ = error.__cause__
            raise clone
        return task_id

    def _end_lead(self) -> None:
        """The leader is done: a waiting caller (if any) may lead next (S-14)."""
        with self._mutex:
            self._leading = False
            if self._waiting:  # a notify costs microseconds; nobody may be waiting
                self._cond.notify_all()

    def _lead_adds(self, first: bytes | None = None) -> None:
        """Implements S-14: take the locks, then commit the queued lines in rounds.

        ``first`` is the leader's own line when it queued none (``add``'s solo case):
        it is the first round's batch, alone, and a failure to write it is raised
        here after the locks are released, as a failed batch fails its callers.
        If the locks cannot be taken (L-3) or the store refuses work, every line still
        queued fails with that error, none of it written; the exception propagates.
        """
        cond = self._cond
        mutex = self._mutex
        me = threading.get_ident()
        first_error: BaseException | None = None
        try:
            with self._locked("add a task to"):
                rounds = GROUP_COMMIT_ROUNDS_MAX
                if first is not None:
                    rounds -= 1
                    try:
                        self._append_batch([first])
                    except BaseException as exc:  # raised once the locks are released
                        first_error = exc
                        rounds = 0
                for _ in range(rounds):
                    with mutex:
                        batch, self._queue = self._queue, []
                        for queued in batch:
                            queued.claimed = True
                            queued.committer = me
                    if not batch:
                        break
                    error: BaseException | None = None
                    try:
                        self._append_batch([queued.line for queued in batch])
                    except BaseException as exc:  # every caller of the batch gets it (S-14)
                        error = exc
                    with mutex:
                        for queued in batch:
                            queued.error = error
                            queued.finished = True
                        if self._waiting:
                            cond.notify_all()
                    if error is not None:
                        break
        except BaseException as exc:
            with mutex:
                left, self._queue = self._queue, []
                for queued in left:  # L-3, D-8: withdrawn, nothing of them was written
                    queued.error = exc
                    queued.committer = me
                    queued.finished = True
                cond.notify_all()
            raise
        if first_error is not None:
            raise first_error

    # ------------------------------------------------------------------ the durable append

    def _append_batch(self, lines: list[bytes]) -> None:
        """One write and one fsync for every line of a group (S-4, S-14), under the locks."""
        env = self._env
        self._settle_compaction()
        fd = self._open_data(_APPEND)
        created = fd is None
        if fd is None:
            # S-1: someone removed the data file; recreate it and make its name durable.
            fd = env.open(self._data, _APPEND_CREATE, FILE_MODE)
        try:
            index = None if self._index is None else self._checked_index(fd, env.fstat(fd))
            self._append_durably(fd, lines[0] if len(lines) == 1 else b"".join(lines))
            if index is not None:
                try:
                    index.extend(env, fd, env.fstat(fd).size)  # S-10: our own append
                except OSError:
                    self._drop_index()  # the add is durable; only the index is lost
        finally:
            env.close(fd)
        if created:
            try:
                env.fsync_dir(self._path)
            except OSError as exc:
                raise self._fail_stop("fsync of the storage directory failed",
                                      name_file(exc, self._path)) from exc

    def _append_durably(self, fd: int, line: bytes) -> None:
        """Implements S-4: cut a torn tail, append, fsync; on failure cut the append back.

        Cutting back leaves no partial or unacknowledged line for the next add to
        build on. After a failed fsync the kernel may have dropped the pages and
        would report success next time (A-7), so the store also fail-stops.
        """
        env = self._env
        size = repair_tail(env, fd)
        try:
            written = env.write(fd, line)  # one write nearly always takes it all
            if written != len(line):
                if written <= 0:
                    raise OSError(f"write returned {written} with {len(line)} bytes left")
                write_all(env, fd, line[written:])
        except OSError as exc:
            name_file(exc, self._data)  # the message says which file is full or failed
            self._cut_back(fd, size)
            raise
        try:
            env.fsync(fd)
        except OSError as exc:
            name_file(exc, self._data)
            self._cut_back(fd, size)
            raise self._fail_stop("fsync of the dead-task data file failed", exc) from exc

    def _cut_back(self, fd: int, size: int) -> None:
        try:
            self._env.ftruncate(fd, size)
        except OSError as exc:
            raise self._fail_stop("a failed dead-task write could not be cut back",
                                  name_file(exc, self._data)) from exc
