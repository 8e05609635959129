"""The task context record: what the queue gives the backend as a task's opaque bytes (spec/queue.md).

Rules (Q-5, Q-6; pickle: Q-18, Q-34 at the end of this module):
- A context is one line of UTF-8 JSON, an object with exactly the keys
  ``v`` (record version, 1), ``task`` (the registered task name), ``args``
  (a list), ``kwargs`` (an object) and ``attempts`` (failed executions so far,
  an int >= 0), then, only for a task deferred with a unique key, ``key`` (a
  non-empty str, Q-53), and ``enqueued_at`` (the epoch second the task was first
  enqueued, Q-65) and ``meta`` (the task's metadata, Q-66; ctxfields.py has the
  optional fields). Key order and separators are
  fixed, so equal records encode to equal bytes.
- Encoding is strict: only ``None``, ``bool``, ``int``, ``float`` (finite),
  ``str``, ``list`` and ``dict`` with ``str`` keys are accepted, because those
  are exactly the values that come back from JSON unchanged. A tuple, a set, a
  datetime, NaN or any other object raises ``SerializationError`` at enqueue,
  before anything is stored: what ``perform`` receives is what was enqueued.
- Decoding never imports or executes anything. It raises ``ContextError``
  with a reason a person can read; the queue dead-letters the task with that
  reason (Q-9).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import pickle
import sys
from collections.abc import Callable, Iterable
from typing import Final, NamedTuple

# Re-exported: the queue's errors module defines them so that jsontypes can raise them too.
from deferq._runtime.errors import ContextError as ContextError
from deferq._runtime.errors import SerializationError as SerializationError
from deferq._runtime.ctxfields import (
    OPTIONAL_KEYS,
    pickled_extras,
    put_extras,
    read_extras,
    unpickled_extras,
)
from deferq._runtime.jsontypes import JsonTypes

CONTEXT_VERSION: Final = 1
# Version 2: the same record, with values tagged by ``JsonTypes``; written only when
# a tag is needed, so every plain record stays version 1 for every reader.
TAGGED_CONTEXT_VERSION: Final = 2
_MAX_DEPTH: Final = 100
_KEYS: Final = ("v", "task", "args", "kwargs", "attempts")

# A JSON value as this module accepts it. ``object`` keeps mypy --strict honest
# without explicit Any: the strict walk below is what checks the shape.
JsonValue = object


class Context(NamedTuple):
    """A decoded task context (immutable; a named tuple: built once per enqueue, a frozen
    dataclass's ``__init__`` cost 5k instructions more, 6 % of a queue enqueue+complete)."""

    task: str
    args: tuple[JsonValue, ...]
    kwargs: dict[str, JsonValue]
    attempts: int = 0
    key: str | None = None  # the unique key, kept by every retry
    enqueued_at: int | None = None  # when first enqueued, kept by every retry
    meta: dict[str, str] | None = None  # the task's metadata, kept by every retry

    def with_attempts(self, attempts: int) -> Context:
        """The same record with another attempts count."""
        return Context(self.task, self.args, self.kwargs, attempts, self.key, self.enqueued_at,
                       self.meta)


def _check_value(value: object, where: str, depth: int = 0) -> None:
    if depth > _MAX_DEPTH:
        raise SerializationError(f"{where} is nested more than {_MAX_DEPTH} levels deep")
    if value is None or isinstance(value, (bool, int, str)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise SerializationError(f"{where} is {value!r}, which JSON cannot represent")
        return
    if isinstance(value, list):
        for index, item in enumerate(value):
            _check_value(item, f"{where}[{index}]", depth + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise SerializationError(
                    f"{where} has a key of type {type(key).__name__}; JSON object keys must be str")
            _check_value(item, f"{where}[{key!r}]", depth + 1)
        return
    hint = "; pass a list" if isinstance(value, (tuple, set, frozenset)) else ""
    raise SerializationError(
        f"{where} of type {type(value).__name__} cannot be stored as JSON unchanged{hint}")


def _dumps(record: dict[str, object]) -> str:
    """``json.dumps(record, ensure_ascii=False, allow_nan=False, separators=(",", ":"))``."""
    return json.dumps(record, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _make_fast_dumps() -> Callable[[dict[str, object]], str] | None:
    """The C encoder ``json.dumps`` builds per call, built once (it is most of an enqueue's cost).

    Same output as ``_dumps`` (a property test checks it) for every value ``_check_value``
    accepts; ``json.dumps`` would also check for reference cycles, which cannot reach
    here: a cycle is nested deeper than ``_MAX_DEPTH`` and refused first.
    """
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # an interpreter without the _json accelerator
        return None
    default = json.JSONEncoder().default  # raises TypeError: never reached for checked values
    # c_make_encoder is json's private C hook: its arguments are json.encoder's business, not
    # an API. They are unchanged from 3.11 through 3.13 (CI runs the property test against
    # json.dumps on both); should a later Python change them or the output, fall back to
    # json.dumps instead of failing at import or writing other bytes.
    try:
        encoder = make(None, default, json.encoder.encode_basestring, None, ":", ",",
                       False, False, False)
        probe: dict[str, object] = {"v": 1, "task": "t\u00e9\n", "args": [1, -2.5, None, True],
                                    "kwargs": {"k": [{}, "x"]}, "attempts": 0}
        if "".join(encoder(probe, 0)) != _dumps(probe):
            return None
    except (TypeError, ValueError):
        return None

    def fast_dumps(record: dict[str, object]) -> str:
        return "".join(encoder(record, 0))
    return fast_dumps


_FAST_DUMPS: Final = _make_fast_dumps() or _dumps
# Argument types that need no walk: the common case of an enqueue, checked without a call.
_SCALARS: Final = frozenset({type(None), bool, int, str})


# The scalar fast path of encode_context: json's own string encoder (C), and per task name
# the record's text up to its args (a bounded cache: names come from registered tasks).
_encode_str: Final = json.encoder.encode_basestring
_RECORD_HEADS: dict[str, str] = {}
_RECORD_HEADS_MAX: Final = 1024


def _scalars_json(values: Iterable[object]) -> list[str] | None:
    """The JSON text of each value if all are exact ``int``, ``str``, ``bool`` or None."""
    out = []
    for value in values:
        kind = type(value)
        if kind is int:
            out.append(repr(value))  # what json's encoder writes for an exact int
        elif kind is str and isinstance(value, str):  # (isinstance: for the type checker)
            out.append(_encode_str(value))
        elif value is None:
            out.append("null")
        elif kind is bool:
            out.append("true" if value else "false")
        else:
            return None
    return out


def _encode_scalars(context: Context) -> str | None:
    """The record's JSON text when every argument is a scalar ``_scalars_json`` takes
    (and every keyword a plain ``str``), else None: the same text ``_FAST_DUMPS`` writes,
    built without a dict, a list and the encoder's per-item calls."""
    # One unpack instead of an attribute read per field (every enqueue runs this).
    task, args, kwargs, attempts, key, enqueued_at, meta = context
    if key is not None or meta is not None or type(attempts) is not int:
        return None
    values = _scalars_json(args)
    if values is None:
        return None
    if enqueued_at is None:
        tail = "}"
    elif type(enqueued_at) is int:
        tail = f',"enqueued_at":{enqueued_at}}}'
    else:
        return None
    if kwargs:
        if not all(type(name) is str for name in kwargs):
            return None
        texts = _scalars_json(kwargs.values())
        if texts is None:
            return None
        items = ",".join([f"{_encode_str(name)}:{text}" for name, text in zip(kwargs, texts)])
    else:
        items = ""
    head = _RECORD_HEADS.get(task)
    if head is None:
        head = f'{{"v":{CONTEXT_VERSION},"task":{_encode_str(task)},"args":['
        if len(_RECORD_HEADS) < _RECORD_HEADS_MAX:
            _RECORD_HEADS[task] = head
    return f'{head}{",".join(values)}],"kwargs":{{{items}}},"attempts":{attempts}{tail}'


def encode_context(context: Context) -> bytes:
    """The context's single-line JSON bytes; raises SerializationError for bad arguments."""
    text = _encode_scalars(context)
    if text is not None:
        try:
            return text.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate in a str argument
            raise SerializationError(
                f"an argument is not valid Unicode text: {exc.reason}") from None
    for index, arg in enumerate(context.args):
        if type(arg) not in _SCALARS:
            _check_value(arg, f"argument {index}")
    for name, arg in context.kwargs.items():
        if type(arg) not in _SCALARS:
            _check_value(arg, f"keyword argument {name!r}")
    record: dict[str, object] = {
        "v": CONTEXT_VERSION, "task": context.task, "args": list(context.args),
        "kwargs": context.kwargs, "attempts": context.attempts}
    put_extras(record, context.key, context.enqueued_at, context.meta)
    text = _FAST_DUMPS(record)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate in a str argument
        raise SerializationError(f"an argument is not valid Unicode text: {exc.reason}") from None


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON value")


def reset_attempts(data: bytes) -> bytes:
    """Implements Q-33: the context with ``attempts`` 0, changing nothing else, or unchanged.

    Only a JSON context record (version 1, or 2 with tags, Q-30) in the canonical form this
    module writes is rewritten, and only at the record level: its arguments are never decoded
    into objects (a tag stays a plain dict here), so nothing a stored context says is built or
    run. A pickled context, or anything else, is returned byte for byte.
    """
    data = bytes(data)
    if data.startswith(PICKLE_MAGIC):
        return data
    try:
        record = json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return data
    if (not isinstance(record, dict) or record.get("v") not in (CONTEXT_VERSION,
                                                                   TAGGED_CONTEXT_VERSION)
            or type(record.get("attempts")) is not int):
        return data
    try:
        if _dumps(record).encode("utf-8") != data:
            return data  # not the form deferq writes: rewriting it would change more
        record["attempts"] = 0
        return _dumps(record).encode("utf-8")
    except (UnicodeEncodeError, ValueError):
        return data


def peek_task_name(data: bytes) -> str | None:
    """The ``task`` field of a context if it can be read at all, else None (for reports)."""
    try:
        record = json.loads(bytes(data).decode("utf-8"), parse_constant=_no_constant)
    except (ValueError, RecursionError):
        return None
    if isinstance(record, dict):
        name = record.get("task")
        if isinstance(name, str) and name:
            return name
    return None


def decode_context(data: bytes, json_types: JsonTypes | None = None) -> Context:
    """Parse a stored context; raise ContextError naming what is wrong.

    With ``json_types`` a version 2 record's tagged values are decoded too (Q-30).
    """
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ContextError(f"context is not UTF-8 text: {exc.reason}") from None
    try:
        record = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise ContextError("context JSON is nested too deeply") from None
    except ValueError as exc:
        raise ContextError(f"context is not valid JSON: {exc}") from None
    if not isinstance(record, dict):
        raise ContextError(f"context JSON is a {type(record).__name__}, not an object")
    tagged = record.get("v") == TAGGED_CONTEXT_VERSION and json_types is not None
    if record.get("v") == TAGGED_CONTEXT_VERSION and json_types is None:
        raise ContextError("context record version 2 holds tagged values (UUID, datetime, "
                           "Decimal, models): decode it with ContextCodec(json_types=...)")
    if record.get("v") != CONTEXT_VERSION and not tagged:
        raise ContextError(f"context record version {record.get('v')!r} is not supported "
                           f"(expected {CONTEXT_VERSION})")
    extra = sorted(set(record) - set(_KEYS) - set(OPTIONAL_KEYS))
    if extra:
        raise ContextError(f"context has unknown field(s) {', '.join(map(repr, extra))}")
    extras = read_extras(record)
    task, args, kwargs, attempts = (record.get(k) for k in _KEYS[1:])
    if not isinstance(task, str) or not task:
        raise ContextError("context has no task name")
    if not isinstance(args, list):
        raise ContextError("context field 'args' is not a list")
    if not isinstance(kwargs, dict):
        raise ContextError("context field 'kwargs' is not an object")
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 0:
        raise ContextError(f"context field 'attempts' is {attempts!r}, not an int >= 0")
    if tagged:
        assert json_types is not None
        decoded = json_types.decode([args, kwargs])
        assert isinstance(decoded, list)
        args, kwargs = decoded
        assert isinstance(args, list) and isinstance(kwargs, dict)
    # Interned: a queue holds one context per delayed task and they share a few names
    # (60 bytes a task of the 100k-delayed row, Q-36).
    return Context(sys.intern(task), tuple(args), dict(kwargs), attempts, *extras)


# ----------------------------------------------------------------------------- codecs

PICKLE_MAGIC: Final = b"deferq-pickle-1:"
PICKLE_KEY_BYTES_MIN: Final = 16
_TAG_HEX_BYTES: Final = 64


class ContextCodec:
    """Turns contexts into the backend's opaque bytes and back (Q-18, Q-34).

    The default writes JSON (``encode_context``) and reads only JSON: a pickled
    context is refused, because unpickling runs code. With ``pickle_key`` set,
    ``use_pickle=True`` writes pickles sealed with HMAC-SHA256 under that key,
    and both JSON and sealed pickles are read; a pickle whose tag does not
    verify is refused before ``pickle.loads`` sees a byte. Envelope:
    ``deferq-pickle-1:`` + 64 lowercase hex digits of the tag + ``:`` + the
    pickle, the tag covering the magic and the pickle.
    """

    def __init__(self, *, pickle_key: bytes | None = None, use_pickle: bool = False,
                 json_types: JsonTypes | None = None) -> None:
        if json_types is not None and not isinstance(json_types, JsonTypes):
            raise ValueError(f"json_types must be a JsonTypes, not {type(json_types).__name__}")
        if json_types is not None and use_pickle:
            raise ValueError("json_types applies to JSON contexts; use_pickle=True already "
                             "stores any picklable value")
        self.json_types = json_types
        if pickle_key is not None:
            if not isinstance(pickle_key, bytes) or len(pickle_key) < PICKLE_KEY_BYTES_MIN:
                raise ValueError(f"pickle_key must be bytes of at least {PICKLE_KEY_BYTES_MIN} "
                                 "bytes (a secret from configuration)")
        if use_pickle and pickle_key is None:
            raise ValueError("use_pickle=True needs a pickle_key: pickled contexts are always "
                             "authenticated")
        self._key = pickle_key
        self.use_pickle = use_pickle
        # ``encode`` of this codec's options, chosen once: for plain JSON the encoder itself,
        # without ``encode``'s Python frame and tests (the queue calls it on every enqueue).
        self.encoder: Callable[[Context], bytes] = (
            encode_context if not use_pickle and json_types is None else self.encode)

    def _tag(self, body: bytes) -> bytes:
        assert self._key is not None
        return hmac.new(self._key, PICKLE_MAGIC + body, hashlib.sha256).hexdigest().encode()

    def encode(self, context: Context) -> bytes:
        """Bytes for the backend; raises SerializationError for arguments that cannot be stored."""
        if not self.use_pickle:
            if self.json_types is not None:
                return self._encode_tagged(context)
            return encode_context(context)
        record: tuple[object, ...] = (CONTEXT_VERSION, context.task, tuple(context.args),
                                      dict(context.kwargs), context.attempts)
        # Implements for a pickled context.
        record += pickled_extras(context.key, context.enqueued_at, context.meta)
        try:
            body = pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # noqa: BLE001 - pickling can fail with any exception
            raise SerializationError(f"arguments cannot be pickled: {exc}") from None
        return PICKLE_MAGIC + self._tag(body) + b":" + body

    def _encode_tagged(self, context: Context) -> bytes:
        """Implements Q-30: version 1 when no value needs a tag, else version 2 with tags."""
        assert self.json_types is not None
        args, args_tagged = self.json_types.encode(list(context.args), "arguments")
        kwargs, kwargs_tagged = self.json_types.encode(dict(context.kwargs), "keyword arguments")
        if not (args_tagged or kwargs_tagged):
            return encode_context(context)
        record: dict[str, object] = {"v": TAGGED_CONTEXT_VERSION, "task": context.task,
                                     "args": args, "kwargs": kwargs,
                                     "attempts": context.attempts}
        put_extras(record, context.key, context.enqueued_at, context.meta)
        try:
            return _dumps(record).encode("utf-8")
        except UnicodeEncodeError as exc:
            raise SerializationError(f"an argument is not valid Unicode text: {exc.reason}"
                                     ) from None

    def decode(self, data: bytes) -> Context:
        """A context from the backend's bytes; raises ContextError naming what is wrong."""
        data = bytes(data)
        if not data.startswith(PICKLE_MAGIC):
            return decode_context(data, self.json_types)
        if self._key is None:
            raise ContextError("context is pickled but no pickle key is configured; refusing to "
                               "unpickle it")
        rest = data[len(PICKLE_MAGIC):]
        tag, sep, body = rest[:_TAG_HEX_BYTES], rest[_TAG_HEX_BYTES:_TAG_HEX_BYTES + 1], \
            rest[_TAG_HEX_BYTES + 1:]
        if sep != b":" or not hmac.compare_digest(tag, self._tag(body)):
            raise ContextError("pickled context failed authentication (HMAC tag does not verify)")
        try:
            record = pickle.loads(body)
        except Exception as exc:  # noqa: BLE001 - an authenticated pickle may still not load
            raise ContextError(f"pickled context does not load: {type(exc).__name__}: {exc}"
                               ) from None
        extras = unpickled_extras(record[5:]) if isinstance(record, tuple) else None
        if not (isinstance(record, tuple) and len(record) >= 5 and extras is not None
                and record[0] == CONTEXT_VERSION
                and isinstance(record[1], str) and record[1] and isinstance(record[2], tuple)
                and isinstance(record[3], dict) and type(record[4]) is int and record[4] >= 0):
            raise ContextError("pickled context is not a deferq task record")
        return Context(record[1], record[2], dict(record[3]), record[4], *extras)

    def peek_task_name(self, data: bytes) -> str | None:
        """The task name if it can be read without running untrusted code, else None."""
        if bytes(data).startswith(PICKLE_MAGIC):
            try:
                return self.decode(data).task
            except ContextError:
                return None
        return peek_task_name(data)


JSON_CODEC: Final = ContextCodec()
