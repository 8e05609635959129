"""The SQLite peer of the storage benchmark: stdlib ``sqlite3`` in WAL mode.

Every connection is in autocommit mode (``isolation_level=None``), so each INSERT or DELETE
outside an explicit BEGIN is its own transaction and commit. ``synchronous=NORMAL`` in WAL
mode is crash-safe (a commit survives a process crash, not a power cut); ``FULL`` fsyncs the
WAL at every commit and is power-safe. Those are the two levels the rows compare with.
"""

from __future__ import annotations

import json
import os
import sqlite3

SQLITE_FILE = "bench.db"
TASKS_SCHEMA = "CREATE TABLE tasks (id TEXT PRIMARY KEY, payload BLOB NOT NULL)"
# seq orders the store oldest to newest, like the lines of deferq's data file.
DEAD_SCHEMA = ("CREATE TABLE dead (seq INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, "
               "body TEXT NOT NULL)")
BUSY_TIMEOUT_MS = 60_000


def connect(directory: str, synchronous: str) -> sqlite3.Connection:
    """A WAL-mode, autocommit connection to ``directory/bench.db`` (created if missing)."""
    if synchronous not in ("NORMAL", "FULL"):
        raise ValueError(f"synchronous must be NORMAL or FULL, got {synchronous!r}")
    conn = sqlite3.connect(os.path.join(directory, SQLITE_FILE), isolation_level=None,
                           check_same_thread=False)
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()
    if mode is None or str(mode[0]).lower() != "wal":
        raise RuntimeError(f"SQLite refused WAL mode: {mode!r}")
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    return conn


def create(directory: str, schema: str, synchronous: str) -> sqlite3.Connection:
    conn = connect(directory, synchronous)
    conn.execute(schema)
    return conn


def checkpoint_close(conn: sqlite3.Connection) -> None:
    """Fold the WAL into the database file and close, leaving one self-contained file."""
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def insert_task(conn: sqlite3.Connection, task_id: str, payload: bytes) -> None:
    conn.execute("INSERT INTO tasks (id, payload) VALUES (?, ?)", (task_id, payload))


def delete_task(conn: sqlite3.Connection, task_id: str) -> None:
    conn.execute("DELETE FROM tasks WHERE id = ?", (task_id,))


def insert_dead(conn: sqlite3.Connection, task_id: str, body: str) -> None:
    conn.execute("INSERT INTO dead (id, body) VALUES (?, ?)", (task_id, body))


def list_dead(conn: sqlite3.Connection, limit: int, offset: int) -> list[tuple[str, object]]:
    """Newest first: (id, decoded JSON body) of one page."""
    rows = conn.execute("SELECT id, body FROM dead ORDER BY seq DESC LIMIT ? OFFSET ?",
                        (limit, offset)).fetchall()
    return [(str(r[0]), decode(r[1])) for r in rows]


def find_dead(conn: sqlite3.Connection, task_id: str) -> tuple[str, object] | None:
    row = conn.execute("SELECT id, body FROM dead WHERE id = ?", (task_id,)).fetchone()
    return None if row is None else (str(row[0]), decode(row[1]))


def remove_dead(conn: sqlite3.Connection, ids: list[str]) -> int:
    """Delete ``ids`` in one transaction; return how many rows went."""
    before = conn.total_changes
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.executemany("DELETE FROM dead WHERE id = ?", [(i,) for i in ids])
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return conn.total_changes - before


def load_tasks(directory: str) -> dict[str, bytes]:
    """Replay's peer: open the database and load every live task into a dict."""
    conn = connect(directory, "NORMAL")
    try:
        live: dict[str, bytes] = {}
        for row in conn.execute("SELECT id, payload FROM tasks"):
            live[str(row[0])] = bytes(row[1])
        return live
    finally:
        conn.close()


def decode(body: object) -> object:
    if not isinstance(body, str):
        raise TypeError(f"unexpected SQLite body type {type(body).__name__}")
    result: object = json.loads(body)
    return result
