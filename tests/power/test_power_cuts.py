"""Real crashes on a real filesystem: SIGKILLed workers and power cuts on a loop-mounted ext4 image.

Goal: prove the real engine against the real kernel, where the simulation only
proves the design against a model: no acknowledged-and-synced task is lost, no
task is invented, every file stays readable, recovery plus one add leaves
everything clean, and work continues (spec/durability.md D-1..D-4, D-7, D-9,
D-12, D-13, W-28); and the engine fails loudly, never reporting success, when
fsync or write fail on real syscalls (D-10, W-12, W-13, S-4, S-5).

Method: the CI tier runs ``python -m deferq power-test`` (the code behind
``deferq power-test``), which re-executes itself in a private mount namespace,
creates a fresh ext4 image, forks worker and operator processes (storage-level
ones using ``Disk``, queue-level ones running a real ``Queue`` over ``Disk``;
three runs: mixed, queue only, storage only) and cycles SIGKILLs and power cuts
(the ext4 shutdown ioctl, NOLOGFLUSH, then unmount and mount: journal replay),
checking every recovery against ``deferq._core.model.StorageModel`` and following
every enqueued task to its end (docs/power-test.md). It needs root, loop
devices and mkfs.ext4, and skips with the reason otherwise (also when mounting
fails, e.g. in a container without CAP_SYS_ADMIN). The injection tests run a
probe program under ``strace -e inject=...`` restricted with ``-P`` to one
file (WAL faults are placed by syscall number instead), then read the storage back with a fresh ``Disk``; they skip without
strace or ptrace.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from deferq.powertest._fs import missing_requirements
from deferq.powertest._inject import judge, prepare, run_probe

CI_CYCLES = int(os.environ.get("DEFERQ_POWER_CYCLES", "80"))
CI_SEED = int(os.environ.get("DEFERQ_POWER_SEED", "20261202"))
# (worker mode, share of CI_CYCLES): mixed storage and queue roles, then queue roles alone,
# then storage roles alone (the only run with the storage-level operator).
CI_RUNS = [("mixed", 1.0), ("queue", 0.3), ("storage", 0.4)]


def _leftovers(stdout: str) -> list[str]:
    """Loop devices on, mounts of, and files of the image the run printed it used."""
    images = [line.split()[2] for line in stdout.splitlines()
              if line.startswith("power-test: image ")]
    assert images, "the run did not say which image it used"
    out = []
    for workdir in images:
        if shutil.which("losetup"):
            out += subprocess.run(["losetup", "-j", os.path.join(workdir, "fs.img")],
                                  capture_output=True, text=True, check=False).stdout.splitlines()
        with open("/proc/self/mounts") as f:
            out += [line for line in f if workdir in line]
        if os.path.exists(workdir):
            out.append(f"{workdir} still exists")
    return out


def _queue_figures(stdout: str) -> dict[str, int]:
    """The counters of the details line ``  queue: ...`` (absent without queue roles)."""
    lines = [line for line in stdout.splitlines() if line.startswith("  queue: ")]
    if not lines:
        return {}
    out = {}
    text = lines[-1]
    for mark in "();,":
        text = text.replace(mark, " ")
    for item in text.split():
        key, _, value = item.partition("=")
        if value.isdigit():
            out[key] = int(value)
    return out


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.spec("D-1", "D-2", "D-3", "D-4", "D-6", "D-7", "D-9", "D-12", "D-13", "W-3", "W-4",
                  "W-28", "Q-3", "Q-8", "Q-9", "Q-33", "Q-20", "Q-22")
@pytest.mark.parametrize(("workers", "share"), CI_RUNS, ids=[w for w, _ in CI_RUNS])
def test_power_cuts_and_kills_lose_nothing_acknowledged(workers: str, share: float) -> None:
    problem = missing_requirements()
    if problem is not None:
        pytest.skip(problem)
    cycles = max(10, round(CI_CYCLES * share))
    result = subprocess.run(
        [sys.executable, "-m", "deferq", "power-test", "--cycles", str(cycles),
         "--seed", str(CI_SEED), "--workers", workers],
        capture_output=True, text=True, timeout=900, check=False)
    lines = result.stdout.strip().splitlines()
    if result.returncode == 2:
        pytest.skip(f"cannot run power cuts here: {result.stderr.strip()[-400:]}")
    assert lines, result.stderr[-3000:]
    last = lines[-1]
    assert last.startswith("power-test: cycles="), result.stdout[-3000:]
    fields = dict(item.split("=") for item in last.split()[1:])
    assert fields["violations"] == "0", result.stdout[-6000:]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert int(fields["cycles"]) == cycles
    assert int(fields["kills"]) + int(fields["power_cuts"]) >= cycles
    assert int(fields["power_cuts"]) > 0 and int(fields["acknowledged"]) > 0
    queue = _queue_figures(result.stdout)
    if workers == "storage":
        assert queue == {}
    else:
        # The queues really worked: they replayed, ran, retried and dead-lettered tasks,
        # and the final drain accounted for durable enqueues.
        assert queue["starts"] > 0 and queue["executions"] > queue["ok"] > 0, queue
        assert queue["writes"] > 0 and queue["judged"] > 0, queue  # dead-letter writes, removals
        assert queue["drain"] > 0, queue  # durable enqueues accounted for after the drain
    assert _leftovers(result.stdout) == [], "the power test left a mount or a loop device behind"


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.spec("D-1")
def test_the_harness_catches_an_engine_that_acknowledges_before_fsync() -> None:
    """The harness is not vacuous: a WAL whose fsync does nothing must produce violations."""
    stdout, fields = _run_broken_variant("mutant_run.py", cycles=20)
    assert int(fields["violations"]) > 0, stdout[-3000:]
    assert _leftovers(stdout) == []


def _run_broken_variant(script: str, *, cycles: int) -> tuple[str, dict[str, str]]:
    """Run a deliberately broken variant of the harness in a private mount namespace.

    Returns its stdout and the fields of its summary line; skips when this machine cannot
    mount a test filesystem.
    """
    problem = missing_requirements()
    if problem is not None:
        pytest.skip(problem)
    src = Path(__file__).resolve().parents[2] / "src"
    result = subprocess.run(
        ["unshare", "-m", "--propagation", "private", sys.executable,
         str(Path(__file__).with_name(script)), str(cycles)],
        capture_output=True, text=True, timeout=300, check=False,
        env=dict(os.environ, PYTHONPATH=str(src)))
    if "MountError" in result.stderr or "unshare:" in result.stderr:
        pytest.skip(f"cannot mount a test filesystem here: {result.stderr.strip()[-300:]}")
    last = result.stdout.strip().splitlines()[-1]
    return result.stdout, dict(item.split("=") for item in last.split()[1:])


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.spec("D-13", "Q-8", "Q-141")
def test_the_harness_catches_a_queue_that_removes_before_the_dead_write_returned() -> None:
    """The queue checks are not vacuous: a dead-letter write that returns before it is done
    lets the queue remove a given-up task from its WAL too early (D-13)."""
    stdout, fields = _run_broken_variant("queue_mutant_run.py", cycles=8)
    assert int(fields["violations"]) > 0, stdout[-3000:]
    assert "VIOLATION D-13" in stdout, stdout[-3000:]
    assert _leftovers(stdout) == []


def test_power_test_last_line_without_requirements_is_exit_2(monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]
                                                             ) -> None:
    import deferq.powertest.cli as cli
    from deferq._cli import main

    monkeypatch.setattr(cli, "missing_requirements", lambda: "power-test needs root")
    assert main(["power-test", "--cycles", "3"]) == 2
    captured = capsys.readouterr()
    assert "needs root" in captured.err
    assert captured.out.strip().splitlines()[-1] == (
        "power-test: cycles=0 kills=0 power_cuts=0 acknowledged=0 violations=0")


def _strace_works() -> str | None:
    if shutil.which("strace") is None:
        return "strace is not installed"
    probe = subprocess.run(["strace", "-f", "-qq", "-o", os.devnull, "true"],
                           capture_output=True, check=False)
    if probe.returncode != 0:
        return f"strace cannot trace here (ptrace refused?): {probe.stderr.decode()[-200:]}"
    return None


needs_strace = pytest.mark.skipif(_strace_works() is not None,
                                  reason=str(_strace_works()))

# (target file, strace inject spec, what must fail)
INJECTIONS = [
    pytest.param("wal", "fsync:error=EIO:when=1", id="wal-fsync-eio-at-open"),
    pytest.param("wal", "fsync:error=EIO:when=2", id="wal-fsync-eio-first-add"),
    pytest.param("wal", "fsync:error=EIO:when=4", id="wal-fsync-eio-third-add"),
    pytest.param("dead", "fsync:error=EIO:when=1", id="dead-fsync-eio-first-add"),
    pytest.param("dead", "fsync:error=EIO:when=3", id="dead-fsync-eio-last-add"),
    pytest.param("dir", "fsync:error=EIO:when=3", id="dir-fsync-eio-after-compaction"),
    pytest.param("tmp", "fsync:error=EIO", id="compaction-fsync-eio"),
    pytest.param("tmp", "rename:error=EIO", id="compaction-rename-eio"),
]
WRITE_INJECTIONS = [
    pytest.param("wal", "write:error=EIO:when=1", id="wal-write-eio"),
    pytest.param("wal", "write:error=ENOSPC:when=3", id="wal-write-enospc"),
    pytest.param("wal", "write:error=ENOSPC:when=2+", id="wal-write-enospc-persistent"),
    pytest.param("dead", "write:error=ENOSPC:when=2", id="dead-write-enospc"),
    pytest.param("tmp", "write:error=ENOSPC", id="compaction-write-enospc"),
]


def _target(storage: Path, target: str) -> tuple[str, list[str]]:
    wal, dead = prepare(str(storage))
    return {"wal": wal, "dead": dead, "tmp": dead + ".tmp", "dir": str(storage)}[target], []


@pytest.mark.slow
@needs_strace
@pytest.mark.spec("D-10", "W-12", "S-4", "S-5", "D-9")
@pytest.mark.parametrize(("target", "spec"), INJECTIONS)
def test_injected_fsync_failure_fails_loudly_and_never_acknowledges(
        storage: Path, target: str, spec: str) -> None:
    path, _ = _target(storage, target)
    run = run_probe(str(storage), [spec], [path])
    assert judge(run) == [], run.strace_log[-2000:]
    failed = [c for c in run.calls if not c.ok]
    assert failed, "an injected failure must surface as an exception"
    if "fsync" in spec and target in ("wal", "dead"):
        # W-12 / S-4: the call that saw EIO raised, and the store fail-stopped after it.
        first = failed[0]
        later = [c for c in run.calls[run.calls.index(first) + 1:]
                 if c.store == first.store]
        assert first.error in ("StorageBrokenError", "OSError")
        if first.store == "open":
            return  # Disk() itself raised: nothing was opened, so nothing can be acknowledged.
        assert later and all(not c.ok and c.error == "StorageBrokenError" for c in later), (
            [(c.name, c.ok, c.error) for c in run.calls])


@pytest.mark.slow
@needs_strace
@pytest.mark.spec("D-10", "W-13", "S-4")
@pytest.mark.parametrize(("target", "spec"), WRITE_INJECTIONS)
def test_injected_write_failure_acknowledges_nothing_and_leaves_no_partial_line(
        storage: Path, target: str, spec: str) -> None:
    path, _ = _target(storage, target)
    run = run_probe(str(storage), [spec], [path])
    assert judge(run) == [], [(c.name, c.ok, c.error) for c in run.calls]
    assert any(not c.ok for c in run.calls)
    # W-13: a failed write is cut back, so the WAL keeps working unless the error persists.
    if spec.endswith("when=1") or spec.endswith("when=3"):
        assert any(c.ok and c.name.startswith("add_task") for c in run.calls)


@pytest.mark.slow
@pytest.mark.spec("D-10", "W-13", "S-4")
def test_real_short_write_on_a_full_filesystem_is_cut_back() -> None:
    """A full ext4 makes ``write`` return a short count, then ENOSPC (strace cannot fake that)."""
    problem = missing_requirements()
    if problem is not None:
        pytest.skip(problem)
    result = subprocess.run(
        ["unshare", "-m", "--propagation", "private", sys.executable, "-m",
         "deferq.powertest._enospc"], capture_output=True, text=True, timeout=120, check=False)
    if "MountError" in result.stderr or "unshare:" in result.stderr:
        pytest.skip(f"cannot mount a test filesystem here: {result.stderr.strip()[-300:]}")
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert "PROBLEM" not in result.stdout


def _rotation_run(storage: Path, inject: list[str]) -> tuple[list[str], str]:
    src = Path(__file__).resolve().parents[2] / "src"
    storage.parent.mkdir(parents=True, exist_ok=True)
    log = storage.parent / "strace.log"
    cmd = ["strace", "-f", "-qq", "-o", str(log)]
    for spec in inject:
        cmd += ["-e", f"inject={spec}"] if spec else ["-e", "trace=fsync,openat,unlink,unlinkat"]
    cmd += [sys.executable, str(Path(__file__).with_name("rotation_probe.py")), str(storage)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False,
                            env=dict(os.environ, PYTHONPATH=str(src)))
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.splitlines(), log.read_text()


def _rotation_fsync(tmp_path: Path, nth: int) -> int:
    """Which fsync of the probe is the ``nth`` one after the rotation created its new WAL file
    (1: the directory fsync of the new name, 2: the fsync of the copied live tasks)."""
    _, trace = _rotation_run(tmp_path / "count" / "storage", [""])
    fsyncs = seen = wal_opens = 0
    for line in trace.splitlines():
        if "openat(" in line and "O_EXCL" in line:
            wal_opens += 1  # the first WAL file at open, the second at rotation
        elif "fsync(" in line:
            fsyncs += 1
            seen += wal_opens == 2
            if wal_opens == 2 and seen == nth:
                return fsyncs
    raise AssertionError(f"the probe did not rotate:\n{trace[-2000:]}")


@pytest.mark.slow
@needs_strace
@pytest.mark.spec("W-12", "W-10", "D-10", "W-51")
def test_failed_directory_fsync_at_rotation_fails_stop(tmp_path: Path) -> None:
    when = _rotation_fsync(tmp_path, 1)
    out, trace = _rotation_run(tmp_path / "a" / "storage", [f"fsync:error=EIO:when={when}"])
    assert "(INJECTED)" in trace
    assert out[:5] == ["remove0 StorageBrokenError", "remove1 StorageBrokenError",
                       "remove2 StorageBrokenError", "add StorageBrokenError", "broken True"]
    assert out[6] in ("pending id0 id1 id2", "pending id1 id2")


@pytest.mark.slow
@needs_strace
@pytest.mark.spec("W-12", "D-10", "W-51")
def test_failed_directory_fsync_at_rotation_fails_stop_even_if_cleanup_fails(
        tmp_path: Path) -> None:
    when = _rotation_fsync(tmp_path, 1)
    # The store unlinks relative to its directory's descriptor (F-25): unlinkat, not unlink.
    out, trace = _rotation_run(tmp_path / "b" / "storage",
                               [f"fsync:error=EIO:when={when}", "unlinkat:error=EIO:when=1"])
    assert trace.count("(INJECTED)") == 2
    assert out[:5] == ["remove0 StorageBrokenError", "remove1 StorageBrokenError",
                       "remove2 StorageBrokenError", "add StorageBrokenError", "broken True"]


@pytest.mark.slow
@needs_strace
@pytest.mark.spec("D-3", "W-10", "W-50")
def test_failed_copy_fsync_at_rotation_keeps_the_old_file(tmp_path: Path) -> None:
    """The rotation gives up and keeps the old file; later removals stay removed."""
    when = _rotation_fsync(tmp_path, 2)
    out, trace = _rotation_run(tmp_path / "c" / "storage", [f"fsync:error=EIO:when={when}"])
    assert "(INJECTED)" in trace
    assert out == ["remove0 ok", "remove1 ok", "remove2 ok", "add ok", "broken False",
                   "walfiles 1", "pending last"]


@pytest.mark.slow
@needs_strace
@pytest.mark.spec("D-3", "W-10", "W-50")
def test_failed_copy_fsync_at_rotation_never_resurrects_removed_tasks(tmp_path: Path) -> None:
    when = _rotation_fsync(tmp_path, 2)
    out, trace = _rotation_run(tmp_path / "d" / "storage",
                               [f"fsync:error=EIO:when={when}", "unlinkat:error=EIO:when=1"])
    assert trace.count("(INJECTED)") == 2
    # Either the WAL fail-stops (nothing is acknowledged after the failure), or the abandoned
    # copy is gone. Otherwise whether removed tasks come back depends on the random file
    # names: the merge replays files in name order, and a copy merged after the old file
    # re-adds id1 and id2, whose removals were acknowledged and fsynced.
    assert "broken True" in out or "walfiles 1" in out, out
