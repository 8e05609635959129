"""The tree keeps the shape docs/architecture.md describes (issue: a layout that shows the
architecture).

Goal: modules stay small enough to read and the architecture page stays true. Method: parse
every module of the package; a class may have at most ``CLASS_LINES_MAX`` lines, a module at
most ``MODULE_LINES_MAX`` unless its docstring says why (a sentence starting "Why"); and every
module of a library layer is named in that layer's row of the table in docs/architecture.md.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "deferq"
CLASS_LINES_MAX = 300
MODULE_LINES_MAX = 450
LAYER_DIRS = {"_core": "`_core`", "_engine": "`_engine`", "backends": "`backends`",
              "_runtime": "`_runtime`", "_cli": "`_cli`"}
SOURCES = sorted([*PACKAGE.rglob("*.py"), *(ROOT / "conformance").glob("*.py")])


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_class_is_over_300_lines_and_a_long_module_says_why(path: Path) -> None:
    text = path.read_text()
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            assert node.end_lineno is not None
            size = node.end_lineno - node.lineno + 1
            assert size <= CLASS_LINES_MAX, f"class {node.name} has {size} lines"
    lines = len(text.splitlines())
    if lines > MODULE_LINES_MAX:
        docstring = ast.get_docstring(tree) or ""
        assert re.search(r"(^|\n|\. )Why ", docstring), (
            f"{lines} lines and no reason at the top (a sentence starting 'Why')")


def test_the_size_rules_can_fail() -> None:
    # A class of 301 lines and a long module without a reason are what the test above rejects.
    body = "\n".join(f"    x{i} = {i}" for i in range(300))
    tree = ast.parse(f"class Big:\n{body}\n")
    node = tree.body[0]
    assert isinstance(node, ast.ClassDef) and node.end_lineno is not None
    assert node.end_lineno - node.lineno + 1 > CLASS_LINES_MAX


def _architecture_rows() -> dict[str, str]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    rows = {}
    for line in text.splitlines():
        for layer, cell in LAYER_DIRS.items():
            if line.startswith(f"| {cell}"):
                rows[layer] = line
    return rows


@pytest.mark.parametrize("layer", sorted(LAYER_DIRS))
def test_docs_architecture_names_every_module_of_each_layer(layer: str) -> None:
    row = _architecture_rows()[layer]
    # A package's __init__ only re-exports, except the command line's, which holds main().
    modules = sorted(p.stem for p in (PACKAGE / layer).glob("*.py")
                     if p.stem != "__init__" or layer == "_cli")
    assert len(modules) >= 3
    named = set(re.findall(r"`(\w+)`", row.split("|")[2]))
    missing = [m for m in modules if m not in named]
    assert missing == [], f"docs/architecture.md's {layer} row does not name {missing}"
    stale = sorted(named - set(modules))
    assert stale == [], f"docs/architecture.md's {layer} row names missing modules {stale}"
