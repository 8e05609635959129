"""RecoveryCheck: the check that ends every cycle of the fault loop, after the crash.

Rules (numbered as in ``_harness``):

1. ``observe`` the raw files and check them against the model (D-1..D-4, D-7,
   D-9, D-12, D-13): nothing acknowledged and durable is lost, nothing invented.
2. Recover with a real ``Disk``: it must open every file, show the same pending
   ids and dead tasks as the raw files (W-3, W-4, R-@H), and accept one new add
   and one new dead task (the canary: work continues).
3. ``observe`` again: no torn tail may be left (W-3, D-12), no more damaged lines
   than after the previous recovery, ``deferq verify`` must be clean, and the state
   must match the model exactly (the merge lost nothing, W-4).

Each failure is a violation appended to the ledger's list; when a cycle finds one and
an evidence directory is configured, the files as recovered are kept there. A ``Disk``
that cannot open the recovered storage ends the run (the exception propagates).

Theory of operation: the check owns only what carries over between cycles (the
damaged-line count of the last recovery, the canary acknowledgements); the ledgers
and the summary belong to the harness and are shared with it.
"""

from __future__ import annotations

import importlib
import os
import shutil

from deferq._core.errors import DeferqError
from deferq._core.limits import DEFAULT_PREFIX
from deferq._core.model import Crash, Dead, Pending
from deferq._engine.osenv import OS_ENV
from deferq.backends import Disk
from deferq.powertest._check import Ledger
from deferq.powertest._observe import Observation, observe
from deferq.powertest._qcheck import QueueLedger
from deferq.powertest._results import Summary
from deferq.powertest._workers import digest


class RecoveryCheck:
    """Checks ``storage`` after each crash; ``workdir`` holds the scratch copy of evidence."""

    def __init__(self, storage: str, workdir: str, evidence_dir: str | None, ledger: Ledger,
                 qledger: QueueLedger, summary: Summary) -> None:
        self.storage = storage
        self.workdir = workdir
        self.evidence_dir = evidence_dir
        self.ledger = ledger
        self.qledger = qledger
        self.summary = summary
        self.canary_acks = 0
        self.damaged_before = 0  # damaged lines left after the previous recovery + add

    def check(self, cycle: int, crash: Crash) -> None:
        """Run the check of the module doc after ``cycle`` ended in ``crash``."""
        label = f"cycle {cycle} ({crash.value})"
        ledger = self.ledger
        before = len(ledger.violations)
        evidence = os.path.join(self.workdir, "evidence")
        if self.evidence_dir is not None:
            shutil.rmtree(evidence, ignore_errors=True)
            shutil.copytree(self.storage, evidence)
        try:
            self._check(cycle, crash, label)
        finally:
            if len(ledger.violations) > before and self.evidence_dir is not None:
                kept = os.path.join(self.evidence_dir, f"cycle-{cycle}")
                shutil.rmtree(kept, ignore_errors=True)
                shutil.copytree(evidence, kept)
                ledger.violations.append(f"{label}: the files as recovered are kept in {kept}")

    def _check(self, cycle: int, crash: Crash, label: str) -> None:
        ledger = self.ledger
        obs = observe(self.storage, DEFAULT_PREFIX)
        self.summary.torn_tails += obs.torn
        self.summary.damaged_lines += obs.damaged
        try:
            disk = Disk(path=self.storage, fsync_frequency=0)
        except (DeferqError, OSError) as exc:
            ledger.check(obs, crash, label)
            ledger.violations.append(f"{label}: Disk could not open the recovered storage: "
                                     f"{type(exc).__name__}: {exc}")
            raise
        with disk:
            pending = {t.task_id: Pending(digest(t.context).encode(), t.publish_at)
                       for t in disk.pending_tasks()}
            dead = {t.id: Dead(digest(t.context).encode(), t.task_class, t.attempts,
                               t.exception_message) for t in disk.list_dead_tasks()}
            ledger.check(obs, crash, label)
            self.qledger.check(obs, label)
            self._compare(obs, pending, dead, label)
            self._canary(disk, cycle)
        after = observe(self.storage, DEFAULT_PREFIX)
        self.summary.damaged_after_add += after.damaged
        if after.damaged > self.damaged_before:
            ledger.violations.append(
                f"{label}: after recovery and one add, {after.damaged} damaged line(s) remain "
                f"(was {self.damaged_before}): {[f.name for f in after.files if f.damaged]}")
        self.damaged_before = after.damaged
        damaged = verify_damage(self.storage)
        if damaged:
            ledger.violations.append(f"{label}: deferq verify is not clean after recovery and one"
                                     f" add: {damaged}")
        if after.torn:
            ledger.violations.append(
                f"{label}: after recovery and one add a torn tail is left: "
                f"{[f.name for f in after.files if f.torn_bytes]}")
        ledger.check(after, Crash.PROCESS_KILL, f"{label}, after recovery and one add")

    def _compare(self, obs: Observation, pending: dict[str, Pending], dead: dict[str, Dead],
                 label: str) -> None:
        """The engine's recovery must show what the raw files hold (W-3, W-4, R-@H)."""
        violations = self.ledger.violations
        for task_id, task in pending.items():
            copies = obs.pending.get(task_id, [])
            if task not in copies:
                violations.append(f"{label}: Disk recovered {task_id!r} with bytes not in any"
                                  f" WAL file")
            elif len(copies) > 1:
                # An id pending in two WALs: adopt what the merge kept (at-least-once).
                history = self.ledger.model.wal.get(task_id)
                if history is not None and history.known != task:
                    self.summary.stale_merges += 1
                    history.known = task
        for task_id in sorted(set(obs.pending) ^ set(pending)):
            violations.append(
                f"{label}: the raw files and Disk disagree on whether {task_id!r} is pending")
        if obs.dead != dead:
            violations.append(f"{label}: the raw files and Disk disagree on the dead tasks: "
                              f"{sorted(set(obs.dead) ^ set(dead))}")

    def _canary(self, disk: Disk, cycle: int) -> None:
        """One new add and one new dead task after every recovery: work continues."""
        ledger = self.ledger
        context = f"canary|{cycle}|a=0|".encode()
        task_id = f"canary-{cycle}"
        op = ledger.checker_add(task_id, context)
        disk.add_task(context, None, task_id)
        ledger.model.acked(op, durable=True)
        record = Dead(digest(context).encode(), "Canary", 1, "canary")
        op = ledger.checker_dead(f"canary-dead-{cycle}", record)
        disk.add_dead_task(f"canary-dead-{cycle}", context, RuntimeError("canary"),
                           task_class="Canary", attempts=1)
        ledger.model.acked(op)
        self.canary_acks += 2

def verify_damage(storage: str) -> list[str]:
    """What ``deferq verify`` (``deferq._engine.verify``, when this build has it) finds damaged."""
    try:
        verify = importlib.import_module("deferq._engine.verify")
    except ModuleNotFoundError:
        return []
    reports = verify.verify_directory(OS_ENV, storage, DEFAULT_PREFIX)
    return [f"{r.name}: {dict(r.faults)} torn tail {r.torn_tail_bytes} B" for r in reports
            if r is not None and (r.faults or r.torn_tail_bytes)]
