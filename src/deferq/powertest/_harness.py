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

Queue-level roles (``_queue_roles``: a real ``Queue`` over a reporting ``Disk``)
feed the same model through the same events; ``_qcheck.QueueLedger`` also
follows each enqueued task to its end (D-13, Q-2, Q-3, Q-8, Q-9, Q-12). After
the last cycle of a run with queue roles, a ``drain`` queue runs every task
left to its end, and every acknowledged, durable enqueue must be accounted for.
"""

from __future__ import annotations

import errno
import heapq
import importlib
import json
import os
import random
import selectors
import shutil
import signal
import time
from dataclasses import dataclass, field
from typing import IO

from deferq._core.errors import DeferqError
from deferq._core.limits import DEFAULT_PREFIX
from deferq._core.model import Crash, Dead, Pending
from deferq._engine.osenv import OS_ENV
from deferq.powertest._check import Ledger, Observation, observe
from deferq.powertest._fs import Image, MountError
from deferq.powertest._qcheck import QueueLedger, QueueStats
from deferq.powertest._queue_roles import QUEUE_BODIES
from deferq.powertest._workers import Event, Role, child_main, digest
from deferq.backends import Disk

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


@dataclass(frozen=True, slots=True)
class PowerConfig:
    cycles: int = 100
    seed: int = 0
    fs: str = "ext4"
    work_s: tuple[float, float] | None = None  # default: WORK_S of the worker mode
    kill_one_rate: float = 0.5  # chance per cycle of one mid-cycle SIGKILL + restart
    power_cut_rate: float = 0.6  # chance that a cycle ends in a power cut, not a SIGKILL of all
    workers: str = "mixed"  # a key of ROLE_SETS
    roles: tuple[Role, ...] | None = None  # overrides ``workers``
    log_path: str | None = None  # every event as a JSON line, outside the image
    evidence_dir: str | None = None  # where the files of a failing cycle are copied
    progress: IO[str] | None = None


@dataclass(slots=True)
class Summary:
    cycles: int = 0
    kills: int = 0
    power_cuts: int = 0
    acknowledged: int = 0
    synced: int = 0
    violations: list[str] = field(default_factory=list)
    seconds: float = 0.0
    torn_tails: int = 0  # files with a torn tail right after a crash (allowed, R-@F)
    damaged_lines: int = 0  # damaged complete lines seen right after a crash
    damaged_after_add: int = 0  # ... and still there after recovery + one add
    duplicates: int = 0  # ids pending in two WALs at once (allowed: at-least-once)
    stale_merges: int = 0  # ... whose merge kept an older add's bytes
    failures: dict[str, int] = field(default_factory=dict)
    self_exits: int = 0
    workdir: str = ""  # where the image was (deleted at the end)
    late_acks: int = 0  # returned after a power cut began: counted as in flight
    hit: dict[str, int] = field(default_factory=dict)  # ops in flight at a crash, by kind
    reordered: int = 0  # overlapping dead-store writes of one id resolved in the other order
    queue: QueueStats | None = None  # what the queue roles did (None without queue roles)

    def line(self) -> str:
        return (f"power-test: cycles={self.cycles} kills={self.kills} "
                f"power_cuts={self.power_cuts} acknowledged={self.acknowledged} "
                f"violations={len(self.violations)}")

    def details(self) -> str:
        failures = ", ".join(f"{k}={v}" for k, v in sorted(self.failures.items())) or "none"
        hit = ", ".join(f"{k}={v}" for k, v in sorted(self.hit.items())) or "none"
        return (f"  {self.seconds:.1f} s; synced acks={self.synced}; crash points="
                f"{self.kills + self.power_cuts}; torn tails after crash={self.torn_tails}; "
                f"damaged lines after crash={self.damaged_lines} (after recovery+add: "
                f"{self.damaged_after_add}); cross-WAL duplicates={self.duplicates} "
                f"(stale merges={self.stale_merges}); acks returned during a power cut="
                f"{self.late_acks}; overlapping dead-store writes taken in the other order="
                f"{self.reordered}; failed ops={failures}; in flight at a crash: {hit}"
                + ("" if self.queue is None else "\n" + queue_details(self.queue)))


def queue_details(q: QueueStats) -> str:
    logged = ", ".join(f"{k}={v}" for k, v in sorted(q.storage_log_errors.items())) or "none"
    return (f"  queue: starts={q.starts} (tasks replayed={q.replayed}); executions={q.runs} "
            f"(ok={q.ok_runs}); dead-letter writes={q.gave_up}; WAL removals judged="
            f"{q.removals_judged}; durable enqueues={q.durable_enqueues} (accounted for after "
            f"the drain={q.accounted}, not judged={q.foreign}: touched by storage roles or retried "
            f"during a cut); storage errors "
            f"logged by the queue={logged}")


@dataclass(slots=True)
class _Proc:
    role: Role
    incarnation: str
    pid: int
    fd: int
    buf: bytes = b""
    alive: bool = True


class Harness:
    """Runs the fault loop on one image; ``run`` returns the summary."""

    def __init__(self, config: PowerConfig, image: Image) -> None:
        self.config = config
        self.image = image
        self.storage = os.path.join(image.mountpoint, "storage")
        self.rng = random.Random(config.seed)
        self.ledger = Ledger()
        self.summary = Summary()
        self.procs: dict[str, _Proc] = {}
        self.selector = selectors.DefaultSelector()
        self.incarnations: dict[str, int] = {}
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
        self.canary_acks = 0
        self.damaged_before = 0  # damaged lines left after the previous recovery + add

    # ------------------------------------------------------------------ processes
    def spawn(self, role: Role) -> None:
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
        proc = _Proc(role, incarnation, pid, read_fd)
        self.procs[role.name] = proc
        self.selector.register(read_fd, selectors.EVENT_READ, proc)

    def _take(self, proc: _Proc, data: bytes) -> list[Event]:
        """The complete event lines of ``data`` (what follows the last newline waits)."""
        proc.buf += data
        *lines, proc.buf = proc.buf.split(b"\n")
        return [json.loads(line) for line in lines]

    def _feed_merged(self, batches: list[tuple[_Proc, list[Event]]]) -> None:
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
            self._feed_event(proc, events[i])
            if i + 1 < len(events):
                heapq.heappush(heads, (when(b, i + 1), b, i + 1))

    def _feed_event(self, proc: _Proc, event: Event) -> None:
        if self.log is not None:
            self.log.write(json.dumps({"w": proc.incarnation, **event}) + "\n")
        self.ledger.on_event(proc.incarnation, event)
        self.qledger.expect_errors = self.expect_exits
        self.qledger.on_event(proc.incarnation, event)
        if event["e"] == "Q" and event["k"] == "drained":
            self.drained = True
        if event["e"] == "X" and not self.expect_exits:
            self._self_exit(proc, event)

    def _self_exit(self, proc: _Proc, event: Event) -> None:
        self.summary.self_exits += 1
        if event.get("x") != "DeadTasksLockTimeout":  # D-8: a bounded lock wait is allowed
            self.ledger.violations.append(
                f"{proc.incarnation} stopped working without a crash: {event.get('x')}: "
                f"{event.get('m')}\n{event.get('tb')}")

    def _close(self, proc: _Proc) -> None:
        if not proc.alive:
            return
        proc.alive = False
        self.selector.unregister(proc.fd)
        os.close(proc.fd)
        os.waitpid(proc.pid, 0)

    def _read(self, proc: _Proc, *, to_eof: bool = False) -> tuple[list[Event], bool]:
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

    def _read_all(self, dead: list[_Proc]) -> None:
        """Read the ``dead`` processes' pipes to their end and what the others hold, merged."""
        batches = [(proc, self._read(proc, to_eof=True)[0]) for proc in dead]
        others = [p for p in self.procs.values() if p.alive and p not in dead]
        batches += [(proc, self._read(proc)[0]) for proc in others]
        self._feed_merged(batches)

    def pump(self, until: float) -> None:
        """Read every pipe until the monotonic time ``until``; restart roles that exited."""
        while (left := until - time.monotonic()) > 0:
            ready = self.selector.select(timeout=left)
            batches: list[tuple[_Proc, list[Event]]] = []
            gone: list[_Proc] = []
            for key, _ in ready:
                proc = key.data
                assert isinstance(proc, _Proc)
                events, eof = self._read(proc)
                batches.append((proc, events))
                if eof:
                    gone.append(proc)
            self._feed_merged(batches)
            for proc in gone:
                self._close(proc)
                self.spawn(proc.role)  # work continues

    def kill(self, proc: _Proc) -> None:
        """SIGKILL, then read the pipe to its end: lines written before death are valid."""
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._read_all([proc])
        self.ledger.forget(proc.incarnation)
        self.qledger.forget(proc.incarnation)
        self._close(proc)

    def kill_all(self) -> None:
        victims = [proc for proc in self.procs.values() if proc.alive]
        for proc in victims:
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._read_all(victims)
        for proc in victims:
            self.ledger.forget(proc.incarnation)
            self.qledger.forget(proc.incarnation)
            self._close(proc)
        self.procs.clear()

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
            self.kill_all()
            self.selector.close()
            if self.log is not None:
                self.log.close()
            self.summary.seconds = time.monotonic() - start
            self._sync_summary()
        return self.summary

    def _sync_summary(self) -> None:
        self.summary.acknowledged = self.ledger.acknowledged + self.canary_acks
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
            self.spawn(role)
        now = time.monotonic()
        end = now + rng.uniform(*(cfg.work_s or WORK_S[cfg.workers]))
        if rng.random() < cfg.kill_one_rate:
            self.pump(now + (end - now) * rng.uniform(0.1, 0.9))
            victim = self.procs[rng.choice(self.roles).name]
            self.kill(victim)
            self.summary.kills += 1
            self.spawn(victim.role)
        self.pump(end)
        if rng.random() < cfg.power_cut_rate:
            self.expect_exits = True
            self.ledger.cut_at = self.qledger.cut_at = time.monotonic()
            self.image.power_cut()
            self.summary.power_cuts += 1
            self.kill_all()
            self.image.remount()
            crash = Crash.POWER_LOSS
        else:
            self.expect_exits = True
            self.kill_all()
            self.summary.kills += 1
            crash = Crash.PROCESS_KILL
        self.check(cycle, crash)

    def drain(self) -> None:
        """After the last cycle: one queue runs every task left to its end (Q-9), then the
        files must hold nothing due and every durable enqueue must be accounted for."""
        label = "final drain"
        self.expect_exits = False
        self.drained = False
        self.spawn(DRAIN_ROLE)
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while not self.drained and (left := deadline - time.monotonic()) > 0:
            self.pump(time.monotonic() + min(left, 0.2))
        if not self.drained:
            self.ledger.violations.append(f"{label}: the queue did not run every task to its end "
                                          f"within {DRAIN_TIMEOUT_S:.0f} s")
        self.expect_exits = True
        self.kill_all()
        obs = observe(self.storage, DEFAULT_PREFIX)
        self.ledger.check(obs, Crash.PROCESS_KILL, label)
        self.qledger.check(obs, label)
        if self.drained and obs.pending:
            self.ledger.violations.append(f"{label}: tasks still pending after the queue drained: "
                                          f"{sorted(obs.pending)[:10]}")
        self.qledger.account(obs, label)

    # ------------------------------------------------------------------ the check
    def check(self, cycle: int, crash: Crash) -> None:
        label = f"cycle {cycle} ({crash.value})"
        ledger = self.ledger
        before = len(ledger.violations)
        evidence = os.path.join(self.image.workdir, "evidence")
        if self.config.evidence_dir is not None:
            shutil.rmtree(evidence, ignore_errors=True)
            shutil.copytree(self.storage, evidence)
        try:
            self._check(cycle, crash, label)
        finally:
            if len(ledger.violations) > before and self.config.evidence_dir is not None:
                kept = os.path.join(self.config.evidence_dir, f"cycle-{cycle}")
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


def run_power_test(config: PowerConfig) -> Summary:
    """Create the image, run the fault loop, always clean up (call inside a private namespace)."""
    with Image(config.fs) as image:
        harness = Harness(config, image)
        harness.summary.workdir = image.workdir
        return harness.run()
