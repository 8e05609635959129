"""The fault loop: real workers on a fresh ext4 image, SIGKILLs and power cuts, and a check after each.

Theory of operation. One cycle: (re)start every role as a forked process (it
opens ``Disk`` on the mounted image, adopting orphaned WALs); let them work for
a random 30-120 ms while the harness reads their event pipes into the
``Ledger``; maybe SIGKILL one of them at a random moment and restart it at once
(it adopts the orphan while the others keep working); end the cycle with a
SIGKILL of every process or with a power cut (the ext4 shutdown ioctl with
NOLOGFLUSH, then SIGKILL, unmount, mount: journal replay). Then:

1. ``observe`` the raw files and check them against the model (D-1..D-4, D-7,
   D-9, D-12, D-13): nothing acknowledged and durable is lost, nothing invented.
2. Recover with a real ``Disk``: it must open every file, show the same pending
   ids and dead tasks, and accept one new add and one new dead task.
3. ``observe`` again: no torn tail may be left (W-3, D-12), and the state must
   match the model exactly (the merge lost nothing, W-4).

Work must continue: a role that dies on its own outside a power cut, or a run
of cycles without a single acknowledgement, is a violation too.

The parts: ``_children`` forks the roles and reads their pipes, ``_recheck`` is the
check after each cycle (steps 1-3), ``_results`` holds the config and the summary; this
module is the loop that drives them, the final drain, and the role sets.

Queue-level roles (``_queue_roles``: a real ``Queue`` over a reporting ``Disk``)
feed the same model through the same events; ``_qcheck.QueueLedger`` also
follows each enqueued task to its end (D-13, Q-2, Q-3, Q-8, Q-9, Q-33). After
the last cycle of a run with queue roles, a ``drain`` queue runs every task
left to its end, and every acknowledged, durable enqueue must be accounted for.
"""

from __future__ import annotations

import json
import os
import random
import time
from typing import IO

from deferq._core.errors import DeferqError
from deferq._core.limits import DEFAULT_PREFIX
from deferq._core.model import Crash
from deferq.powertest._check import Ledger
from deferq.powertest._children import Child, Children
from deferq.powertest._fs import Image, MountError
from deferq.powertest._observe import observe
from deferq.powertest._qcheck import QueueLedger
from deferq.powertest._queue_roles import QUEUE_BODIES
from deferq.powertest._recheck import RecoveryCheck
from deferq.powertest._results import PowerConfig, Summary
from deferq.powertest._workers import Event, Role

__all__ = ["ROLE_SETS", "Harness", "PowerConfig", "Summary", "run_power_test"]

STORAGE_ROLES: tuple[Role, ...] = (
    Role("w0", "worker", 0.0),
    Role("w1", "worker", 0.0),
    Role("w2", "worker", 0.02),  # timer fsyncs plus explicit sync(): D-2
    Role("op", "operator", 0.0),
)
DEFAULT_ROLES = STORAGE_ROLES
QUEUE_ROLES: tuple[Role, ...] = (
    Role("q0", "queue", 0.0),
    Role("q1", "queue", 0.0),
    Role("q2", "queue", 0.02),  # timer fsyncs, sync() and queue stop/start at times
    Role("qop", "qop", 0.0),
)
MIXED_ROLES: tuple[Role, ...] = (
    Role("w0", "worker", 0.0),
    Role("w2", "worker", 0.02),
    Role("q0", "queue", 0.0),
    Role("q2", "queue", 0.02),
    Role("qop", "qop", 0.0),
)
ROLE_SETS: dict[str, tuple[Role, ...]] = {
    "storage": STORAGE_ROLES, "queue": QUEUE_ROLES, "mixed": MIXED_ROLES}
# How long the roles work per cycle. A queue process needs 30-150 ms to open its Disk
# (adopting and copying orphaned WALs) and start its queue before it runs anything.
WORK_S: dict[str, tuple[float, float]] = {
    "storage": (0.03, 0.12), "queue": (0.08, 0.3), "mixed": (0.06, 0.25)}
DRAIN_ROLE = Role("drain", "drain", 0.0)
DRAIN_TIMEOUT_S = 60.0
STALL_CYCLES_MAX = 15


class Harness:
    """Runs the fault loop on one image; ``run`` returns the summary."""

    def __init__(self, config: PowerConfig, image: Image) -> None:
        self.config = config
        self.image = image
        self.storage = os.path.join(image.mountpoint, "storage")
        self.rng = random.Random(config.seed)
        self.ledger = Ledger()
        self.summary = Summary()
        if config.workers not in ROLE_SETS:
            raise ValueError(f"workers must be one of {sorted(ROLE_SETS)}, got {config.workers!r}")
        self.roles = config.roles if config.roles is not None else ROLE_SETS[config.workers]
        self.qledger = QueueLedger([r.name for r in self.roles + (DRAIN_ROLE,)
                                    if r.body in QUEUE_BODIES])
        self.qledger.violations = self.ledger.violations  # one list, in the order found
        self.ledger.on_bind = self.qledger.bind_unknown
        self.has_queue = any(r.body in QUEUE_BODIES for r in self.roles)
        self.drained = False
        self.log: IO[str] | None = open(config.log_path, "a") if config.log_path else None
        self.expect_exits = False
        self.children = Children(self.storage, self.rng, self._feed_event, self._forget)
        self.checker = RecoveryCheck(self.storage, image.workdir, config.evidence_dir,
                                     self.ledger, self.qledger, self.summary)

    # ------------------------------------------------------------------ events
    def _feed_event(self, proc: Child, event: Event) -> None:
        if self.log is not None:
            self.log.write(json.dumps({"w": proc.incarnation, **event}) + "\n")
        self.ledger.on_event(proc.incarnation, event)
        self.qledger.expect_errors = self.expect_exits
        self.qledger.on_event(proc.incarnation, event)
        if event["e"] == "Q" and event["k"] == "drained":
            self.drained = True
        if event["e"] == "X" and not self.expect_exits:
            self._self_exit(proc, event)

    def _self_exit(self, proc: Child, event: Event) -> None:
        self.summary.self_exits += 1
        if event.get("x") != "DeadTasksLockTimeout":  # D-8: a bounded lock wait is allowed
            self.ledger.violations.append(
                f"{proc.incarnation} stopped working without a crash: {event.get('x')}: "
                f"{event.get('m')}\n{event.get('tb')}")

    def _forget(self, incarnation: str) -> None:
        """A killed incarnation's pipe is drained: its operations in flight are now lost."""
        self.ledger.forget(incarnation)
        self.qledger.forget(incarnation)

    # ------------------------------------------------------------------ the loop
    def run(self) -> Summary:
        start = time.monotonic()
        stalled = queue_stalled = 0
        fatal = False
        try:
            for cycle in range(1, self.config.cycles + 1):
                acked_before = self.ledger.acknowledged
                runs_before = self.qledger.stats.runs
                seen = len(self.ledger.violations)
                try:
                    self.cycle(cycle)
                except (DeferqError, OSError, MountError) as exc:
                    # Recovery failed (or the filesystem would not come back): nothing more
                    # can be checked on this image. It is a violation, and the run ends here.
                    self.ledger.violations.append(
                        f"cycle {cycle}: the run stopped: {type(exc).__name__}: {exc}")
                    self.summary.cycles = cycle
                    fatal = True
                    break
                if self.config.progress is not None:
                    for violation in self.ledger.violations[seen:]:
                        print(f"  VIOLATION {violation}", file=self.config.progress, flush=True)
                stalled = stalled + 1 if self.ledger.acknowledged == acked_before else 0
                if stalled >= STALL_CYCLES_MAX:
                    self.ledger.violations.append(
                        f"cycle {cycle}: no operation acknowledged in {stalled} cycles")
                    stalled = 0
                queue_stalled = queue_stalled + 1 if (
                    self.has_queue and self.qledger.stats.runs == runs_before) else 0
                if queue_stalled >= STALL_CYCLES_MAX:
                    self.ledger.violations.append(
                        f"cycle {cycle}: no queue ran a task in {queue_stalled} cycles")
                    queue_stalled = 0
                self.summary.cycles = cycle
                self._sync_summary()
                if self.config.progress is not None and cycle % 25 == 0:
                    print(f"  cycle {cycle}: {self.summary.line()[12:]}",
                          file=self.config.progress, flush=True)
            if self.has_queue and not fatal:
                try:
                    self.drain()
                except (DeferqError, OSError, MountError) as exc:
                    self.ledger.violations.append(
                        f"final drain: stopped: {type(exc).__name__}: {exc}")
        finally:
            self.expect_exits = True
            self.children.kill_all()
            self.children.selector.close()
            if self.log is not None:
                self.log.close()
            self.summary.seconds = time.monotonic() - start
            self._sync_summary()
        return self.summary

    def _sync_summary(self) -> None:
        self.summary.acknowledged = self.ledger.acknowledged + self.checker.canary_acks
        self.summary.synced = self.ledger.synced_acks
        self.summary.failures = dict(self.ledger.failures)
        self.summary.duplicates = self.ledger.duplicates
        self.summary.late_acks = self.ledger.late_acks
        self.summary.reordered = self.ledger.reordered
        self.summary.hit = dict(self.ledger.hit)
        self.summary.violations = list(self.ledger.violations)
        self.summary.queue = self.qledger.stats if self.has_queue else None

    def cycle(self, cycle: int) -> None:
        cfg = self.config
        rng = self.rng
        self.expect_exits = False
        for role in self.roles:
            self.children.spawn(role)
        now = time.monotonic()
        end = now + rng.uniform(*(cfg.work_s or WORK_S[cfg.workers]))
        if rng.random() < cfg.kill_one_rate:
            self.children.pump(now + (end - now) * rng.uniform(0.1, 0.9))
            victim = self.children.procs[rng.choice(self.roles).name]
            self.children.kill(victim)
            self.summary.kills += 1
            self.children.spawn(victim.role)
        self.children.pump(end)
        if rng.random() < cfg.power_cut_rate:
            self.expect_exits = True
            self.ledger.cut_at = self.qledger.cut_at = time.monotonic()
            self.image.power_cut()
            self.summary.power_cuts += 1
            self.children.kill_all()
            self.image.remount()
            crash = Crash.POWER_LOSS
        else:
            self.expect_exits = True
            self.children.kill_all()
            self.summary.kills += 1
            crash = Crash.PROCESS_KILL
        self.checker.check(cycle, crash)

    def drain(self) -> None:
        """After the last cycle: one queue runs every task left to its end (Q-9), then the
        files must hold nothing due and every durable enqueue must be accounted for."""
        label = "final drain"
        self.expect_exits = False
        self.drained = False
        self.children.spawn(DRAIN_ROLE)
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while not self.drained and (left := deadline - time.monotonic()) > 0:
            self.children.pump(time.monotonic() + min(left, 0.2))
        if not self.drained:
            self.ledger.violations.append(f"{label}: the queue did not run every task to its end "
                                          f"within {DRAIN_TIMEOUT_S:.0f} s")
        self.expect_exits = True
        self.children.kill_all()
        obs = observe(self.storage, DEFAULT_PREFIX)
        self.ledger.check(obs, Crash.PROCESS_KILL, label)
        self.qledger.check(obs, label)
        if self.drained and obs.pending:
            self.ledger.violations.append(f"{label}: tasks still pending after the queue drained: "
                                          f"{sorted(obs.pending)[:10]}")
        self.qledger.account(obs, label)

def run_power_test(config: PowerConfig) -> Summary:
    """Create the image, run the fault loop, always clean up (call inside a private namespace)."""
    with Image(config.fs) as image:
        harness = Harness(config, image)
        harness.summary.workdir = image.workdir
        return harness.run()
