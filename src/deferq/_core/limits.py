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

# --- Integers the format stores: what a reader with signed 64-bit integers holds.
INT_FIELD_MAX: Final = 2**63 - 1

# --- A task's metadata in its context record: entries, and UTF-8 bytes of keys and values.
META_ITEMS_MAX: Final = 16
META_BYTES_MAX: Final = 4096

# --- Identifiers (F-5).
TASK_ID_BYTES_MAX: Final = 256
TASK_CLASS_BYTES_MAX: Final = 1024

# --- Record sizes (F-8, F-17).
CONTEXT_BYTES_MAX: Final = 4 * 1024 * 1024
EXCEPTION_CLASS_CHARS_MAX: Final = 1024
EXCEPTION_MESSAGE_CHARS_MAX: Final = 64 * 1024
BACKTRACE_FRAMES_MAX: Final = 20
BACKTRACE_FRAME_CHARS_MAX: Final = 4096
# The exception chain in the backtrace (F-18): chained exceptions kept, frames kept of each.
CHAIN_EXCEPTIONS_MAX: Final = 4
CHAIN_FRAMES_MAX: Final = 2
# A line longer than this is damage (R-@E): no record deferq writes can reach it.
LINE_BYTES_MAX: Final = 8 * 1024 * 1024

# --- I/O chunk sizes (bounded memory, D-14).
READ_CHUNK_BYTES: Final = 64 * 1024
TAIL_SCAN_CHUNK_BYTES: Final = 8192
WRITE_BATCH_BYTES: Final = 256 * 1024
# --- Long reads of the dead-task store in lock steps (S-27, S-29, L-6): the most one step
# reads while holding the locks, and how many compactions one read survives.
DEAD_READ_STEP_BYTES: Final = 1024 * 1024
DEAD_READ_RESTARTS_MAX: Final = 8
# --- The dead-task index cache (S-65..S-74): the least offset a page is read through it at,
# and the most bytes appended since it was written that a reader indexes for itself.
DEAD_CACHE_OFFSET_MIN: Final = 1000
DEAD_CACHE_TAIL_BYTES_MAX: Final = 1024 * 1024
# S-85: the most bytes appended since the cache was written that a read merges into it.
DEAD_CACHE_MERGE_BYTES_MAX: Final = 8 * 1024 * 1024
# S-90: a deep page with no cache whose records lie in the newest 1/4 of the file is scanned.
DEAD_CACHE_SCAN_SHARE: Final = 4
# W-35: orphan WAL files a worker holds open at once while it adopts them (plus its own copy).
ADOPT_FILES_MAX: Final = 64

# --- WAL rotation (W-9).
WAL_SIZE_LIMIT_BYTES: Final = 2_000_000
WAL_SIZE_INCREASE_RATIO: Final = 1.5
# --- WAL space reserved ahead of its records (W-25): an fsync that does not grow the file
# has no size to commit, measured ~30% cheaper than one after an append on ext4.
WAL_RESERVE_BYTES: Final = 1024 * 1024

# --- The adoption sweep (W-30..W-34, Q-70..Q-72): a running worker adopts at most this
# many orphaned WAL files per sweep (siblings share the rest), every interval seconds.
SWEEP_FILES_MAX: Final = 4
SWEEP_FILES_LIMIT: Final = 1024
DEFAULT_SWEEP_INTERVAL_S: Final = 2.0
SWEEP_INTERVAL_MIN_S: Final = 0.01
SWEEP_INTERVAL_MAX_S: Final = 3600.0

# --- Task-id seed (W-28): the seed advances by one per elapsed second of the monotonic clock.
SEED_TICK_S: Final = 1.0
# The largest seed a caller's id may carry (C-24): generated seeds start at most one above
# it and then need 2**62 seconds to pass INT_FIELD_MAX, the largest a reader parses (W-28).
SEED_CALLER_MAX: Final = 2**62

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
assert READ_CHUNK_BYTES <= DEAD_READ_STEP_BYTES
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
# The chain's lines (a header and frames per chained exception) leave the exception's own
# frames most of the backtrace (F-18).
assert CHAIN_EXCEPTIONS_MAX * (1 + CHAIN_FRAMES_MAX) < BACKTRACE_FRAMES_MAX
assert SEED_CALLER_MAX < INT_FIELD_MAX
assert WAL_SIZE_INCREASE_RATIO > 1.0
assert 0 < FSYNC_FREQUENCY_MIN_S < DEFAULT_FSYNC_FREQUENCY_S <= FSYNC_FREQUENCY_MAX_S
assert PREFIX_BYTES_MAX == 226
assert LOCK_ATTEMPTS_MAX >= 2
assert 1 <= SWEEP_FILES_MAX <= SWEEP_FILES_LIMIT
assert 0 < SWEEP_INTERVAL_MIN_S <= DEFAULT_SWEEP_INTERVAL_S <= SWEEP_INTERVAL_MAX_S

# --- Dead-task store group commit (S-14).
# Rounds of queued adds one group-commit leader serves before it hands the locks on.
GROUP_COMMIT_ROUNDS_MAX: Final = 8
assert GROUP_COMMIT_ROUNDS_MAX >= 1

# --- Execution control of the queue (spec/queue.md).
# Executions that run at once by default, and the most a queue accepts.
DEFAULT_MAX_CONCURRENCY: Final = 100
MAX_CONCURRENCY_MAX: Final = 1_000_000
assert 1 <= DEFAULT_MAX_CONCURRENCY <= MAX_CONCURRENCY_MAX
# Threads of the pool a plain perform runs in by default, and the most a queue accepts.
DEFAULT_SYNC_THREADS: Final = 8
SYNC_THREADS_MAX: Final = 1024
assert 1 <= DEFAULT_SYNC_THREADS <= SYNC_THREADS_MAX
# The longest per-task timeout, seconds: a day.
TASK_TIMEOUT_MAX_S: Final = 86_400.0
# The most lifecycle hooks one queue takes: each is called per event on the loop.
HOOKS_MAX: Final = 64
