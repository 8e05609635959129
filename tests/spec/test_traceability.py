"""Traceability between spec/ and the tests (the SQLite ``matrix.tcl`` idea).

Goal: every normative statement in spec/ is checked by at least one test, and
no test cites a statement that does not exist. Method: an ID is *defined* in
spec/*.md where it appears in bold (``**D-3**``) or as the first cell of a
table row (``| R-@C |``); a test *cites* an ID with ``@pytest.mark.spec(...)``
(on a function, a class, or as a module's ``pytestmark``), found by parsing
every test module's AST. A *retired* ID is struck through in spec/changelog.md
(``~~F-12~~``): it may be named in spec/ (never in src/) and never defined again.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ID = r"[A-Z]-(?:\d+|@[A-Z])"
DEFINED = re.compile(rf"\*\*({ID})\*\*|^\|\s*({ID})\s*\|", re.MULTILINE)
MENTIONED = re.compile(rf"(?<![\w-])({ID})(?![\w-])")
RETIRED = re.compile(rf"~~({ID})~~")


def retired_ids() -> set[str]:
    """The IDs spec/changelog.md lists as retired."""
    return set(RETIRED.findall((ROOT / "spec" / "changelog.md").read_text()))


def defined_ids() -> dict[str, str]:
    """Map each defined ID to the spec file defining it."""
    out: dict[str, str] = {}
    for path in sorted((ROOT / "spec").glob("*.md")):
        for match in DEFINED.finditer(path.read_text()):
            ident = match.group(1) or match.group(2)
            assert ident not in out or out[ident] == path.name, f"{ident} defined twice"
            out[ident] = path.name
    return out


def cited_ids() -> dict[str, list[str]]:
    """Map each ID cited by a test to the test files citing it."""
    out: dict[str, list[str]] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "spec"):
                for arg in node.args:
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                        out.setdefault(arg.value, []).append(str(path.relative_to(ROOT)))
    return out


@pytest.mark.spec("F-14")
def test_spec_defines_ids() -> None:
    assert len(defined_ids()) >= 50


def test_every_spec_id_is_cited_by_a_test() -> None:
    missing = sorted(set(defined_ids()) - set(cited_ids()))
    assert not missing, f"spec IDs no test cites: {missing}"


def test_every_cited_id_exists_in_spec() -> None:
    unknown = {i: files for i, files in cited_ids().items() if i not in defined_ids()}
    assert not unknown, f"tests cite IDs that spec/ does not define: {unknown}"


def test_every_id_mentioned_in_spec_or_src_is_defined() -> None:
    defined, retired = defined_ids(), retired_ids()
    texts = [p for p in (ROOT / "spec").glob("*.md")] + list((ROOT / "src").rglob("*.py"))
    unknown: dict[str, str] = {}
    for path in texts:
        allowed = retired if path.suffix == ".md" else set()
        for ident in MENTIONED.findall(path.read_text()):
            if ident not in defined and ident not in allowed:
                unknown.setdefault(ident, str(path.relative_to(ROOT)))
    assert not unknown, f"IDs mentioned but never defined: {unknown}"


def test_a_retired_id_is_never_defined_again() -> None:
    retired = retired_ids()
    assert {"F-12", "W-5"} <= retired  # the changelog's list is read at all
    reused = sorted(retired & set(defined_ids()))
    assert not reused, f"retired IDs defined again: {reused}"
