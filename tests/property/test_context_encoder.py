"""The context encoder's fast path writes exactly what ``json.dumps`` writes (Q-5, Q-6).

``encode_context`` calls a C encoder built once instead of ``json.dumps`` (which builds
one per call). Equal records must still encode to equal bytes, the same bytes as before,
so stored contexts and their decoding do not change; and whatever was refused before is
refused the same way.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deferq import SerializationError
from deferq._runtime.serialize import Context, decode_context, encode_context

_SCALARS = (st.none() | st.booleans() | st.integers() | st.text()
            | st.floats(allow_nan=False, allow_infinity=False))
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


def _json_dumps(context: Context) -> bytes:
    record = {"v": 1, "task": context.task, "args": list(context.args),
              "kwargs": context.kwargs, "attempts": context.attempts}
    return json.dumps(record, ensure_ascii=False, allow_nan=False,
                      separators=(",", ":")).encode("utf-8")


@pytest.mark.spec("Q-5")
@settings(max_examples=300, deadline=None)
@given(task=st.text(min_size=1), args=st.lists(_VALUES, max_size=4),
       kwargs=st.dictionaries(st.text(), _VALUES, max_size=4),
       attempts=st.integers(min_value=0, max_value=10**6))
def test_encoding_equals_json_dumps_and_round_trips(task: str, args: list[object],
                                                     kwargs: dict[str, object],
                                                     attempts: int) -> None:
    context = Context(task, tuple(args), kwargs, attempts)
    try:
        expected = _json_dumps(context)
    except UnicodeEncodeError:  # a lone surrogate: refused
        with pytest.raises(SerializationError):
            encode_context(context)
        return
    assert encode_context(context) == expected
    assert decode_context(expected) == context


@pytest.mark.spec("Q-6")
@pytest.mark.parametrize("bad", [math.nan, -math.inf, (1,), {"k": {1: 2}}, [[object()]]])
def test_the_fast_path_still_refuses_what_json_cannot_store(bad: object) -> None:
    for context in (Context("t", (bad,), {}, 0), Context("t", (), {"k": bad}, 0)):
        with pytest.raises(SerializationError):
            encode_context(context)


@pytest.mark.spec("Q-6")
def test_a_reference_cycle_is_refused_as_too_deep() -> None:
    cycle: list[object] = []
    cycle.append(cycle)
    with pytest.raises(SerializationError, match="nested more than"):
        encode_context(Context("t", (cycle,), {}, 0))


_PLAIN_SCALARS = st.none() | st.booleans() | st.integers() | st.text()


@pytest.mark.spec("Q-5")
@settings(max_examples=300, deadline=None)
@given(task=st.text(min_size=1), args=st.lists(_PLAIN_SCALARS, max_size=5),
       kwargs=st.dictionaries(st.text(), _PLAIN_SCALARS, max_size=5),
       attempts=st.integers(min_value=0, max_value=10**9))
def test_the_scalar_fast_path_writes_exactly_what_json_dumps_writes(
        task: str, args: list[object], kwargs: dict[str, object], attempts: int) -> None:
    # Arguments that are all None, bool, int or str take encode_context's hand-built path.
    context = Context(task, tuple(args), kwargs, attempts)
    try:
        expected = _json_dumps(context)
    except UnicodeEncodeError:
        with pytest.raises(SerializationError, match="not valid Unicode"):
            encode_context(context)
        return
    assert encode_context(context) == expected
    assert decode_context(expected) == context


class _Int(int):
    def __repr__(self) -> str:
        return "not json"


class _Str(str):
    pass


@pytest.mark.spec("Q-5")
@pytest.mark.parametrize("value", [_Int(3), _Str("s"), 1.5, [1, "a"], {"k": None}])
def test_values_off_the_scalar_path_still_encode_as_json_dumps_does(value: object) -> None:
    for context in (Context("t", (1, value), {}, 0), Context("t", (), {"k": value, "j": 2}, 0)):
        assert encode_context(context) == _json_dumps(context)
