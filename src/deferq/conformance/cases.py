"""The corpus: where it is, which cases it holds, and how a case becomes a storage directory.

Rules: a case is a subdirectory of the corpus holding ``expected.json``; cases run in name
order. A reader never reads the shipped directory itself: ``materialize`` copies the store
files (everything but ``expected.json`` and ``generated.json``) into a fresh directory, so a
reader that writes (deferq's Disk adopts WAL files) cannot change the corpus. A case whose
files would be too large to ship (an over-long line, a context at the 4 MiB limit) lists
them in ``generated.json`` as ``{file name: [{"base64": text, "repeat": n}, ...]}``: the file
is the concatenation of each segment's decoded bytes repeated ``repeat`` times (default 1).
``expected.json`` itself may be generated that way when it holds such a context.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from deferq.conformance.report import Json

EXPECTED = "expected.json"
GENERATED = "generated.json"
NOT_STORE_FILES = frozenset({EXPECTED, GENERATED})


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    source: Path


def default_corpus() -> Path:
    """The corpus shipped as package data: in a checkout this is the repository's copy."""
    return Path(__file__).resolve().parent / "corpus"


def find_cases(corpus: Path) -> list[Case]:
    if not corpus.is_dir():
        return []
    return [Case(entry.name, entry) for entry in sorted(corpus.iterdir(), key=lambda p: p.name)
            if (entry / EXPECTED).is_file() or (entry / GENERATED).is_file()]


def generated_files(case: Case) -> dict[str, bytes]:
    """The files ``generated.json`` describes, by name (empty when the case has none)."""
    path = case.source / GENERATED
    if not path.is_file():
        return {}
    spec = json.loads(path.read_text("ascii"))
    assert isinstance(spec, dict)
    out: dict[str, bytes] = {}
    for name, segments in spec.items():
        assert isinstance(segments, list)
        parts = []
        for segment in segments:
            assert isinstance(segment, dict)
            text, repeat = segment["base64"], segment.get("repeat", 1)
            assert isinstance(text, str) and isinstance(repeat, int)
            parts.append(base64.b64decode(text, validate=True) * repeat)
        out[name] = b"".join(parts)
    return out


def materialize(case: Case, target: Path) -> Json:
    """Write the case's store files into the empty directory ``target``; return its expectation."""
    generated = generated_files(case)
    for entry in sorted(case.source.iterdir(), key=lambda p: p.name):
        if entry.name in NOT_STORE_FILES:
            continue
        # Symlinks stay symlinks (git can ship them); nothing else but regular files is shipped.
        if entry.is_symlink():
            os.symlink(os.readlink(entry), target / entry.name)
        else:
            shutil.copyfile(entry, target / entry.name)
    for name, data in generated.items():
        if name != EXPECTED:
            (target / name).write_bytes(data)
    raw = generated[EXPECTED] if EXPECTED in generated else (case.source / EXPECTED).read_bytes()
    expected: Json = json.loads(raw)
    return expected
