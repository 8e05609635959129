"""Arguments beyond plain JSON (spec/queue.md Q-30): UUID, datetime, date, Decimal and listed
models come back exactly, of the same types, through an explicit codec option.

Method: round-trip values (hand-picked edge cases and Hypothesis-generated nests) through
``ContextCodec(json_types=...)``; check that plain arguments still make the same version-1
bytes as the default codec, that what cannot come back exactly is refused at enqueue, that
hostile or unknown tags are refused when read, and that a real queue hands ``perform`` the
very values enqueued.
"""

from __future__ import annotations

import asyncio
import datetime
import decimal
import json
import uuid
import zoneinfo

import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st

import deferq
from deferq import ContextCodec, ContextError, JsonTypes, SerializationError
from deferq._runtime.serialize import Context, encode_context
from deferq.testing import TestKit


class Address(pydantic.BaseModel):
    street: str
    zip_code: str


class User(pydantic.BaseModel):
    id: uuid.UUID
    name: str
    signed_up: datetime.datetime
    balance: decimal.Decimal
    address: Address | None = None


PARIS = zoneinfo.ZoneInfo("Europe/Paris")
CODEC = ContextCodec(json_types=JsonTypes(models=[User, Address]))
EDGE_VALUES: list[object] = [
    uuid.UUID("12345678-1234-5678-1234-567812345678"),
    datetime.datetime(2026, 12, 4, 16, 48, 7, 123456),
    datetime.datetime(2026, 12, 4, 16, 48, 7, tzinfo=datetime.timezone.utc),
    datetime.datetime(2026, 12, 4, 16, 48, 7, tzinfo=datetime.timezone(datetime.timedelta(hours=-5, minutes=-30))),
    datetime.datetime(2026, 10, 25, 2, 30, tzinfo=PARIS, fold=1),  # the second 02:30 of the DST change
    datetime.datetime(2026, 10, 25, 2, 30, tzinfo=PARIS, fold=0),
    datetime.datetime(2026, 3, 29, 2, 30, tzinfo=PARIS),  # a wall time the DST change skips
    datetime.date(1, 1, 1),
    decimal.Decimal("1.10"), decimal.Decimal("-0"), decimal.Decimal("1E+3"), decimal.Decimal("NaN"),
    decimal.Decimal("123456789012345678901234567890.000000001"),
    User(id=uuid.uuid4(), name="Ada", signed_up=datetime.datetime(2026, 1, 1, tzinfo=PARIS),
         balance=decimal.Decimal("10.50"), address=Address(street="1 rue", zip_code="75001")),
    {"$deferq": "uuid", "value": "not a tag, a user's dict"},
    [{"nested": [decimal.Decimal("2.5"), None, True]}],
]


def _same(a: object, b: object) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, decimal.Decimal):
        assert isinstance(b, decimal.Decimal)
        return a.as_tuple() == b.as_tuple()  # digits and exponent, NaN included
    if isinstance(a, datetime.datetime):
        assert isinstance(b, datetime.datetime)
        return (a == b and a.tzinfo == b.tzinfo and a.fold == b.fold
                and a.utcoffset() == b.utcoffset())
    if isinstance(a, list):
        assert isinstance(b, list)
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        assert isinstance(b, dict)
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def _round_trip(codec: ContextCodec, *args: object, **kwargs: object) -> Context:
    return codec.decode(codec.encode(Context("t", args, kwargs, 2)))


@pytest.mark.spec("Q-30", "Q-150")
@pytest.mark.parametrize("value", EDGE_VALUES, ids=lambda v: type(v).__name__)
def test_each_type_comes_back_exactly(value: object) -> None:
    got = _round_trip(CODEC, value, key=value)
    assert _same(got.args[0], value) and _same(got.kwargs["key"], value)
    assert got.attempts == 2 and got.task == "t"


_LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(), st.text(max_size=5),
    st.floats(allow_nan=False, allow_infinity=False), st.uuids(),
    st.datetimes(timezones=st.sampled_from([None, datetime.timezone.utc, PARIS])),
    st.dates(), st.decimals(allow_nan=True, allow_infinity=True, places=None),
)
_VALUES = st.recursive(_LEAVES, lambda inner: st.one_of(
    st.lists(inner, max_size=3),
    st.dictionaries(st.sampled_from(["a", "b", "$deferq", "value"]), inner, max_size=3)),
    max_leaves=10)


@pytest.mark.spec("Q-30", "Q-150")
@given(_VALUES)
def test_any_nest_of_these_types_comes_back_exactly(value: object) -> None:
    assert _same(_round_trip(CODEC, value).args[0], value)


@pytest.mark.spec("Q-30", "Q-151")
def test_plain_arguments_keep_version_1_and_the_default_codecs_bytes() -> None:
    context = Context("t", (1, "x", [None, 2.5], {"a": True}), {"k": "v"}, 0)
    assert CODEC.encode(context) == encode_context(context)
    assert json.loads(CODEC.encode(Context("t", (uuid.uuid4(),), {}, 0)))["v"] == 2


@pytest.mark.spec("Q-30", "Q-152")
@pytest.mark.parametrize(("value", "says"), [
    (datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc).astimezone(
        datetime.timezone.utc).replace(tzinfo=type("Odd", (datetime.tzinfo,), {
            "utcoffset": lambda self, dt: datetime.timedelta(0),
            "__repr__": lambda self: "Odd()"})()), "cannot come back as itself"),
    (Address.model_construct(street="s", zip_code="z").__class__.__new__(
        type("Other", (pydantic.BaseModel,), {"__annotations__": {"x": int}})), "list its class"),
    ({1, 2}, "cannot be stored"),
    (float("nan"), "which JSON cannot represent"),
    ({1: "int key"}, "keys must be str"),
])
def test_what_cannot_come_back_exactly_is_refused_at_enqueue(value: object, says: str) -> None:
    with pytest.raises(SerializationError, match=says):
        CODEC.encode(Context("t", (value,), {}, 0))


@pytest.mark.spec("Q-30", "Q-153", "Q-154")
@pytest.mark.parametrize("record", [
    {"v": 2, "task": "t", "args": [{"$deferq": "model", "model": "os.system", "value": "rm"}],
     "kwargs": {}, "attempts": 0},
    {"v": 2, "task": "t", "args": [{"$deferq": "pickle", "value": "gASV"}], "kwargs": {},
     "attempts": 0},
    {"v": 2, "task": "t", "args": [{"$deferq": "uuid", "value": "nope"}], "kwargs": {},
     "attempts": 0},
    {"v": 2, "task": "t", "args": [{"$deferq": "uuid", "value": "x", "extra": 1}],
     "kwargs": {}, "attempts": 0},
    {"v": 2, "task": "t", "args": [{"$deferq": "datetime", "value": "2026-01-01T00:00:00+05:00",
                                    "zone": "Europe/Paris"}], "kwargs": {}, "attempts": 0},
    {"v": 2, "task": "t", "args": [{"$deferq": "model", "model": f"{__name__}.User",
                                    "value": {"name": 3}}], "kwargs": {}, "attempts": 0},
])
def test_a_tag_that_does_not_decode_is_a_context_error(record: dict[str, object]) -> None:
    with pytest.raises(ContextError):
        CODEC.decode(json.dumps(record).encode())


@pytest.mark.spec("Q-30", "Q-153")
def test_a_version_2_record_read_without_json_types_names_the_option() -> None:
    data = CODEC.encode(Context("t", (uuid.uuid4(),), {}, 0))
    with pytest.raises(ContextError, match="json_types"):
        ContextCodec().decode(data)
    with pytest.raises(ValueError, match="use_pickle"):
        ContextCodec(pickle_key=b"k" * 16, use_pickle=True, json_types=JsonTypes())
    with pytest.raises(ValueError, match="not a model class"):
        JsonTypes(models=[dict])


REGISTRY = deferq.TaskRegistry()
RECEIVED: list[tuple[object, ...]] = []


class Charge(deferq.Task, name="json_types.Charge", registry=REGISTRY):
    async def perform(self, user: User, amount: decimal.Decimal, *, at: datetime.datetime) -> None:
        RECEIVED.append((user, amount, at))


@pytest.mark.spec("Q-30")
def test_perform_receives_the_very_values_enqueued_across_a_restart() -> None:
    kit = TestKit(registry=REGISTRY)
    user = next(v for v in EDGE_VALUES if isinstance(v, User))
    amount = decimal.Decimal("19.990")
    at = datetime.datetime(2026, 12, 24, 18, 0, tzinfo=PARIS)

    async def main() -> None:
        first = deferq.Queue(kit.backend, registry=REGISTRY, clock=kit.clock, codec=CODEC)
        await first.start()
        first.enqueue(Charge, user, amount, at=at, delay=60)
        await first.stop(timeout=1)  # the task waits in the backend
        second = deferq.Queue(kit.backend, registry=REGISTRY, clock=kit.clock, codec=CODEC)
        await second.start()
        await kit.drain(second)
        await second.stop(timeout=1)

    RECEIVED.clear()
    asyncio.run(main())
    [(got_user, got_amount, got_at)] = RECEIVED
    assert _same(got_user, user) and _same(got_amount, amount) and _same(got_at, at)
