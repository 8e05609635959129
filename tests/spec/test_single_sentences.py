"""Every numbered statement of spec/ is one testable sentence (spec/README.md).

Goal: keep statements single rules as the spec grows: rationale, history and measurements go
in the "Note:" paragraphs after a statement, never inside it. Method: take the text of every
bold-ID statement (from its ID to the next statement, blank line or note), drop code spans, and
require one sentence (no full stop followed by a capital letter), the word "must" or "may", and a
bounded length; a statement that is one rule over an enumeration (a list, a table or an ordered
sequence of steps) may be longer and is named below with the reason.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STATEMENT = re.compile(r"^- \*\*([A-Z]-\d+)\*\*(.*?)(?=^\s*$|^- \*\*|^  Note:|\Z)",
                       re.MULTILINE | re.DOTALL)
CODE = re.compile(r"`[^`]*`")
SENTENCE_BREAK = re.compile(r"[.!?] +[A-Z]")
LENGTH_MAX = 650
# One rule over an enumeration: the length is the list's, not several rules'.
ENUMERATIONS = {
    "C-7": "the list of arguments every Disk method validates",
    "Q-58": "the order in which status answers",
    "F-17": "the table of field limits",
    "Q-134": "the table of JSON result shapes",
}


def statements() -> list[tuple[str, str, str]]:
    out = []
    for path in sorted((ROOT / "spec").glob("*.md")):
        for match in STATEMENT.finditer(path.read_text()):
            out.append((path.name, match.group(1), " ".join(match.group(2).split())))
    return out


def test_the_statements_were_found() -> None:
    found = statements()
    assert len(found) > 500, "the statement pattern no longer matches spec/"
    assert {ident for _, ident, _ in found} >= set(ENUMERATIONS)


@pytest.mark.parametrize(("name", "ident", "text"), statements(),
                         ids=[ident for _, ident, _ in statements()])
def test_a_statement_is_one_sentence_with_must_or_may(name: str, ident: str, text: str) -> None:
    plain = CODE.sub("CODE", text)
    assert not SENTENCE_BREAK.search(plain), (
        f"{name} {ident} holds more than one sentence: split it or move the rest to a Note")
    assert re.search(r"\b(must|may)\b", plain), f"{name} {ident} states no must or may"
    if ident not in ENUMERATIONS:
        assert len(text) <= LENGTH_MAX, (
            f"{name} {ident} is {len(text)} characters: split it into single rules")
