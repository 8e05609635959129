"""Structural differences between an expected and a reported JSON document.

Rules: objects compare key by key (a missing or an extra key is a difference), arrays
element by element plus their length, scalars by value and JSON type (``true`` is not
``1``, ``1.0`` is not ``1``). Each difference names its JSON path (``$.pending[0].id``),
so a reader's author sees where, not only that, it disagrees.
"""

from __future__ import annotations

import json
from typing import NamedTuple

from deferq.conformance.report import Json

SHOWN_CHARS_MAX = 160  # long contexts are cut in the message; the path says where they differ


class Difference(NamedTuple):
    path: str
    expected: Json
    got: Json


MISSING = "<missing>"


def differences(expected: Json, got: Json, path: str = "$") -> list[Difference]:
    if isinstance(expected, dict) and isinstance(got, dict):
        out: list[Difference] = []
        for key in sorted(expected.keys() | got.keys()):
            where = f"{path}.{key}"
            if key not in got:
                out.append(Difference(where, expected[key], MISSING))
            elif key not in expected:
                out.append(Difference(where, MISSING, got[key]))
            else:
                out.extend(differences(expected[key], got[key], where))
        return out
    if isinstance(expected, list) and isinstance(got, list):
        out = []
        for index, (want, have) in enumerate(zip(expected, got)):
            out.extend(differences(want, have, f"{path}[{index}]"))
        if len(expected) != len(got):
            out.append(Difference(f"{path}.length", len(expected), len(got)))
        return out
    if type(expected) is not type(got) or expected != got:
        return [Difference(path, expected, got)]
    return []


def shown(value: Json) -> str:
    text = value if value == MISSING else json.dumps(value, ensure_ascii=True)
    assert isinstance(text, str)
    return text if len(text) <= SHOWN_CHARS_MAX else f"{text[:SHOWN_CHARS_MAX]}...({len(text)} chars)"
