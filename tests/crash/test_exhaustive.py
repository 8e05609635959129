"""The CI tier of the bounded-exhaustive crash exploration, and the ``crash-test`` CLI.

Goal: no crash of any kind, at any point of any short workload, may leave a state the
durability guarantees forbid (spec/durability.md), and ``deferq crash-test`` reports that
in a stable summary line with a meaningful exit status. Method:
``deferq.crashtest._explore.explore`` with ``max_ops=2`` over every distinct workload
(1-2 workers, both stores, fsync_frequency 0 and 0.5, empty and seeded start, with and
without forced WAL rotation), at every syscall boundary, inside every write (torn), after
an fsync EIO, and at every op boundary; for each, the process kill (volatile image) and
every crash state of ``weakest`` (atomic renames, A-11), ``ext4_ordered`` and ``prefix``
within ``CI_BOUND``; each recovery is checked by ``deferq._core.model.StorageModel``, the
handoff rule and the recovery probe. Two shards run in parallel (CI has 2 cores). The
CLI test runs the command in-process on a tiny bound with a one-mutant catalogue.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from deferq._cli import main
from deferq.crashtest._explore import CI_BOUND, explore
from deferq.crashtest._workloads import Step, Workload

SUMMARY = re.compile(r"^crash-test: workloads=(\d+) crash_points=(\d+) states=(\d+) "
                     r"violations=(\d+) mutants_caught=(\d+)/(\d+) complete=(yes|no)$")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.spec("D-1", "D-2", "D-3", "D-4", "D-5", "D-6", "D-7", "D-8", "D-9", "D-10", "D-12",
                  "D-13", "D-21", "W-34")
def test_every_crash_of_every_two_step_workload_recovers_to_an_allowed_state() -> None:
    report = explore(max_ops=2, bound=CI_BOUND, seed=0, jobs=2)
    print()
    print(report.summary())
    assert not report.stopped_early
    assert report.workloads == report.sequences > 250
    assert report.crash_points > 10_000
    for name in ("kill", "weakest", "ext4_ordered", "prefix"):
        assert report.per_model[name].states > 0, name
    assert not report.violations, "\n".join(str(v) for v in report.violations[:20])


@pytest.mark.slow
def test_exploration_is_deterministic_given_a_seed() -> None:
    work = [Workload((Step("add", 0), Step("give_up", 0, "t1")), 0.0, "empty"),
            Workload((Step("remove_dead", 0, "d0"),), 0.5, "seeded")]
    first = explore(workload_list=work, bound=CI_BOUND, seed=3)
    second = explore(workload_list=work, bound=CI_BOUND, seed=3)
    assert (first.crash_points, first.states, first.recoveries) == \
        (second.crash_points, second.states, second.recoveries)
    assert first.states > first.crash_points > 0 and not first.violations


def _one_mutant_catalogue(tmp_path: Path, name: str) -> Path:
    directory = tmp_path / "mutants"
    directory.mkdir(parents=True)
    (directory / "catalogue.py").write_text(
        "from deferq.crashtest import Engine, Mutant, Step, Workload\n"
        "from deferq.crashtest.catalogue import MUTANTS as ALL\n"
        f"MUTANTS = tuple(m for m in ALL if m.name == {name!r}) or (\n"
        "    Mutant('identity', 'nothing', 'nothing can', Engine('identity'),\n"
        "           workloads=(Workload((Step('add', 0),)),)),)\n")
    return directory


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str]]:
    status = main(["crash-test", *argv])
    return status, capsys.readouterr().out.splitlines()


@pytest.mark.slow
def test_cli_summary_line_and_exit_status(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    caught = _one_mutant_catalogue(tmp_path / "a", "retry-failed-fsync")
    status, lines = _run(capsys, "--max-ops", "1", "--model", "prefix", "--mutants-dir",
                         str(caught))
    match = SUMMARY.match(lines[-1])
    assert match, lines[-1]
    workloads, points, states, violations, k, m = map(int, match.groups()[:6])
    assert workloads > 0 and points > 0 and states >= points and violations == 0
    assert (k, m) == (1, 1) and match.group(7) == "yes" and status == 0
    assert not any("INCOMPLETE" in line for line in lines)
    assert any("replay: deferq crash-test --replay " in line for line in lines)


@pytest.mark.slow
def test_cli_fails_when_a_mutant_escapes(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    escaping = _one_mutant_catalogue(tmp_path / "b", "no-such-mutant")  # the identity mutant
    status, lines = _run(capsys, "--max-ops", "1", "--model", "prefix", "--seconds", "2",
                         "--mutants-dir", str(escaping))
    assert SUMMARY.match(lines[-1]) and "mutants_caught=0/1 " in lines[-1]
    assert status == 1
    assert any("FAILURE: no check caught identity" in line for line in lines)


@pytest.mark.slow
def test_cli_without_a_catalogue_says_it_checked_no_mutant_and_never_exits_0(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, lines = _run(capsys, "--max-ops", "1", "--model", "prefix",
                         "--mutants-dir", str(tmp_path))
    assert lines[-1].endswith("mutants_caught=0/0 complete=no")
    assert any("no mutant catalogue" in line for line in lines)
    assert any(line.startswith("crash-test: INCOMPLETE: no mutant was checked") for line in lines)
    assert status == 3


@pytest.mark.slow
def test_cli_stopped_on_its_time_budget_says_so_and_never_exits_0(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    caught = _one_mutant_catalogue(tmp_path, "retry-failed-fsync")
    status, lines = _run(capsys, "--max-ops", "2", "--model", "prefix", "--seconds", "0.5",
                         "--mutants-dir", str(caught))
    assert lines[-1].endswith("mutants_caught=1/1 complete=no")
    assert any(line.startswith("crash-test: INCOMPLETE: the exploration stopped early")
               for line in lines)
    assert status == 3


@pytest.mark.slow
def test_cli_replays_a_failing_case(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    status, lines = _run(capsys, "--max-ops", "1", "--model", "prefix", "--seconds", "2",
                         "--mutants-dir", str(_one_mutant_catalogue(tmp_path, "swapped-handoff")))
    token = next(line.split("--replay ")[1] for line in lines if "--replay " in line)
    monkeypatch.chdir(ROOT)
    status, lines = _run(capsys, "--replay", token)
    assert status == 1
    assert any(line.startswith("VIOLATION") and "D-13" in line for line in lines)


def test_workload_enumeration_is_deduplicated_and_stable() -> None:
    from deferq.crashtest._workloads import workloads

    counts = [len(workloads(n)) for n in (1, 2)]
    assert counts == [28, 324]
    two = workloads(2)
    assert len(set(two)) == len(two)
    for work in two:
        if work.fsync_frequency == 0:
            assert all(step.kind != "sync" for step in work.steps)
        if work.rotate:
            assert any(step.kind in ("remove", "remove_all", "give_up") for step in work.steps)
        if any(step.kind == "remove_all" for step in work.steps):  # W-79: two or more at once
            assert work.start == "seeded" and work.steps[0].kind == "add"
