"""``deferq conformance``: run a reader once per corpus case and report every difference.

Rules: for each case (name order) the runner materializes the store files into a fresh
temporary directory (cases.py), runs ``COMMAND... DIRECTORY PREFIX`` there with the case's
prefix, parses its stdout as one JSON document and compares it with ``expected.json``
(compare.py). A reader that exits non-zero, times out or prints something that is not
JSON fails that case with one difference at ``$``. Output: one line per difference,
``FAIL case path: expected X, got Y``; then ``conformance: cases=N passed=P failed=F``.
Exit status 0 only when N > 0 and F = 0 (a run that checked nothing must not pass), else 1.

``run`` takes the reader as a callable so that tests can run deferq's reader in process;
``command_reader`` wraps an external command.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

from deferq.conformance.cases import find_cases, materialize
from deferq.conformance.compare import Difference, differences, shown
from deferq.conformance.report import Json

# A reader gets (directory, prefix) and returns its stdout, or raises ReaderFailed.
Reader = Callable[[str, str], str]
CASE_TIMEOUT_S = 120.0  # a case of 9 MB read by a slow interpreter still fits


class ReaderFailed(Exception):
    """The reader did not produce a report (exit status, timeout); the message says why."""


def command_reader(command: Sequence[str]) -> Reader:
    def read(directory: str, prefix: str) -> str:
        try:
            done = subprocess.run([*command, directory, prefix], capture_output=True,
                                  timeout=CASE_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise ReaderFailed(f"timed out after {CASE_TIMEOUT_S:g} s") from None
        except OSError as exc:
            raise ReaderFailed(f"could not run the reader: {exc}") from None
        if done.returncode != 0:
            tail = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
            raise ReaderFailed(f"exit status {done.returncode} {tail[0][:200]}".rstrip())
        return done.stdout.decode("utf-8", "replace")
    return read


def check_case(expected: Json, output: str) -> list[Difference]:
    try:
        got: Json = json.loads(output)
    except ValueError as exc:
        return [Difference("$", "one JSON document", f"not JSON ({exc})")]
    return differences(expected, got)


def run(corpus: Path, reader: Reader, out: TextIO) -> int:
    """Check ``reader`` against every case of ``corpus``; print the report; return the status."""
    cases = find_cases(corpus)
    failed = 0
    for case in cases:
        with tempfile.TemporaryDirectory(prefix="deferq-conformance-") as scratch:
            directory = Path(scratch) / case.name
            directory.mkdir()
            expected = materialize(case, directory)
            assert isinstance(expected, dict) and isinstance(expected["prefix"], str)
            try:
                found = check_case(expected, reader(str(directory), expected["prefix"]))
            except ReaderFailed as exc:
                found = [Difference("$", "a report (exit status 0)", str(exc))]
        for diff in found:
            print(f"FAIL {case.name} {diff.path}: expected {shown(diff.expected)}, "
                  f"got {shown(diff.got)}", file=out)
        failed += bool(found)
    print(f"conformance: cases={len(cases)} passed={len(cases) - failed} failed={failed}",
          file=out)
    return 0 if cases and not failed else 1
