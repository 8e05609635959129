"""PURE: many dead-task lines checked at once, in C-level passes (spec/dead-tasks.md S-31, S-40).

Theory of operation: the newest-first scan (``_engine/deadstream.py``) reads the data file
in blocks of up to 1 MiB; the complete lines inside a block form a *run*. A run usually
holds only clean dead-task records, and then checking each line on its own (a slice, a
``find``, a CRC, a compare, a set lookup: some fifteen bytecodes per line) costs more than
the CRC itself. ``check_run`` decides the whole run with a handful of calls that each loop
in C: one ``re`` split of the run at every line start that looks like a clean dead-task
header (eight lowercase hex digits, ``:dead_task:``, an ASCII id of 1 to
``TASK_ID_BYTES_MAX`` bytes with no ``:``, newline or NUL, then ``:``), one CRC-32 per line
over the line's body (``crc32(payload, crc32(prefix))`` is the CRC of ``prefix + payload``),
and one comparison of all the headers with all the CRCs written as hex.

It returns the ids and payloads only when every line of the run is such a record with a
matching CRC; then each line is exactly what ``decode_dead_line`` would accept (F-3, F-5,
F-10: the frame, the ``dead_task`` tag, a valid id, no newline in the body) with that id and
payload. Anything else (one damaged line, a NUL byte anywhere, a non-ASCII id) returns
None and the caller checks the run line by line, so damage is always counted by the exact
path (S-7) and the result never differs from it.

This module imports nothing that does I/O.
"""

from __future__ import annotations

import re
import sys
from array import array
from itertools import repeat
from operator import contains
from typing import Final
from zlib import crc32

from deferq._core.limits import TASK_ID_BYTES_MAX

# A newline, then a clean dead-task header. Each group is one field of the line:
# its CRC in hex, its body's prefix ``dead_task:{id}:``, and the id inside that prefix.
_LINE_START: Final = re.compile(
    rb"\n([0-9a-f]{8}):(dead_task:([^:\n\x00\x80-\xff]{1,%d}):)" % TASK_ID_BYTES_MAX)
_FIELDS: Final = 4  # re.split puts the three groups and the next piece after each match
_LITTLE_ENDIAN: Final = sys.byteorder == "little"


def check_run(block: bytes) -> tuple[list[bytes], list[bytes]] | None:
    """Implements S-40: the ids and payloads of the lines between the first and the last
    newline of ``block``, oldest first, when every one of them is a clean dead-task record
    with a valid CRC; else None (the caller then decides line by line).

    The split covers the whole block (splitting a slice or a memoryview of it costs a copy
    or a slower scan): its first piece is what precedes the first newline, and after the
    last line comes either that newline's piece (the block ends inside a line that looks
    like a record) or the last line's payload followed by the last newline.

    post: __return__ is None or len(__return__[0]) == len(__return__[1])
    """
    if block.find(0) >= 0:
        return None
    parts = _LINE_START.split(block)
    if parts[0].find(10) >= 0:  # 10: LF. The first newline does not start a clean record.
        return None
    payloads = parts[_FIELDS::_FIELDS]
    if not payloads:
        return None
    tail = payloads[-1]
    newline = tail.find(10)
    if newline >= 0:  # the last newline did not start a match: it ends the last line
        if tail.find(10, newline + 1) >= 0:
            return None
        payloads[-1] = tail[:newline]
        count = len(payloads)
    else:  # the last newline started a match: the piece after it is not a line
        count = len(payloads) - 1
        del payloads[count]
        if not count:
            return None
    # A line that does not match leaves its newline inside the piece before it.
    if any(map(contains, payloads, repeat(b"\n"))):
        return None
    prefixes = parts[2::_FIELDS]
    del prefixes[count:]
    crcs = array("I", map(crc32, payloads, map(crc32, prefixes)))
    if _LITTLE_ENDIAN:
        crcs.byteswap()  # big-endian, so that hex() writes each CRC as its header does
    heads = parts[1::_FIELDS]
    del heads[count:]
    if crcs.tobytes().hex().encode("ascii") != b"".join(heads):
        return None
    ids = parts[3::_FIELDS]
    del ids[count:]
    return ids, payloads


assert array("I").itemsize == 4, "a CRC-32 per array item"
