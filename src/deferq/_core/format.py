"""PURE: the record codec's former names, kept for importers that other work is changing.

Why this module still exists: the codec of spec/format.md now lives in modules
with one job each (frame.py, taskid.py, b64.py, walcodec.py, deadcodec.py,
names.py), and every importer in the tree uses those, except
_engine/wal.py, _engine/deadstore.py and crashtest/catalogue/, which other
work is changing at the same time. This module re-exports the former public
names unchanged so that work keeps importing; once those files import the new
modules, delete it. Add nothing here: new code imports the module that owns
the name.

This module imports nothing that does I/O.
"""

from __future__ import annotations

from deferq._core.b64 import canonical_base64
from deferq._core.deadcodec import (
    DEAD_FIELDS,
    OP_DEAD,
    DeadLine,
    dead_problem,
    decode_dead_line,
    decode_dead_payload,
    decode_dead_record,
    encode_dead,
)
from deferq._core.frame import (
    CRC_HEX_BYTES,
    HEADER_BYTES,
    BadLine,
    LineFault,
    crc_hex,
    frame,
    unframe,
)
from deferq._core.names import (
    dead_data_name,
    dead_lock_name,
    dead_tmp_name,
    is_wal_file_name,
    to_base36,
    wal_file_name,
    wal_glob_prefix,
)
from deferq._core.taskid import SEED_DIGITS_MAX, check_task_id, id_seed, raw_id_ok, task_id_problem
from deferq._core.walcodec import (
    NO_PUBLISH_AT,
    OP_ADD,
    OP_REM,
    WalAdd,
    WalRem,
    decode_wal_line,
    encode_add,
    encode_rem,
)

__all__ = [
    "CRC_HEX_BYTES", "DEAD_FIELDS", "HEADER_BYTES", "NO_PUBLISH_AT", "OP_ADD", "OP_DEAD", "OP_REM",
    "SEED_DIGITS_MAX", "BadLine", "DeadLine", "LineFault", "WalAdd", "WalRem", "canonical_base64",
    "check_task_id", "crc_hex", "dead_data_name", "dead_lock_name", "dead_problem",
    "dead_tmp_name", "decode_dead_line", "decode_dead_payload", "decode_dead_record",
    "decode_wal_line", "encode_add", "encode_dead", "encode_rem", "frame", "id_seed",
    "is_wal_file_name", "raw_id_ok", "task_id_problem", "to_base36", "unframe", "wal_file_name",
    "wal_glob_prefix",
]
