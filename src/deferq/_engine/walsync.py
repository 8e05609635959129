"""The tasks WAL's durability: the periodic or inline fsync and group commit (spec/wal.md W-8,
W-12, W-20..W-23).

Rules: every record appended takes the next ticket; an fsync runs outside the mutex, at most
one at a time, and covers exactly the tickets taken before it began (its target is read under
the mutex first), so concurrent writers share fsyncs and none is acknowledged by an fsync
that started before its record existed (D-15). A failed fsync is never retried: the WAL is
broken and every ticket it did not cover fails (W-12, W-22). Part of ``TasksWal`` (see
``walbase``).
"""

from __future__ import annotations

from deferq._core.errors import StorageBrokenError
from deferq._engine.io import join, name_file
from deferq._engine.walbase import WalBase, WalState


class WalSync(WalBase):
    """Group commit: join the fsync in flight or lead the next one."""

    def _sync_locked(self) -> None:
        """Make every record written so far durable (W-8); the mutex is held (see W-21)."""
        self._sync_through_locked(self._written)

    def _sync_through_locked(self, ticket: int) -> None:
        """Implements W-21 (group commit): join the fsync in flight or lead the next one.

        The mutex is held on entry and on return, but not while an fsync runs: a
        follower waits on ``_synced`` (which releases it), a leader releases it
        around its fsync. An fsync in flight may have begun before this ticket's
        record was written, so waiting for it is never enough by itself: the loop
        ends only when ``_durable`` covers the ticket.
        """
        while self._durable < ticket:
            if self._state is not WalState.OPEN:
                if self._sync_failed:
                    raise StorageBrokenError(
                        "fsync of the tasks WAL failed before this write was durable "
                        f"({self._broken_reason})")
                self._check_usable()
            if self._syncing:
                self._synced.wait()
            else:
                self._lead_fsync()

    def _lead_fsync(self) -> None:
        """Implements W-20, W-21 and W-12: one fsync covering every record written before it began.

        The target is read, with the descriptor, under the mutex before the fsync
        starts; records appended while it runs get a later ticket and need the
        next fsync. A failed fsync is never retried: the WAL is broken and every
        ticket it did not already cover fails (W-22).
        """
        target, fd = self._written, self._fd
        failure: OSError | None = None
        self._syncing = True
        self._mutex.release()
        try:
            self._env.fsync(fd)
        except OSError as exc:
            failure = exc
        finally:
            self._mutex.acquire()
            self._syncing = False
            self._synced.notify_all()
        if failure is not None:
            # Implements W-12: never retry; the unsynced pages may already be gone.
            self._sync_failed = True
            name_file(failure, join(self._path, self._name))
            raise self._break(StorageBrokenError(
                f"fsync of the tasks WAL failed ({failure}); the backend stops")) from failure
        if target > self._durable:
            self._durable = target
        self._sync_due_s = self._env.monotonic() + self._fsync_frequency_s
