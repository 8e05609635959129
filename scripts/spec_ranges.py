"""Rewrite (or, with --check, verify) the IDs column of spec/README.md's file table.

Why a script: every change that adds or retires a spec ID also changed this column by hand, and
parallel branches then conflicted on the same table rows. The column is derived data: the IDs each
spec file defines (bold ``**X-n**`` or a table row's first cell, the rule of
tests/spec/test_traceability.py), collapsed into ranges of consecutive numbers.
Usage: python scripts/spec_ranges.py [--check]   (exit 1 with --check when the table is stale)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "spec"
ID = r"[A-Z]-(?:\d+|@[A-Z])"
DEFINED = re.compile(rf"\*\*({ID})\*\*|^\|\s*({ID})\s*\|", re.MULTILINE)
ROW = re.compile(r"^\| \[(?P<file>[\w.-]+\.md)\]\((?P=file)\) \| (?P<ids>[^|]*) \| (?P<rest>.*)$", re.MULTILINE)


def _key(ident: str) -> tuple[str, int]:
    prefix, _, number = ident.partition("-")
    return prefix, ord(number[1]) if number.startswith("@") else int(number)


def _runs(idents: list[str]) -> list[str]:
    """Consecutive IDs of one prefix collapsed into ``first … last``."""
    name = {_key(i): i for i in idents}
    runs: list[list[tuple[str, int]]] = []
    for key in sorted(name):
        if runs and runs[-1][-1][0] == key[0] and runs[-1][-1][1] + 1 == key[1]:
            runs[-1].append(key)
        else:
            runs.append([key])
    return [name[r[0]] if len(r) == 1 else f"{name[r[0]]} … {name[r[-1]]}" for r in runs]


def ids_column(path: Path) -> str:
    found = [m.group(1) or m.group(2) for m in DEFINED.finditer(path.read_text())]
    if not found:
        return "none"
    by_prefix: dict[str, list[str]] = {}
    for ident in found:
        by_prefix.setdefault(ident.split("-")[0], []).append(ident)
    order = sorted(by_prefix, key=lambda p: found.index(by_prefix[p][0]))
    return ", ".join(run for prefix in order for run in _runs(by_prefix[prefix]))


def rendered() -> tuple[str, str]:
    readme = SPEC / "README.md"
    text = readme.read_text()
    new = ROW.sub(lambda m: f"| [{m['file']}]({m['file']}) | {ids_column(SPEC / m['file'])} | {m['rest']}", text)
    return text, new


def main(argv: list[str]) -> int:
    text, new = rendered()
    listed = {m["file"] for m in ROW.finditer(text)}
    missing = sorted(p.name for p in SPEC.glob("*.md") if p.name != "README.md" and p.name not in listed
                     and DEFINED.search(p.read_text()))
    if missing:
        print(f"spec/README.md: no table row for {', '.join(missing)}", file=sys.stderr)
        return 1
    if "--check" in argv:
        if new != text:
            print("spec/README.md: the IDs column is stale; run python scripts/spec_ranges.py", file=sys.stderr)
            return 1
        return 0
    (SPEC / "README.md").write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
