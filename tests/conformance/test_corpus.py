"""The conformance corpus and ``deferq conformance`` (conformance/README.md).

Goal: the shipped corpus is exactly what conformance/build_corpus.py builds (a stale
corpus fails), deferq's reader and the reference reader written from spec/ both pass every
case, and the runner catches a reader that is wrong, that crashes, or that checked nothing.

Method: rebuild into tmp_path (without the reference check, which the reference test
below makes anyway) and compare every file byte for byte; run deferq's reader in process
(one subprocess per case would cost most of the time budget) and once through the CLI;
run the reference reader through the CLI as a third party would; derive a wrong reader
from the reference reader by deleting its one line that applies removes.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conformance import build_corpus
from deferq._cli import main as deferq_main
from deferq.conformance import deferq_reader
from deferq.conformance.cases import default_corpus, find_cases
from deferq.conformance.runner import run

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "conformance" / "reference_reader.py"
CORPUS = default_corpus()

pytestmark = pytest.mark.spec("F-1", "F-6", "F-11", "W-15", "S-6", "R-@A", "R-@B", "R-@C",
                              "R-@D", "R-@E", "R-@F", "R-@G", "R-@H", "R-@I", "R-@J", "R-@K",
                              "R-@L")


def in_process_deferq(directory: str, prefix: str) -> str:
    return json.dumps(deferq_reader.read(directory, prefix))


def files_of(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_the_corpus_is_what_build_corpus_builds(tmp_path: Path) -> None:
    names = build_corpus.build(tmp_path / "corpus", check_reference=False)
    assert [c.name for c in find_cases(CORPUS)] == sorted(names)
    rebuilt, shipped = files_of(tmp_path / "corpus"), files_of(CORPUS)
    assert sorted(rebuilt) == sorted(shipped), "files added or missing: run build_corpus.py"
    stale = [name for name in rebuilt if rebuilt[name] != shipped[name]]
    assert not stale, f"stale corpus files (run conformance/build_corpus.py): {stale[:5]}"


def test_the_corpus_stays_small_and_covers_every_recovery_row() -> None:
    assert sum(len(data) for data in files_of(CORPUS).values()) < 3 * 1024 * 1024
    names = [c.name for c in find_cases(CORPUS)]
    assert len(names) >= 50
    for row in "BCDFGHIJKL":
        assert any(f"-r-{row.lower()}-" in name for name in names), f"no case for R-@{row}"
    assert any("r-e-" in name for name in names)


def test_deferq_reader_passes_every_case() -> None:
    out = io.StringIO()
    status = run(CORPUS, in_process_deferq, out)
    assert status == 0, out.getvalue()
    assert out.getvalue().splitlines()[-1].endswith("failed=0")


def test_deferq_reader_runs_as_a_command_through_the_cli(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("clean-spec-worked-example", "wal-removes-across-files"):
        (corpus / name).mkdir()
        for path in (CORPUS / name).iterdir():
            (corpus / name / path.name).write_bytes(path.read_bytes())
    status = deferq_main(["conformance", "--corpus", str(corpus), "--", sys.executable, "-m",
                          "deferq.conformance.deferq_reader"])
    assert capsys.readouterr().out.splitlines()[-1] == "conformance: cases=2 passed=2 failed=0"
    assert status == 0


def test_the_reference_reader_passes_every_case() -> None:
    done = subprocess.run([sys.executable, "-m", "deferq", "conformance", "--", sys.executable,
                           str(REFERENCE)], capture_output=True, text=True, check=False)
    cases = len(find_cases(CORPUS))
    assert done.stdout.splitlines()[-1] == f"conformance: cases={cases} passed={cases} failed=0", \
        done.stdout[-3000:]
    assert done.returncode == 0


def test_the_reference_reader_imports_nothing_of_deferq() -> None:
    source = REFERENCE.read_text()
    assert "deferq" not in "".join(line for line in source.splitlines()
                                   if line.startswith(("import ", "from ")))


def test_a_reader_that_ignores_removes_fails(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    source = REFERENCE.read_text()
    applied = "pending.pop(task_id, None)"
    assert source.count(applied) == 1
    wrong = tmp_path / "wrong_reader.py"
    wrong.write_text(source.replace(applied, "pass"))
    status = deferq_main(["conformance", "--", sys.executable, str(wrong)])
    lines = capsys.readouterr().out.splitlines()
    assert status == 1
    assert any(line.startswith("FAIL wal-removes-across-files $.pending") for line in lines)
    summary = lines[-1]
    assert summary.startswith("conformance: cases=") and not summary.endswith("failed=0")


def test_a_reader_that_crashes_or_prints_no_json_fails(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "one").mkdir()
    (corpus / "one" / "expected.json").write_text(
        (CORPUS / "clean-empty-directory" / "expected.json").read_text())
    for code, status_text in (("import sys; sys.exit(4)", "exit status 4"),
                              ("print('hello')", "not JSON")):
        status = deferq_main(["conformance", "--corpus", str(corpus), "--", sys.executable,
                              "-c", code])
        out = capsys.readouterr().out
        assert status == 1 and status_text in out and out.endswith("failed=1\n")


def test_a_run_that_checked_nothing_fails(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    status = deferq_main(["conformance", "--corpus", str(tmp_path), "--", sys.executable,
                          str(REFERENCE)])
    assert status == 1
    assert capsys.readouterr().out.splitlines()[-1] == "conformance: cases=0 passed=0 failed=0"


def test_no_reader_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert deferq_main(["conformance"]) == 2
    assert "no reader command" in capsys.readouterr().err


def test_deferq_reader_never_writes_to_the_directory(tmp_path: Path) -> None:
    case = CORPUS / "wal-several-workers"
    for path in case.iterdir():
        (tmp_path / path.name).write_bytes(path.read_bytes())
    before = files_of(tmp_path)
    deferq_reader.read(str(tmp_path), "deferred-")
    assert files_of(tmp_path) == before
