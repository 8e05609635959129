"""Recovering a crash state with a fresh worker, and judging what it recovered.

Rules. ``recover`` boots a crash state, opens a fresh ``Disk`` in a new process, reads
the pending tasks and the dead tasks, then *probes*: adds one pending and one dead
task, closes, reopens and checks both probes are there and nothing else changed (D-5,
D-12: a torn tail must be cut before the next append). Any failure to open, read or
probe is a problem of the recovery, never an exception. ``check_recovered`` judges the
recovered tasks with the run's model, fed with exactly which operations were
acknowledged, failed or in flight at the crash, plus the handoff rule D-13 (a task
whose give-up started while it had to survive must be in the WAL or the dead-task
store), the probe's problems, and every exception the run saw without a fault.

Theory of operation: ``recover`` depends only on the crash state's image, so the
explorer caches it by image digest; the verdict depends on the run too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from deferq._core.model import Crash as CrashKind
from deferq._core.model import Dead, Pending
from deferq.backends import Disk
from deferq.crashtest._crashengine import PATH, PREFIX, Engine
from deferq.crashtest._crashrun import _GaveUp, _Run, copy_model
from deferq.crashtest._simdisk import SimDisk

PROBE_PENDING: Final = "probe-p"
PROBE_DEAD: Final = "probe-d"


@dataclass(frozen=True, slots=True)
class Recovered:
    """What a fresh worker read from a crash state, and what its probe found wrong."""

    pending: dict[str, Pending]
    dead: dict[str, Dead]
    problems: tuple[str, ...]


def recover(engine: Engine, disk: SimDisk) -> Recovered:
    env = disk.process()
    try:
        backend = engine.disk_class(path=PATH, prefix=PREFIX, fsync_frequency=0, env=env)
    except Exception as exc:  # noqa: BLE001 - any failure to recover is a violation (D-5)
        return Recovered({}, {}, (f"recovery failed to open: {type(exc).__name__}: {exc}",))
    problems: list[str] = []
    try:
        pending = _read_pending(backend)
        dead = _read_dead(backend)
        backend.add_task(b"probe", None, task_id=PROBE_PENDING)
        backend.add_dead_task(PROBE_DEAD, b"probe", _GaveUp("probe"), task_class="probe",
                              attempts=1)
        backend.close()
    except Exception as exc:  # noqa: BLE001
        return Recovered({}, {}, (f"recovery failed: {type(exc).__name__}: {exc}",))
    disk.kill(env.getpid())
    env = disk.process()
    try:
        with engine.disk_class(path=PATH, prefix=PREFIX, fsync_frequency=0, env=env) as again:
            pending2 = _read_pending(again)
            dead2 = _read_dead(again)
    except Exception as exc:  # noqa: BLE001
        return Recovered(pending, dead, (f"reopen after probe failed: {type(exc).__name__}: {exc}",))
    want_pending = dict(pending, **{PROBE_PENDING: Pending(b"probe", None)})
    want_dead = dict(dead, **{PROBE_DEAD: Dead(b"probe", "probe", 1, "probe")})
    if pending2 != want_pending:
        problems.append(f"after a probe add_task and reopen the WAL holds {sorted(pending2)},"
                        f" expected {sorted(want_pending)} (D-5/D-12)")
    if dead2 != want_dead:
        problems.append(f"after a probe add_dead_task and reopen the store holds {sorted(dead2)},"
                        f" expected {sorted(want_dead)} (D-7/D-12)")
    return Recovered(pending, dead, tuple(problems))


def _read_pending(backend: Disk) -> dict[str, Pending]:
    out: dict[str, Pending] = {}
    for task in backend.pending_tasks():
        out[task.task_id] = Pending(task.context, task.publish_at)
    return out


def _read_dead(backend: Disk) -> dict[str, Dead]:
    return {t.id: Dead(t.context, t.task_class, t.attempts, t.exception_message)
            for t in backend.list_dead_tasks()}


def check_recovered(run: _Run, kind: CrashKind, got: Recovered) -> list[str]:
    """The model's verdict on one recovered state, plus D-13 and the probe."""
    model = copy_model(run.model)
    model.crash(kind)
    out = [str(v) for v in model.check_recovered(got.pending, got.dead)]
    for handoff in run.handoffs:
        if handoff.must_survive[kind] and handoff.task not in got.pending \
                and handoff.task not in got.dead:
            out.append(f"task {handoff.task!r} is in neither store after its give-up handoff (D-13)")
    out.extend(got.problems)
    out.extend(f"without a fault, {a}" for a in run.anomalies)
    return out
