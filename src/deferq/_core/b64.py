"""PURE: canonical base64, the encoding of a task's context in every record (spec/format.md F-6).

Theory of operation: canonical means whole quanta of the standard alphabet,
``=`` only as the last one or two characters, and zero padding bits, so each
context has exactly one encoding and a record's bytes are a function of its
fields. ``decode_base64`` is the definition (decode strictly, re-encode, compare);
``canonical_base64`` and ``canonical_base64_decode`` are cheaper routes to the
same verdict for the replay and dead-task fast paths, held to it by contracts
and property tests.

This module imports nothing that does I/O; CrossHair checks its contracts.
"""

from __future__ import annotations

import binascii
from binascii import a2b_base64
from typing import Final

_B64_ALPHABET: Final = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_B64_BEFORE_ONE_PAD: Final = frozenset(b"AEIMQUYcgkosw048")  # sextets whose low 2 bits are 0
_B64_BEFORE_TWO_PADS: Final = frozenset(b"AQgw")  # sextets whose low 4 bits are 0


def decode_base64(raw: bytes) -> bytes | None:
    """The bytes whose canonical base64 is ``raw``, or None (F-6): the definition."""
    try:
        data = binascii.a2b_base64(raw, strict_mode=True)
    except binascii.Error:
        return None
    # strict_mode still accepts some non-canonical padding bits; F-6 requires canonical form.
    return data if binascii.b2a_base64(data, newline=False) == raw else None


def canonical_base64(raw: bytes) -> bool:
    """Whether ``raw`` is the canonical padded base64 of some bytes (F-6), without decoding it.

    The replay fast path's check: the same verdict as ``decode_base64``, which
    decodes and re-encodes.

    post: __return__ == (decode_base64(raw) is not None)
    """
    if len(raw) % 4:
        return False
    rest = raw.translate(None, _B64_ALPHABET)
    if not rest:
        return True
    if rest == b"=":
        return raw[-1] == 0x3D and raw[-2] in _B64_BEFORE_ONE_PAD
    if rest == b"==":
        return raw[-2:] == b"==" and raw[-3] in _B64_BEFORE_TWO_PADS
    return False


def canonical_base64_decode(raw: bytes) -> bytes | None:
    """``decode_base64(raw)`` without re-encoding: strict decoding refuses every
    non-canonical form but a length that is not a multiple of 4 and non-zero padding
    bits, which are checked here (F-6).

    post: __return__ == decode_base64(raw)
    """
    if len(raw) % 4:
        return None
    try:
        data = a2b_base64(raw, strict_mode=True)
    except binascii.Error:
        return None
    if raw[-1:] == b"=":
        if raw[-2:] == b"==":
            if raw[-3] not in _B64_BEFORE_TWO_PADS:
                return None
        elif raw[-2] not in _B64_BEFORE_ONE_PAD:
            return None
    return data
