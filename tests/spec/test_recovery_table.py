"""The recovery decision table in spec/recovery.md is the table in the code (STYLE rule 19).

Goal: what the spec says each reader and writer does with each kind of line is exactly what
``RECOVERY_TABLE`` in ``deferq._core.recovery`` holds, label for label and cell for cell, and the labels are
the ones the codec reports. Method: parse the Markdown table of spec/recovery.md (rows whose first cell
is an ``R-@`` label), compare it with ``RECOVERY_TABLE`` row for row, and check that every fault the
codec can report (``LineFault``) names a row of that table. The behaviour of each row is checked by the
behavioural tests that also cite these labels.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from deferq._core.frame import LineFault
from deferq._core.recovery import RECOVERY_TABLE, Rule

RECOVERY_MD = Path(__file__).resolve().parents[2] / "spec" / "recovery.md"
LABELS = tuple(f"R-@{letter}" for letter in "ABCDEFGHIJKL")
HEADER = ("Label", "Condition", "WAL reader", "Dead-task reader", "Writer")


def table_rows() -> list[tuple[str, ...]]:
    """Every row of spec/recovery.md's table whose first cell is an R-@ label, as stripped cells."""
    rows = []
    for line in RECOVERY_MD.read_text(encoding="utf-8").splitlines():
        if re.match(r"^\|\s*R-@[A-Z]\s*\|", line):
            assert line.rstrip().endswith("|"), f"table row does not end with '|': {line!r}"
            rows.append(tuple(cell.strip() for cell in line.strip().strip("|").split("|")))
    return rows


def header_row() -> tuple[str, ...]:
    for line in RECOVERY_MD.read_text(encoding="utf-8").splitlines():
        if line.startswith("| Label |"):
            return tuple(cell.strip() for cell in line.strip().strip("|").split("|"))
    raise AssertionError("spec/recovery.md has no table header starting with '| Label |'")


def as_cells(rule: Rule) -> tuple[str, ...]:
    return (rule.label, rule.condition, rule.wal_reader, rule.dead_reader, rule.writer)


@pytest.mark.spec(*LABELS)
def test_spec_table_equals_code_table_row_for_row() -> None:
    assert table_rows() == [as_cells(rule) for rule in RECOVERY_TABLE]


@pytest.mark.spec(*LABELS)
def test_table_has_the_columns_and_labels_of_the_spec() -> None:
    assert header_row() == HEADER
    assert tuple(rule.label for rule in RECOVERY_TABLE) == LABELS
    assert all(len(row) == len(HEADER) for row in table_rows())


@pytest.mark.spec("R-@B", "R-@C", "R-@D", "R-@E", "R-@F", "R-@G")
def test_every_fault_the_codec_reports_is_a_row_of_the_table() -> None:
    labels = {rule.label for rule in RECOVERY_TABLE}
    assert {fault.value for fault in LineFault} <= labels
