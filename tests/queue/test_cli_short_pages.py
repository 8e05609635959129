"""``deferq dead list``: a page shortened by undecodable records says so (spec/queue.md Q-190).

Goal: an operator paging with ``--limit`` never mistakes a short or empty page for the end of
the listing (S-33 lets undecodable records leave places empty). Method: a real ``deferq``
subprocess pages through a conformance corpus case with 27 undecodable records between two
good ones, following only what the footer says; the pages must add up to the case's expected
listing, and the footer must name the records left out exactly when there were some.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from deferq._cli.dead import list_footer
from deferq.conformance.cases import default_corpus, find_cases, materialize

CASE = "dead-r-g-payload-does-not-decode"
FOOTER = re.compile(r"^(\d+) dead task\(s\)(?:; (\d+) undecodable record\(s\) left out of this "
                    r"page \(each one logged; `deferq verify` counts them\)(?:; the next page "
                    r"starts at --offset (\d+))?)?$")


def _deferq(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "deferq", "--path", str(path), *args],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done


@pytest.fixture
def store(tmp_path: Path) -> tuple[Path, list[str], int]:
    case = next(c for c in find_cases(default_corpus()) if c.name == CASE)
    # The expectation is JSON of a shape conformance/README.md documents.
    expected: Any = materialize(case, tmp_path)
    undecodable = int(expected["damage"]["dead"]["R-@G"])
    assert undecodable > 0, "the case must hold undecodable records, or this test checks nothing"
    return tmp_path, [str(task["id"]) for task in expected["dead"]], undecodable


@pytest.mark.spec("Q-190", "S-33", "S-34", "S-81")
def test_paging_by_the_footer_reaches_every_task(store: tuple[Path, list[str], int]) -> None:
    path, expected_ids, undecodable = store
    seen: list[str] = []
    left_out = 0
    offset = 0
    pages = 0
    while True:
        pages += 1
        assert pages < 100, "the footers never reached the end of the listing"
        done = _deferq(path, "dead", "list", "--limit", "3", "--offset", str(offset))
        lines = done.stdout.splitlines()
        footer = FOOTER.match(lines[-1])
        assert footer is not None, lines[-1]
        shown = int(footer.group(1))
        seen += [line.split()[0] for line in lines[1:-1]] if shown else []
        assert len(lines) == (shown + 2 if shown else 1)
        if footer.group(2) is None:
            if shown < 3:  # short with nothing left out: the end of the listing
                break
            offset += 3
            continue
        left_out += int(footer.group(2))
        # Every record left out was named on standard error (S-43).
        assert done.stderr.count("Can't deserialize the dead-lettered task") == int(footer.group(2))
        assert footer.group(3) == str(offset + 3)
        offset = int(footer.group(3))
    assert seen == expected_ids
    assert left_out == undecodable
    assert pages > 3  # the case spreads its undecodable records over several pages


@pytest.mark.spec("Q-190", "Q-134")
def test_json_pages_keep_their_shape(store: tuple[Path, list[str], int]) -> None:
    path, expected_ids, _ = store
    done = _deferq(path, "dead", "list", "--json")
    assert [task["id"] for task in json.loads(done.stdout)] == expected_ids


@pytest.mark.spec("Q-190")
def test_the_footer_without_a_limit_names_no_next_page() -> None:
    assert list_footer(4, 0, 0, None) == "4 dead task(s)"
    assert list_footer(4, 0, 10, 5) == "4 dead task(s)"
    assert list_footer(0, 2, 0, None) == (
        "0 dead task(s); 2 undecodable record(s) left out of this page (each one logged; "
        "`deferq verify` counts them)")
    assert list_footer(1, 2, 10, 3).endswith("; the next page starts at --offset 13")
