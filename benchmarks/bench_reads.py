"""Read-side workloads of the storage benchmark: the dead-task store (list, find, remove)
and the replay of a tasks WAL at start, each with its raw and SQLite peers.

The raw baselines are the physical floor of a plain log file: list and find read the data
file backwards in 64 KiB chunks (newest lines first, bounded memory), counting newlines to
skip an offset without splitting; remove rewrites the file (read, filter, write a temporary
file, fsync, rename, fsync the directory); replay reads the whole WAL and builds a dict.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections import deque
from collections.abc import Iterator

import bench_sqlite as sq
from bench_common import (
    FAKE_PID,
    PAGE,
    PREFIX,
    SEED0,
    Failure,
    Scratch,
    copy_durably,
    dead_json,
    dead_task,
    make_exception,
    write_all,
)
from deferq._core.deadcodec import encode_dead
from deferq._core.names import dead_data_name, is_wal_file_name
from deferq._core.walcodec import encode_add, encode_rem
from deferq.backends import Disk

CHUNK = 1 << 16
DEAD_CONTEXT_SEED = 3
WAL_CONTEXT_BYTES = 120
NEEDLE_PREFIX = b"dead_task:"
ID_OFFSET = 9 + len(NEEDLE_PREFIX)  # after "{crc 8 hex}:dead_task:"


# ----------------------------------------------------------------------------- building the store


def build_dead_store(directory: str, sqlite_dir: str, entries: int) -> list[str]:
    """Write a dead-task data file of ``entries`` records directly with the codec, and the
    same records as rows of a SQLite table; return the ids, oldest first."""
    failure = Failure.of(make_exception())
    context = random.Random(DEAD_CONTEXT_SEED).randbytes(200)
    ids = [f"{SEED0 + i // 50}-{FAKE_PID}-{i + 1}" for i in range(entries)]
    os.makedirs(directory, exist_ok=True)
    os.makedirs(sqlite_dir, exist_ok=True)
    conn = sq.create(sqlite_dir, sq.DEAD_SCHEMA, "NORMAL")
    conn.execute("BEGIN")
    with open(os.path.join(directory, dead_data_name(PREFIX)), "wb") as out:
        for start in range(0, entries, 10_000):
            lines = [encode_dead(dead_task(
                tid, failure, context, failed_at=SEED0 + 86_400,
                message=f"card declined for order {start + k}: insufficient funds"))
                for k, tid in enumerate(ids[start:start + 10_000])]
            out.write(b"".join(lines))
            conn.executemany("INSERT INTO dead (id, body) VALUES (?, ?)",
                             [(tid, dead_json(line).decode("utf-8"))
                              for tid, line in zip(ids[start:start + 10_000], lines, strict=True)])
        out.flush()
        os.fsync(out.fileno())
    conn.execute("COMMIT")
    sq.checkpoint_close(conn)
    return ids


# ----------------------------------------------------------------------------- raw list / find


def regions_newest_first(data_path: str) -> Iterator[bytes]:
    """Runs of complete lines (each ending in a newline), from the end of the file back to its
    start; within a run, lines are oldest first. Holds about one chunk at a time."""
    with open(data_path, "rb") as f:
        pos = f.seek(0, os.SEEK_END)
        carry = b""  # the start of the file's next run: a line cut by the previous chunk
        while pos > 0:
            start = max(0, pos - CHUNK)
            f.seek(start)
            buf = f.read(pos - start) + carry
            pos = start
            if start == 0:
                yield buf
                return
            cut = buf.find(b"\n") + 1  # bytes before ``cut`` may belong to an earlier line
            carry, region = buf[:cut], buf[cut:]
            if cut == len(buf):
                carry, region = buf, b""
            if region:
                yield region


def raw_list(data_path: str, limit: int, offset: int) -> list[tuple[str, object]]:
    """Baseline list: newest first, skip ``offset`` lines by counting newlines, decode
    ``limit`` JSON bodies (no CRC check, no deduplication)."""
    out: list[tuple[str, object]] = []
    skip = offset
    for region in regions_newest_first(data_path):
        count = region.count(b"\n")
        if count <= skip:
            skip -= count
            continue
        lines = region[:-1].split(b"\n")
        lines.reverse()
        for line in lines[skip:]:
            _, _, tid, body = line.split(b":", 3)
            decoded: object = json.loads(body)
            out.append((tid.decode("utf-8"), decoded))
            if len(out) == limit:
                return out
        skip = 0
    return out


def raw_find(data_path: str, task_id: str) -> tuple[str, object] | None:
    """Baseline find: search runs of lines newest first for ``:dead_task:{id}:`` at a line's
    start, decode the match."""
    needle = NEEDLE_PREFIX + task_id.encode("utf-8") + b":"
    for region in regions_newest_first(data_path):
        end = len(region)
        while True:
            at = region.rfind(needle, 0, end)
            if at < 0:
                break
            if at == 9 or (at > 9 and region[at - 10] == 0x0A):
                stop = region.index(b"\n", at)
                decoded: object = json.loads(region[at + len(needle):stop])
                return task_id, decoded
            end = at + len(needle) - 1
    return None


def raw_remove(directory: str, ids: set[bytes]) -> int:
    """Baseline remove: read all, drop the ids, write tmp, fsync, rename, fsync the directory."""
    data_path = os.path.join(directory, dead_data_name(PREFIX))
    tmp_path = data_path + ".tmp"
    with open(data_path, "rb") as f:
        lines = f.read().split(b"\n")
    keep = [line for line in lines if line and line[ID_OFFSET:line.find(b":", ID_OFFSET)] not in ids]
    fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        if keep:
            keep.append(b"")
            write_all(fd, b"\n".join(keep))
            keep.pop()
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp_path, data_path)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return sum(1 for line in lines if line) - len(keep)


# ----------------------------------------------------------------------------- replay


def _wal_tid(i: int) -> str:
    return f"{SEED0 + i // 1000}-{FAKE_PID}-{i + 1}"


def build_orphan_wal(path: str, sqlite_dir: str, adds: int, live: int) -> None:
    """Write ``adds`` add records and ``adds - live`` removes (oldest first, FIFO traffic) to
    a WAL file, and the same inserts and deletes to a SQLite table (in one transaction)."""
    context = random.Random(4).randbytes(WAL_CONTEXT_BYTES)
    conn = sq.create(sqlite_dir, sq.TASKS_SCHEMA, "NORMAL")
    conn.execute("BEGIN")
    with open(path, "wb") as out:
        for first in range(0, adds, 20_000):
            batch: list[bytes] = []
            rows: list[tuple[str, bytes]] = []
            gone: list[tuple[str]] = []
            for i in range(first, min(adds, first + 20_000)):
                batch.append(encode_add(_wal_tid(i), SEED0 + 3_600 if i % 10 == 0 else None,
                                        context))
                rows.append((_wal_tid(i), context))
                if i >= live:
                    batch.append(encode_rem(_wal_tid(i - live)))
                    gone.append((_wal_tid(i - live),))
            out.write(b"".join(batch))
            conn.executemany("INSERT INTO tasks (id, payload) VALUES (?, ?)", rows)
            conn.executemany("DELETE FROM tasks WHERE id = ?", gone)
        out.flush()
        os.fsync(out.fileno())
    conn.execute("COMMIT")
    sq.checkpoint_close(conn)


def build_rotated_wal(directory: str, adds: int, live: int) -> list[str]:
    """The traffic of ``build_orphan_wal`` written through ``Disk`` (default rotation, W-9) in
    ``directory``; return the WAL files left when it closed."""
    context = random.Random(4).randbytes(WAL_CONTEXT_BYTES)
    pending: deque[str] = deque()
    disk = Disk(path=directory, fsync_frequency=0.5)
    try:
        for i in range(adds):
            pending.append(disk.add_task(context, SEED0 + 3_600 if i % 10 == 0 else None))
            if i >= live:
                disk.remove_task(pending.popleft())
    finally:
        disk.close()
    return sorted(name for name in os.listdir(directory) if is_wal_file_name(PREFIX, name))


def timed_disk_open(scratch: Scratch, sources: list[str], live: int, what: str) -> float:
    """Seconds for ``Disk(path=...)`` on a fresh directory holding durable copies of the WAL
    files ``sources`` (it claims and replays them, and may rewrite them: that is part of the
    cost); checks that ``live`` tasks are pending after it."""
    path = scratch.fresh_dir("replay-deferq")
    for source in sources:
        copy_durably(source, os.path.join(path, os.path.basename(source)))
    try:
        start = time.perf_counter()
        disk = Disk(path=path, fsync_frequency=0)
        elapsed = time.perf_counter() - start
        try:
            count = len(disk.pending_tasks())
        finally:
            disk.close()
    finally:
        scratch.remove(path)
    if count != live:
        raise AssertionError(f"{what}: {count} live of {live}")
    return elapsed


def raw_replay(path: str) -> dict[bytes, bytes]:
    """Baseline replay: read the file, split lines, keep a dict id -> add line, apply removes."""
    with open(path, "rb") as f:
        data = f.read()
    live: dict[bytes, bytes] = {}
    for line in data.split(b"\n"):
        if not line:
            continue
        if line[9:12] == b"add":
            live[line[13:line.index(b":", 13)]] = line
        else:
            live.pop(line[13:], None)
    return live


def expected_page(ids: list[str], limit: int, offset: int) -> list[str]:
    """The ids a newest-first page of ``ids`` (oldest first) must hold."""
    newest = ids[::-1]
    return newest[offset:offset + limit]


__all__ = ["PAGE", "build_dead_store", "build_orphan_wal", "build_rotated_wal", "expected_page", "raw_find",
           "raw_list", "raw_remove", "raw_replay", "regions_newest_first", "timed_disk_open"]
