"""Syscall fault injection with strace: fsync EIO and failed writes on the real kernel.

Theory of operation. ``prepare`` opens and closes a ``Disk`` once, so the WAL
file and the dead-task data file exist with known names. ``run_probe`` then
runs ``python -m deferq.powertest._inject PATH OUT`` under ``strace -f -qq`` with
``-e inject=...`` restricted by ``-P`` to the dead-task files (the probe's ``Disk``
adopts the WAL file into a fresh file with a random name, W-4, so faults in the
WAL are placed by syscall number from a dry run instead), adds tasks, dead-letters some and removes one,
recording for every call whether it returned or raised (and what). Afterwards
``reopen`` reads the storage back with a fresh ``Disk`` (no strace) and
``judge`` applies D-10: no call may report success for data that is not there
afterwards, the first failed fsync fails its call, and every later call to the
same store raises ``StorageBrokenError`` (W-12, S-4).

``retval=N`` injection is not offered: strace then skips the syscall and
returns N, a write that claims N bytes it never wrote. No kernel does that;
real short writes are tested on a full filesystem instead (``enospc_probe``).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

from deferq._engine.env import MappedWindow
from deferq._core.errors import DeferqError
from deferq._core.limits import DEFAULT_PREFIX
from deferq._core.names import dead_data_name, is_wal_file_name
from deferq._engine.osenv import OsEnv
from deferq.backends import Disk

ADDS = 5
DEADS = 3


def context_of(n: int) -> bytes:
    return b"probe-task-%d|" % n + b"x" * (100 + 700 * (n % 3))


@dataclass(slots=True)
class Call:
    store: str  # "wal", "dead" or "open"/"close"
    name: str
    ok: bool
    error: str = ""
    task_id: str = ""


@dataclass(slots=True)
class ProbeRun:
    calls: list[Call] = field(default_factory=list)
    injected: int = 0
    strace_log: str = ""
    pending: dict[str, bytes] = field(default_factory=dict)
    dead: dict[str, bytes] = field(default_factory=dict)


def prepare(path: str) -> tuple[str, str]:
    """Create the storage so its files have known names; return (WAL file, dead data file)."""
    Disk(path=path, fsync_frequency=0).close()
    wal = [n for n in os.listdir(path) if is_wal_file_name(DEFAULT_PREFIX, n)]
    assert len(wal) == 1, wal
    return os.path.join(path, wal[0]), os.path.join(path, dead_data_name(DEFAULT_PREFIX))


class WritingEnv(OsEnv):
    """The OS, but no file can be mapped: the WAL writes its records with ``write`` (W-26).

    strace injects faults into system calls; a record stored into a mapped window is a
    memory copy, which no fault reaches (and which cannot fail), so the probe's WAL
    writes, as it does on a filesystem that cannot map.
    """

    def map_shared(self, fd: int, offset: int, length: int) -> MappedWindow:
        raise OSError(errno.ENODEV, "the fault-injection probe writes its WAL records")


def probe(path: str, out: str) -> None:
    """The program strace runs: every call's outcome goes to ``out`` (not a traced path)."""
    calls: list[Call] = []

    def attempt(store: str, name: str, fn: object, task_id: str = "") -> object:
        assert callable(fn)
        try:
            value = fn()
        except (DeferqError, OSError) as exc:
            calls.append(Call(store, name, False, type(exc).__name__, task_id))
            return None
        calls.append(Call(store, name, True, "", task_id if task_id else str(value or "")))
        return value

    disk = attempt("open", "Disk()", lambda: Disk(path=path, fsync_frequency=0,
                                                  env=WritingEnv()))
    if isinstance(disk, Disk):
        for n in range(ADDS):
            attempt("wal", f"add_task #{n}", lambda n=n: disk.add_task(context_of(n), None,
                                                                       f"probe-{n}"), f"probe-{n}")
        for n in range(DEADS):
            attempt("dead", f"add_dead_task #{n}", lambda n=n: disk.add_dead_task(
                f"dead-{n}", context_of(n), RuntimeError("gave up"), task_class="Probe",
                attempts=1), f"dead-{n}")
        attempt("dead", "remove_dead_tasks", lambda: disk.remove_dead_tasks(["dead-0"]),
                "dead-0")
        attempt("wal", "sync", disk.sync)
        attempt("close", "close", disk.close)
    with open(out, "w") as f:
        json.dump([vars(c) if not hasattr(c, "__slots__") else
                   {k: getattr(c, k) for k in c.__slots__} for c in calls], f)


_WHEN = re.compile(r"^(?P<call>\w+):(?P<rest>.*):when=(?P<first>\d+)(?P<plus>\+?)$")
_PROBE_ENV = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")  # the same syscalls every run


def _wal_call_numbers(path: str, call: str) -> list[int]:
    """Which ``call`` syscalls of the probe (1-based, counted as strace's ``when`` counts
    them) go to a WAL file, from a dry run on a copy of the storage. Writes count only
    when they carry an add record (the N-th add's write, whatever the file's setup
    writes); fsyncs count all (the first is the one at open).

    The probe's ``Disk`` adopts the prepared WAL by copying it into a fresh file whose name
    is random (W-4), so ``-P`` cannot name it in advance: injections into the WAL are
    placed by number instead. The probe is single-threaded (fsync_frequency=0), so the
    numbers are the same in the injected run up to the first injected fault.
    """
    work = tempfile.mkdtemp(prefix="deferq-inject-dry-")
    try:
        copy = os.path.join(work, "storage")
        shutil.copytree(path, copy)
        log = os.path.join(work, "strace.log")
        subprocess.run(["strace", "-qq", "-y", "-o", log, "-e", f"trace={call}",
                        sys.executable, "-m", "deferq.powertest._inject", copy,
                        os.path.join(work, "calls.json")],
                       check=True, capture_output=True, timeout=120, env=_PROBE_ENV)
        numbers = []
        with open(log) as f:
            calls = [line for line in f if line.startswith(f"{call}(")]
        for n, line in enumerate(calls, 1):
            fd_path = line[line.index("<") + 1:line.index(">")] if "<" in line else ""
            if not is_wal_file_name(DEFAULT_PREFIX, os.path.basename(fd_path)):
                continue
            if call == "write" and ":add:" not in line:
                continue  # writes are numbered by the adds they carry, not the file's setup
            numbers.append(n)
        return numbers
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _place_in_wal(path: str, spec: str) -> str:
    """``fsync:error=EIO:when=2`` on the WAL -> the same fault at the 2nd WAL fsync's number;
    ``when=K+`` covers the K-th through the last WAL call of the dry run."""
    match = _WHEN.match(spec)
    if match is None:
        raise ValueError(f"a WAL injection needs a when=N or when=N+ clause, got {spec!r}")
    numbers = _wal_call_numbers(path, match["call"])
    first = int(match["first"])
    if not 1 <= first <= len(numbers):
        raise ValueError(f"the probe makes {len(numbers)} {match['call']} call(s) on its WAL; "
                         f"{spec!r} asks for number {first}")
    when = str(numbers[first - 1])
    if match["plus"]:
        when += f"..{numbers[-1]}"
    return f"{match['call']}:{match['rest']}:when={when}"


def run_probe(path: str, inject: list[str], trace_paths: list[str]) -> ProbeRun:
    """Run ``probe`` under strace with the given ``-e inject=`` specs, then read back.

    A trace path that is a WAL file means "the probe's WAL", wherever the probe's Disk
    puts it: the specs are then placed by syscall number (``_place_in_wal``).
    """
    in_wal = any(is_wal_file_name(DEFAULT_PREFIX, os.path.basename(p)) for p in trace_paths)
    if in_wal:
        inject = [_place_in_wal(path, spec) for spec in inject]
        trace_paths = [p for p in trace_paths
                       if not is_wal_file_name(DEFAULT_PREFIX, os.path.basename(p))]
    work = tempfile.mkdtemp(prefix="deferq-inject-")
    try:
        out = os.path.join(work, "calls.json")
        log = os.path.join(work, "strace.log")
        cmd = ["strace", "-f", "-qq", "-o", log]
        for spec in inject:
            cmd += ["-e", f"inject={spec}"]
        for p in trace_paths:
            cmd += ["-P", p]
        cmd += [sys.executable, "-m", "deferq.powertest._inject", path, out]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120, env=_PROBE_ENV)
        run = ProbeRun()
        with open(out) as f:
            run.calls = [Call(**c) for c in json.load(f)]
        with open(log) as f:
            run.strace_log = f.read()
        run.injected = len(re.findall(r"\(INJECTED\)", run.strace_log))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    with Disk(path=path, fsync_frequency=0) as disk:
        run.pending = {t.task_id: t.context for t in disk.pending_tasks()}
        run.dead = {t.id: t.context for t in disk.list_dead_tasks()}
    return run


def judge(run: ProbeRun) -> list[str]:
    """D-10, W-12, S-4: what a run may not show. Returns the violations."""
    problems = []
    if run.injected == 0:
        problems.append("strace injected nothing (the probe did not reach the injected call)")
    elif all(c.ok for c in run.calls):
        problems.append(f"{run.injected} injected fault(s), yet every call reported success")
    removal_tried = {c.task_id for c in run.calls if c.name == "remove_dead_tasks"}
    for store in ("wal", "dead"):
        failed_fsync = False
        for call in run.calls:
            if call.store not in (store, "open"):
                continue
            if failed_fsync and call.ok:
                problems.append(f"{call.name} succeeded after the {store} store fail-stopped")
            if failed_fsync and not call.ok and call.error != "StorageBrokenError":
                problems.append(f"{call.name} raised {call.error}, not StorageBrokenError, after"
                                f" the {store} store fail-stopped")
            if call.error == "StorageBrokenError":
                failed_fsync = True
    for call in run.calls:
        if not call.ok:
            continue
        if call.name == "remove_dead_tasks" and call.task_id in run.dead:
            problems.append(f"D-9: remove_dead_tasks returned but {call.task_id} is still dead")
        if call.store == "wal" and call.name.startswith("add_task"):
            n = int(call.name.rsplit("#", 1)[1])
            if run.pending.get(call.task_id) != context_of(n):
                problems.append(f"D-10: {call.name} returned but {call.task_id} is not pending"
                                f" after a restart")
        if call.store == "dead" and call.name.startswith("add_dead_task"):
            n = int(call.name.rsplit("#", 1)[1])
            if call.task_id not in removal_tried and run.dead.get(call.task_id) != context_of(n):
                problems.append(f"D-10: {call.name} returned but {call.task_id} is not a dead"
                                f" task after a restart")
    return problems


def main(argv: list[str]) -> int:
    probe(argv[0], argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
