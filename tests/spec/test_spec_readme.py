"""spec/README.md's file table lists exactly the IDs each spec file defines (scripts/spec_ranges.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_ids_column_is_current() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "spec_ranges.py"), "--check"],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_a_stale_column_is_found(tmp_path: Path) -> None:
    """The check fails on a table whose ranges do not match the definitions (it can fail)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("spec_ranges", ROOT / "scripts" / "spec_ranges.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (tmp_path / "x.md").write_text("**X-1** one.\n**X-2** two.\n**X-4** four.\n| R-@A | row |\n")
    assert module.ids_column(tmp_path / "x.md") == "X-1 … X-2, X-4, R-@A"
    assert module.ids_column(tmp_path / "x.md") != "X-1 … X-4, R-@A"
