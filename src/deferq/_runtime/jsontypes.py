"""Argument types beyond plain JSON, each tagged so that it comes back exactly (spec/queue.md Q-30).

Rules:
- Errors: a value that cannot be stored is a ``SerializationError`` at enqueue; a tag that
  does not decode is a ``ContextError`` (the queue dead-letters the task with the reason).
- Off by default: a codec stores plain JSON and refuses anything else (Q-5). With
  ``ContextCodec(json_types=JsonTypes(models=[...]))`` it also stores ``uuid.UUID``,
  ``datetime.datetime``, ``datetime.date``, ``decimal.Decimal`` and instances of the model
  classes listed (Pydantic models: anything with ``model_dump`` and a ``model_validate``
  classmethod), and ``perform`` receives values equal to those enqueued, of the same types.
- A value of such a type is written as an object ``{"$deferq": KIND, "value": ...}``
  (a model adds ``"model": NAME``, a zoned datetime ``"zone": KEY``); a dict argument that
  itself has the key ``"$deferq"`` is written as ``{"$deferq": "dict", "value": {...}}`` so
  it cannot be taken for a tag. Every tag is checked when read: an unknown kind, a model
  name that is not listed, or a value its type does not parse is a ``ContextError``.
- Only listed model classes are ever built: a stored name never imports anything.
- Exactness: a datetime keeps its microseconds and its tzinfo (none, a fixed offset, or a
  ``zoneinfo.ZoneInfo`` by key); any other tzinfo cannot come back as itself and is refused
  at enqueue. A Decimal keeps its digits and exponent (``str`` and back).
"""

from __future__ import annotations

import datetime
import decimal
import uuid
import zoneinfo
from collections.abc import Callable, Iterable, Mapping
from typing import Final

from deferq._runtime.errors import ContextError as JsonTagError
from deferq._runtime.errors import SerializationError as JsonTypeError

TAG: Final = "$deferq"
_MAX_DEPTH: Final = 100


class JsonTypes:
    """The extra argument types a ``ContextCodec`` may store (Q-30).

    Args:
        models: model classes whose instances may be arguments, each stored under its
            ``module.QualName`` and rebuilt with its ``model_validate``.
    """

    def __init__(self, *, models: Iterable[type] = ()) -> None:
        self._models: dict[str, type] = {}
        self._names: dict[type, str] = {}
        for cls in models:
            if not isinstance(cls, type) or not callable(getattr(cls, "model_dump", None)) \
                    or not callable(getattr(cls, "model_validate", None)):
                raise ValueError(f"{cls!r} is not a model class: it needs model_dump and a "
                                 "model_validate classmethod (a Pydantic model has both)")
            name = f"{cls.__module__}.{cls.__qualname__}"
            if name in self._models and self._models[name] is not cls:
                raise ValueError(f"two model classes are named {name!r}")
            self._models[name] = cls
            self._names[cls] = name

    # ------------------------------------------------------------------ encoding

    def encode(self, value: object, where: str, depth: int = 0) -> tuple[object, bool]:
        """``value`` as plain JSON values, and whether a tag was needed anywhere in it.

        Raises:
            JsonTypeError: a value no rule of this module can store exactly.
        """
        if depth > _MAX_DEPTH:
            raise JsonTypeError(f"{where} is nested more than {_MAX_DEPTH} levels deep")
        if value is None or isinstance(value, (bool, int, str)):
            return value, False
        if isinstance(value, float):
            if value != value or value in (float("inf"), float("-inf")):
                raise JsonTypeError(f"{where} is {value!r}, which JSON cannot represent")
            return value, False
        if isinstance(value, list):
            items = [self.encode(item, f"{where}[{i}]", depth + 1) for i, item in enumerate(value)]
            return [item for item, _ in items], any(tagged for _, tagged in items)
        if isinstance(value, dict):
            out: dict[str, object] = {}
            tagged = False
            for key, item in value.items():
                if not isinstance(key, str):
                    raise JsonTypeError(f"{where} has a key of type {type(key).__name__}; "
                                        "JSON object keys must be str")
                out[key], inner = self.encode(item, f"{where}[{key!r}]", depth + 1)
                tagged = tagged or inner
            if TAG in out:
                return {TAG: "dict", "value": out}, True
            return out, tagged
        return self._tagged(value, where), True

    def _tagged(self, value: object, where: str) -> dict[str, object]:
        if isinstance(value, uuid.UUID):
            return {TAG: "uuid", "value": str(value)}
        if isinstance(value, datetime.datetime):
            return self._datetime(value, where)
        if isinstance(value, datetime.date):
            return {TAG: "date", "value": value.isoformat()}
        if isinstance(value, decimal.Decimal):
            return {TAG: "decimal", "value": str(value)}
        name = self._names.get(type(value))
        if name is not None:
            dump = getattr(value, "model_dump")  # noqa: B009 - listed model classes have it
            return {TAG: "model", "model": name, "value": dump(mode="json")}
        hint = ("; list its class in JsonTypes(models=...)"
                if callable(getattr(value, "model_dump", None)) else "")
        raise JsonTypeError(f"{where} of type {type(value).__name__} cannot be stored as JSON "
                            f"unchanged{hint}")

    @staticmethod
    def _datetime(value: datetime.datetime, where: str) -> dict[str, object]:
        zone = value.tzinfo
        tag: dict[str, object] = {TAG: "datetime", "value": value.isoformat()}
        if value.fold:  # not in the ISO text; part of the value (the second of a repeated hour)
            tag["fold"] = 1
        if zone is None or isinstance(zone, datetime.timezone):
            return tag
        if isinstance(zone, zoneinfo.ZoneInfo) and zone.key:
            tag["zone"] = zone.key
            return tag
        raise JsonTypeError(f"{where} is a datetime with tzinfo {zone!r}, which cannot come "
                            "back as itself: use a datetime.timezone or a zoneinfo.ZoneInfo")

    # ------------------------------------------------------------------ decoding

    def decode(self, value: object, depth: int = 0) -> object:
        """The values ``encode`` was given, from what it returned. Raises ``JsonTagError``."""
        if depth > _MAX_DEPTH:
            raise JsonTagError(f"context is nested more than {_MAX_DEPTH} levels deep")
        if isinstance(value, list):
            return [self.decode(item, depth + 1) for item in value]
        if not isinstance(value, dict):
            return value
        if TAG not in value:
            return {key: self.decode(item, depth + 1) for key, item in value.items()}
        return self._untag(value, depth)

    def _untag(self, tag: Mapping[str, object], depth: int) -> object:
        kind = tag.get(TAG)
        keys = _KEYS.get(kind) if isinstance(kind, str) else None
        optional = _OPTIONAL_KEYS.get(str(kind), frozenset())
        if keys is None or not keys <= tag.keys() or not tag.keys() <= keys | optional:
            raise JsonTagError(f"context has a malformed {TAG!r} tag: {dict(tag)!r:.200}")
        raw = tag["value"]
        if kind == "dict":
            if not isinstance(raw, dict):
                raise JsonTagError(f"a {TAG!r} dict tag holds a {type(raw).__name__}")
            return {key: self.decode(item, depth + 1) for key, item in raw.items()}
        if kind == "model":
            return self._model(tag.get("model"), raw)
        if not isinstance(raw, str):
            raise JsonTagError(f"a {kind} tag holds a {type(raw).__name__}, not text")
        parse: Callable[[str], object] = _PARSERS[str(kind)]
        try:
            parsed = parse(raw)
            if kind == "datetime":
                parsed = _datetime_of(parsed, tag)
        except (ValueError, ArithmeticError, zoneinfo.ZoneInfoNotFoundError) as exc:
            raise JsonTagError(f"a {kind} tag's value {raw!r:.100} does not parse: {exc}") from None
        return parsed

    def _model(self, name: object, raw: object) -> object:
        cls = self._models.get(name) if isinstance(name, str) else None
        if cls is None:
            raise JsonTagError(f"context names model {name!r:.200}, which this codec does not list")
        validate = getattr(cls, "model_validate")  # noqa: B009 - checked in __init__
        try:
            return validate(raw)
        except Exception as exc:  # noqa: BLE001 - a model's validation may raise anything
            raise JsonTagError(f"model {name} does not validate the stored value: "
                               f"{type(exc).__name__}: {exc}") from None


def _datetime_of(value: object, tag: Mapping[str, object]) -> datetime.datetime:
    """The datetime a tag holds: its fold, and its zone when it names one."""
    fold = tag.get("fold", 0)
    if not isinstance(value, datetime.datetime) or fold not in (0, 1) or isinstance(fold, bool):
        raise ValueError("a datetime tag needs an ISO datetime and a fold of 0 or 1")
    if "zone" not in tag:
        return value.replace(fold=int(fold))
    zone = tag["zone"]
    if not isinstance(zone, str) or value.tzinfo is None:
        raise ValueError("a zoned datetime needs an ISO datetime with an offset and a zone key")
    # The wall time, the zone and the fold are the value (also in a repeated or a skipped
    # hour); the stored offset must be what they give.
    local = value.replace(tzinfo=zoneinfo.ZoneInfo(zone), fold=int(fold))
    if local.utcoffset() != value.utcoffset():
        raise ValueError(f"the stored offset does not match zone {zone}")
    return local


_KEYS: Final[dict[str, frozenset[str]]] = {
    kind: frozenset({TAG, "value"}) for kind in ("uuid", "date", "decimal", "dict", "datetime")
} | {"model": frozenset({TAG, "value", "model"})}
_OPTIONAL_KEYS: Final[dict[str, frozenset[str]]] = {"datetime": frozenset({"zone", "fold"})}


_PARSERS: Final[dict[str, Callable[[str], object]]] = {
    "uuid": uuid.UUID,
    "datetime": datetime.datetime.fromisoformat,
    "date": datetime.date.fromisoformat,
    "decimal": decimal.Decimal,
}
