"""PURE: the line frame of every record, ``crc ":" body "\\n"`` (spec/format.md F-2..F-4).

Theory of operation: ``crc`` is eight lowercase hex digits of CRC-32/ISO-HDLC
(``zlib.crc32``) over the body bytes (F-3). A body never contains a newline, so
a line is self-delimiting. Checking a frame never raises on bad bytes: it
returns a ``BadLine`` whose ``fault`` names the row of the recovery table
(spec/recovery.md). The record codecs (walcodec.py, deadcodec.py) build on this.

This module imports nothing that does I/O; CrossHair checks its contracts.
"""

from __future__ import annotations

import enum
import zlib
from dataclasses import dataclass
from typing import Final

CRC_HEX_BYTES: Final = 8
HEADER_BYTES: Final = CRC_HEX_BYTES + 1  # the CRC and the ':' after it
_HEX_DIGITS: Final = frozenset(b"0123456789abcdef")


class LineFault(enum.Enum):
    """Why a line is not a valid record: the rows of spec/recovery.md."""

    CRC_MISMATCH = "R-@C"
    BAD_HEADER = "R-@B"
    BAD_BODY = "R-@D"
    OVERLONG = "R-@E"
    TORN_TAIL = "R-@F"
    BAD_DEAD_PAYLOAD = "R-@G"
    NUL_HOLE = "R-@K"


@dataclass(frozen=True, slots=True)
class BadLine:
    """A line that is not a valid record, and why."""

    fault: LineFault


def crc_hex(body: bytes) -> bytes:
    """The eight lowercase hex digits of CRC-32/ISO-HDLC over ``body`` (F-3).

    post: len(__return__) == CRC_HEX_BYTES
    """
    return b"%08x" % zlib.crc32(body)


def frame(body: bytes) -> bytes:
    """Turn a body into a complete line (F-2).

    pre: bytes([10]) not in body
    post: __return__.endswith(bytes([10])) and __return__.count(bytes([10])) == 1
    """
    return crc_hex(body) + b":" + body + b"\n"


def unframe(line: bytes) -> bytes | BadLine:
    """Check a line's frame (without its newline) and return its body (F-4, R-@B, R-@C).

    post: isinstance(__return__, BadLine) or frame(__return__) == line + bytes([10])
    """
    if len(line) < HEADER_BYTES or line[CRC_HEX_BYTES] != 0x3A:
        return BadLine(LineFault.BAD_HEADER)
    head = line[:CRC_HEX_BYTES]
    body = line[HEADER_BYTES:]
    if crc_hex(body) != head:
        # Slow path only for damage: a matching CRC already proves the header is hex.
        if not all(byte in _HEX_DIGITS for byte in head):
            return BadLine(LineFault.BAD_HEADER)
        return BadLine(LineFault.CRC_MISMATCH)
    if b"\n" in body:
        return BadLine(LineFault.BAD_BODY)
    return body
