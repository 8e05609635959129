"""Every limit and fixed number deferq uses, in one place.

Rules: each value is ``Final``, is stated in spec/ next to the ID that uses it,
and has a test that reaches it. The asserts at the bottom check the relations
between limits at import time, so a bad edit fails loudly and at once.
"""

from __future__ import annotations

from typing import Final

# --- On-disk format versions (F-15). Bump when a format changes; old files are left alone.
WAL_STORAGE_VERSION: Final = "0"
DEAD_STORAGE_VERSION: Final = "0"

# --- Identifiers (F-5).
TASK_ID_BYTES_MAX: Final = 256
TASK_CLASS_BYTES_MAX: Final = 1024

# --- Record sizes (F-8, F-12).
CONTEXT_BYTES_MAX: Final = 4 * 1024 * 1024
EXCEPTION_CLASS_CHARS_MAX: Final = 1024
EXCEPTION_MESSAGE_CHARS_MAX: Final = 64 * 1024
BACKTRACE_FRAMES_MAX: Final = 20
BACKTRACE_FRAME_CHARS_MAX: Final = 4096
# A line longer than this is damage (R-@E): no record deferq writes can reach it.
LINE_BYTES_MAX: Final = 8 * 1024 * 1024

# --- I/O chunk sizes (bounded memory, D-14).
READ_CHUNK_BYTES: Final = 64 * 1024
TAIL_SCAN_CHUNK_BYTES: Final = 8192
WRITE_BATCH_BYTES: Final = 256 * 1024
# W-35: orphan WAL files a worker holds open at once while it adopts them (plus its own copy).
ADOPT_FILES_MAX: Final = 64

# --- WAL rotation (W-9).
WAL_SIZE_LIMIT_BYTES: Final = 2_000_000
WAL_SIZE_INCREASE_RATIO: Final = 1.5
# --- WAL space reserved ahead of its records (W-25): an fsync that does not grow the file
# has no size to commit, measured ~30% cheaper than one after an append on ext4.
WAL_RESERVE_BYTES: Final = 1024 * 1024

# --- Task-id seed (W-5): the seed advances by one per elapsed second of the monotonic clock.
SEED_TICK_S: Final = 1.0

# --- Dead-task store lock (L-2, L-3).
LOCK_ATTEMPTS_MAX: Final = 20
LOCK_SLEEP_STEP_S: Final = 0.01
LOCK_SLEEP_MAX_S: Final = 0.1

# --- Configuration defaults (C-1).
DEFAULT_PATH: Final = "storage"
DEFAULT_PREFIX: Final = "deferred-"
DEFAULT_FSYNC_FREQUENCY_S: Final = 0.5
FSYNC_FREQUENCY_MAX_S: Final = 3600.0
# A timer firing more often than this only burns CPU: the fsync it drives takes longer (C-20).
FSYNC_FREQUENCY_MIN_S: Final = 0.001
# The longest file name deferq makes from a prefix is a WAL file's: the prefix, the version,
# and "-YYYYMMDD-{pid, 10 digits}-{random, 7 base-36 digits}" (F-1); ext4 and most
# filesystems allow 255 bytes in a name (C-19).
FILE_NAME_BYTES_MAX: Final = 255
PREFIX_BYTES_MAX: Final = FILE_NAME_BYTES_MAX - len(WAL_STORAGE_VERSION) - len("-YYYYMMDD-") - 10 - 1 - 7
# Backpressure waits at most this long: a larger timeout would overflow the wait loop.
BACKPRESSURE_TIMEOUT_MAX_S: Final = 3600.0

# --- File modes (F-26).
FILE_MODE: Final = 0o600
DIR_MODE: Final = 0o700
PARENT_DIR_MODE: Final = 0o755  # F-26: parents deferq creates, never writable by others


def lock_sleep_s(attempt: int) -> float:
    """Seconds to sleep after failed lock attempt number ``attempt`` (1-based).

    pre: 1 <= attempt <= LOCK_ATTEMPTS_MAX
    post: LOCK_SLEEP_STEP_S <= __return__ <= LOCK_SLEEP_MAX_S
    """
    return min(LOCK_SLEEP_STEP_S * attempt, LOCK_SLEEP_MAX_S)


assert TASK_ID_BYTES_MAX < TAIL_SCAN_CHUNK_BYTES
assert READ_CHUNK_BYTES <= LINE_BYTES_MAX
# The largest dead-task record (context in base64 plus escaped text fields, at most twelve
# output bytes per input character in ASCII-only JSON: a surrogate pair per astral
# character) must fit in a line.
assert (
    CONTEXT_BYTES_MAX * 4 // 3 + 4
    + 12 * (EXCEPTION_MESSAGE_CHARS_MAX + EXCEPTION_CLASS_CHARS_MAX + TASK_CLASS_BYTES_MAX)
    + 12 * BACKTRACE_FRAMES_MAX * BACKTRACE_FRAME_CHARS_MAX
    + 2 * TASK_ID_BYTES_MAX + 1024
    < LINE_BYTES_MAX
)
assert WAL_SIZE_INCREASE_RATIO > 1.0
assert 0 < FSYNC_FREQUENCY_MIN_S < DEFAULT_FSYNC_FREQUENCY_S <= FSYNC_FREQUENCY_MAX_S
assert PREFIX_BYTES_MAX == 226
assert LOCK_ATTEMPTS_MAX >= 2

# --- Dead-task store group commit (S-14).
# Rounds of queued adds one group-commit leader serves before it hands the locks on.
GROUP_COMMIT_ROUNDS_MAX: Final = 8
assert GROUP_COMMIT_ROUNDS_MAX >= 1
