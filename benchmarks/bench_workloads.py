"""The rows of the storage benchmark: every workload of issue #6, each against its raw and
its SQLite baseline, with its target. ``GROUPS`` maps the ``--only`` names to runners."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import bench_reads as rd
from bench_cold import COLD, COLD_ROW_KEYS
import bench_sqlite as sq
import bench_writes as wr
from bench_common import (
    FAKE_PID,
    PAGE,
    PREFIX,
    PRODUCERS,
    SEED0,
    Check,
    Config,
    MemRow,
    Results,
    Row,
    Sample,
    Scratch,
    Target,
    copy_durably,
    fmt_bytes,
    log,
    peak_bytes,
    repeated,
    run_trio,
)
from deferq._core.names import dead_data_name, wal_file_name
from deferq.backends import Disk

CRASH_SAFE = Target("<= 2x raw and >= 3x faster than SQLite NORMAL",
                    (Check("raw", 2.0), Check("sqlite", 1 / 3)))
POWER_SAFE = Target(">= SQLite FULL rate", (Check("sqlite", 1.0),))
GROUP_COMMIT = Target(f">= 3x SQLite FULL rate ({PRODUCERS} producers)", (Check("sqlite", 1 / 3),))
DEAD_ADD = Target(">= 0.9x raw flock rate", (Check("raw", 1 / 0.9),))
REPLAY = Target("<= 1.5x raw parse", (Check("raw", 1.5),))
DEFAULT_FSYNC_S = 0.5


def bench_enqueue(cfg: Config, scratch: Scratch, res: Results) -> None:
    """enqueue + complete, crash-safe (default cadence, raw without fsync, SQLite NORMAL) and
    power-safe (fsync_frequency=0, raw fsync per write, SQLite FULL), Disk and Queue level."""
    n, nq, npow = cfg.enq_storage, cfg.enq_queue, cfg.enq_power
    rows: list[tuple[Row, Sample, Sample, Sample]] = [
        (Row("enq_crash_disk", f"enqueue+complete crash-safe, Disk ({n:,})", "task", CRASH_SAFE),
         wr.disk_enqueue(scratch, n, DEFAULT_FSYNC_S), wr.raw_enqueue(scratch, n, False, 1),
         wr.sqlite_enqueue(scratch, n, "NORMAL", 1)),
        (Row("enq_crash_queue", f"enqueue+complete crash-safe, Queue ({nq:,})", "task",
             CRASH_SAFE),
         wr.queue_enqueue(scratch, nq, DEFAULT_FSYNC_S, 1), wr.raw_enqueue(scratch, nq, False, 1),
         wr.sqlite_enqueue(scratch, nq, "NORMAL", 1)),
        (Row("enq_power_disk", f"enqueue+complete power-safe, Disk ({npow:,})", "task",
             POWER_SAFE),
         wr.disk_enqueue(scratch, npow, 0), wr.raw_enqueue(scratch, npow, True, 1),
         wr.sqlite_enqueue(scratch, npow, "FULL", 1)),
        (Row("enq_power_queue", f"enqueue+complete power-safe, Queue ({npow:,})", "task",
             POWER_SAFE),
         wr.queue_enqueue(scratch, npow, 0, 1), wr.raw_enqueue(scratch, npow, True, 1),
         wr.sqlite_enqueue(scratch, npow, "FULL", 1)),
        (Row("enq_power_queue_16", f"enqueue+complete power-safe, Queue, {PRODUCERS} producers "
             f"({npow:,})", "task", GROUP_COMMIT),
         wr.queue_enqueue(scratch, npow, 0, PRODUCERS),
         wr.raw_enqueue(scratch, npow, True, PRODUCERS),
         wr.sqlite_enqueue(scratch, npow, "FULL", PRODUCERS)),
    ]
    for row, deferq, raw, sqlite in rows:
        res.rows.append(run_trio(row, cfg.reps, deferq, raw, sqlite))


def bench_dead_add(cfg: Config, scratch: Scratch, res: Results) -> None:
    """Durable dead-task adds: one process, then two processes on one store."""
    n = cfg.dead_adds
    work = wr.DeadWork(n)
    res.info["dead_add_line_bytes"] = len(work.lines[0])
    row = Row("dead_add_1p", f"dead add, durable, 1 process ({n:,})", "op", DEAD_ADD)
    res.rows.append(run_trio(row, cfg.reps, *(wr.dead_add(scratch, side, work)
                                              for side in ("deferq", "raw", "sqlite"))))
    row = Row("dead_add_2p", f"dead add, durable, 2 processes ({n:,} in all)", "op", DEAD_ADD)
    res.rows.append(run_trio(row, cfg.reps, *(wr.dead_add_procs(scratch, side, n, 2, res.info)
                                              for side in ("deferq", "raw", "sqlite"))))


# ----------------------------------------------------------------------------- dead-task store


def size_text(n: int) -> str:
    return f"{n // 1000}k" if n >= 1000 else str(n)


def _cold_find(path: str, task_id: str) -> Sample:
    def sample() -> float:
        with Disk(path=path, fsync_frequency=0) as disk:
            start = time.perf_counter()
            disk.find_dead_task(task_id)
            return time.perf_counter() - start
    return sample


def _cold_sqlite_find(path: str, task_id: str) -> Sample:
    def sample() -> float:
        conn = sq.connect(path, "NORMAL")
        try:
            start = time.perf_counter()
            sq.find_dead(conn, task_id)
            return time.perf_counter() - start
        finally:
            conn.close()
    return sample


def _bind_raw_find(data_path: str, task_id: str) -> Callable[[], object]:
    return lambda: rd.raw_find(data_path, task_id)


def _timed(fn: Callable[[], object]) -> Sample:
    def sample() -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    return sample


def bench_dead_reads(cfg: Config, scratch: Scratch, res: Results, remove: bool,
                     reads: bool) -> None:
    n = cfg.store_entries
    master, sqlite_dir = scratch.new("dead-store"), scratch.new("dead-store-sqlite")
    log(f"building a {n:,}-entry dead-task store (file and SQLite) ...")
    start = time.perf_counter()
    ids = rd.build_dead_store(master, sqlite_dir, n)
    data_path = os.path.join(master, dead_data_name(PREFIX))
    res.info["dead_store_build_s"] = time.perf_counter() - start
    res.info["dead_store_bytes"] = os.path.getsize(data_path)
    log(f"  built in {res.info['dead_store_build_s']:.2f} s, {fmt_bytes(os.path.getsize(data_path))}")
    if reads:
        _dead_list_find(cfg, res, master, sqlite_dir, data_path, ids)
    if remove:
        _dead_remove(cfg, scratch, res, master, sqlite_dir, ids)
    scratch.remove(master)
    scratch.remove(sqlite_dir)


def _dead_list_find(cfg: Config, res: Results, master: str, sqlite_dir: str, data_path: str,
                    ids: list[str]) -> None:
    n, off = len(ids), cfg.list_offset
    size = size_text(n)
    recent, oldest, missing = ids[-10], ids[0], f"{SEED0}-{FAKE_PID}-no-such-task"
    per_id = Target("<= 10x SQLite (warm)", (Check("sqlite", 10.0),))
    cold = Target("<= 1.2x raw scan (cold)", (Check("raw", 1.2),))
    recent_t = Target("<= 1 ms", (Check("abs", 1e-3),))
    disk = Disk(path=master, fsync_frequency=0)
    conn = sq.connect(sqlite_dir, "NORMAL")
    try:
        # Every side must give the same answer before anything is timed.
        for limit, offset in ((PAGE, 0), (PAGE, off)):
            want = rd.expected_page(ids, limit, offset)
            got = ([t.id for t in disk.list_dead_tasks(limit=limit, offset=offset)],
                   [i for i, _ in rd.raw_list(data_path, limit, offset)],
                   [i for i, _ in sq.list_dead(conn, limit, offset)])
            if any(g != want for g in got):
                raise AssertionError(f"list limit={limit} offset={offset} disagrees")
        for task_id in (recent, oldest, missing):
            found = disk.find_dead_task(task_id)
            raw, lite = rd.raw_find(data_path, task_id), sq.find_dead(conn, task_id)
            answers = (None if found is None else found.id, None if raw is None else raw[0],
                       None if lite is None else lite[0])
            want_id = None if task_id == missing else task_id
            if any(a != want_id for a in answers):
                raise AssertionError(f"find {task_id} disagrees: {answers}")

        warm: list[tuple[str, str, Target, Callable[[], object], Callable[[], object],
                         Callable[[], object]]] = [
            ("dead_list_newest", f"list newest {PAGE} of {size}",
             Target("<= 1.5x SQLite", (Check("sqlite", 1.5),)),
             lambda: disk.list_dead_tasks(limit=PAGE), lambda: rd.raw_list(data_path, PAGE, 0),
             lambda: sq.list_dead(conn, PAGE, 0)),
            ("dead_list_offset", f"list {PAGE} at offset {off:,} of {size}",
             Target("<= SQLite", (Check("sqlite", 1.0),)),
             lambda: disk.list_dead_tasks(limit=PAGE, offset=off),
             lambda: rd.raw_list(data_path, PAGE, off), lambda: sq.list_dead(conn, PAGE, off)),
            ("dead_find_recent", f"find recent id (10th newest) of {size}, warm", recent_t,
             lambda: disk.find_dead_task(recent), lambda: rd.raw_find(data_path, recent),
             lambda: sq.find_dead(conn, recent)),
            ("dead_find_oldest", f"find oldest id of {size}, warm", per_id,
             lambda: disk.find_dead_task(oldest), lambda: rd.raw_find(data_path, oldest),
             lambda: sq.find_dead(conn, oldest)),
            ("dead_find_missing", f"find missing id of {size}, warm", per_id,
             lambda: disk.find_dead_task(missing), lambda: rd.raw_find(data_path, missing),
             lambda: sq.find_dead(conn, missing)),
        ]
        for key, label, target, op_d, op_r, op_s in warm:
            res.rows.append(run_trio(Row(key, label, "call", target), cfg.reps,
                                     repeated(op_d, cfg.sample_target_s),
                                     repeated(op_r, cfg.sample_target_s),
                                     repeated(op_s, cfg.sample_target_s)))
        for key, label, task_id in (("recent", "find recent id", recent),
                                    ("oldest", "find oldest id", oldest),
                                    ("missing", "find missing id", missing)):
            res.rows.append(run_trio(
                Row(f"dead_find_{key}_cold", f"{label} of {size}, cold (new Disk)", "call",
                    recent_t if key == "recent" else cold),
                cfg.heavy_reps, _cold_find(master, task_id),
                _timed(_bind_raw_find(data_path, task_id)),
                _cold_sqlite_find(sqlite_dir, task_id)))

        log("measuring peak memory of list/find (tracemalloc) ...")
        for key, label, _, op_d, op_r, op_s in warm:
            res.memory.append(MemRow(key, label, {"deferq": peak_bytes(op_d),
                                                  "raw": peak_bytes(op_r),
                                                  "sqlite": peak_bytes(op_s)}))
    finally:
        conn.close()
        disk.close()


def _dead_remove(cfg: Config, scratch: Scratch, res: Results, master: str, sqlite_dir: str,
                 ids: list[str]) -> None:
    n = len(ids)
    many = min(cfg.remove_many, n)
    step = max(1, n // many)
    cases = [("dead_remove_1", "remove 1 id", [ids[n // 2]]),
             ("dead_remove_many", f"remove {many:,} ids", ids[step // 2::step][:many])]
    target = Target("<= 1.2x raw rewrite", (Check("raw", 1.2),))
    master_data = os.path.join(master, dead_data_name(PREFIX))
    master_db = os.path.join(sqlite_dir, sq.SQLITE_FILE)

    def fresh_copy(tag: str, src: str) -> str:
        path = scratch.fresh_dir(tag)
        copy_durably(src, os.path.join(path, os.path.basename(src)))
        return path

    def check(side: str, found: int, wanted: int) -> None:
        if found != wanted:
            raise AssertionError(f"remove ({side}) found {found} of {wanted} ids")

    for key, label, victims in cases:
        def deferq(victims: list[str] = victims) -> float:
            path = fresh_copy("remove-deferq", master_data)
            try:
                with Disk(path=path, fsync_frequency=0) as disk:
                    start = time.perf_counter()
                    found = disk.remove_dead_tasks(victims)
                    elapsed = time.perf_counter() - start
            finally:
                scratch.remove(path)
            check("deferq", found, len(victims))
            return elapsed

        def raw(victims: list[str] = victims) -> float:
            wanted = {v.encode("utf-8") for v in victims}
            path = fresh_copy("remove-raw", master_data)
            try:
                start = time.perf_counter()
                found = rd.raw_remove(path, wanted)
                elapsed = time.perf_counter() - start
            finally:
                scratch.remove(path)
            check("raw", found, len(victims))
            return elapsed

        def sqlite(victims: list[str] = victims) -> float:
            path = fresh_copy("remove-sqlite", master_db)
            conn = sq.connect(path, "FULL")
            try:
                start = time.perf_counter()
                found = sq.remove_dead(conn, victims)
                elapsed = time.perf_counter() - start
            finally:
                conn.close()
                scratch.remove(path)
            check("sqlite", found, len(victims))
            return elapsed

        res.rows.append(run_trio(Row(key, f"{label} of {size_text(n)}", "call", target),
                                 cfg.heavy_reps, deferq, raw, sqlite))
    one = next(r for r in res.rows if r.key == "dead_remove_1")
    batch = next(r for r in res.rows if r.key == "dead_remove_many")
    res.info["remove_many_over_remove_1_deferq"] = batch.median("deferq") / one.median("deferq")


# ----------------------------------------------------------------------------- replay


def bench_replay(cfg: Config, scratch: Scratch, res: Results) -> None:
    directory, sqlite_dir = scratch.fresh_dir("replay"), scratch.fresh_dir("replay-sqlite")
    wal = os.path.join(directory, wal_file_name(PREFIX, "20261201", FAKE_PID, 0xBE7C4))
    live = cfg.replay_live
    log(f"building an orphan WAL of {cfg.replay_records:,} records, {live:,} live "
        "(file and SQLite) ...")
    start = time.perf_counter()
    rd.build_orphan_wal(wal, sqlite_dir, cfg.replay_adds, live)
    size = os.path.getsize(wal)
    res.info.update(replay_build_s=time.perf_counter() - start, replay_wal_bytes=size,
                    replay_records=cfg.replay_records, replay_live=live)
    log(f"  built in {res.info['replay_build_s']:.2f} s, {fmt_bytes(size)}")

    # Each deferq sample opens a Disk on a fresh durable copy of the orphan WAL, alone in its
    # directory: Disk claims it and replays it (and may rewrite it: that is part of the cost).
    def deferq() -> float:
        return rd.timed_disk_open(scratch, [wal], live, "replay")

    def raw() -> float:
        start = time.perf_counter()
        count = len(rd.raw_replay(wal))
        elapsed = time.perf_counter() - start
        if count != live:
            raise AssertionError(f"raw replay: {count} live of {live}")
        return elapsed

    def sqlite() -> float:
        start = time.perf_counter()
        count = len(sq.load_tasks(sqlite_dir))
        elapsed = time.perf_counter() - start
        if count != live:
            raise AssertionError(f"sqlite replay: {count} live of {live}")
        return elapsed

    label = f"replay {cfg.replay_records:,} records, {live:,} live"
    res.rows.append(run_trio(Row("replay", label, "call", REPLAY), cfg.heavy_reps,
                             deferq, raw, sqlite))
    log("measuring peak memory of replay (tracemalloc) ...")
    path = scratch.fresh_dir("replay-deferq")
    copy_durably(wal, os.path.join(path, os.path.basename(wal)))
    peaks = {"deferq": peak_bytes(lambda: Disk(path=path, fsync_frequency=0).close()),
             "raw": peak_bytes(lambda: rd.raw_replay(wal)),
             "sqlite": peak_bytes(lambda: sq.load_tasks(sqlite_dir))}
    res.memory.append(MemRow("replay", label, peaks))
    res.info["replay_deferq_peak_bytes_per_live_task"] = peaks["deferq"] / live
    scratch.remove(path)

    # The same traffic written through Disk: rotation (W-9) keeps the WAL near its live tasks,
    # so a restart replays those, not the history that a log without rotation (the raw side,
    # the same parse of the orphan above) must read.
    log(f"writing the same {cfg.replay_records:,} records through Disk (rotating WAL) ...")
    rotated = scratch.fresh_dir("replay-rotated")
    start = time.perf_counter()
    files = rd.build_rotated_wal(rotated, cfg.replay_adds, live)
    res.info.update(replay_rotated_build_s=time.perf_counter() - start,
                    replay_rotated_wal_bytes=sum(os.path.getsize(os.path.join(rotated, name))
                                                 for name in files),
                    replay_rotated_wal_files=len(files))
    log(f"  {len(files)} WAL file(s), {fmt_bytes(int(res.info['replay_rotated_wal_bytes']))}")

    def deferq_rotated() -> float:
        return rd.timed_disk_open(scratch, [os.path.join(rotated, name) for name in files], live,
                                  "rotated replay")

    label = (f"replay after {cfg.replay_records:,} records through Disk (rotating WAL), "
             f"{live:,} live")
    res.rows.append(run_trio(Row("replay_rotated", label, "call", REPLAY), cfg.heavy_reps,
                             deferq_rotated, raw, sqlite))
    scratch.remove(rotated)
    scratch.remove(directory)
    scratch.remove(sqlite_dir)


GROUPS: dict[str, Callable[[Config, Scratch, Results], None]] = {
    "enqueue": bench_enqueue,
    "dead_add": bench_dead_add,
    "dead_read": lambda cfg, scratch, res: bench_dead_reads(cfg, scratch, res, False, True),
    "dead_remove": lambda cfg, scratch, res: bench_dead_reads(cfg, scratch, res, True, False),
    "replay": bench_replay,
    **COLD,
}

ROW_KEYS: dict[str, tuple[str, ...]] = {
    "enqueue": ("enq_crash_disk", "enq_crash_queue", "enq_power_disk", "enq_power_queue",
                "enq_power_queue_16"),
    "dead_add": ("dead_add_1p", "dead_add_2p"),
    "dead_read": ("dead_list_newest", "dead_list_offset", "dead_find_recent", "dead_find_oldest",
                  "dead_find_missing", "dead_find_recent_cold", "dead_find_oldest_cold",
                  "dead_find_missing_cold"),
    "dead_remove": ("dead_remove_1", "dead_remove_many"),
    "replay": ("replay", "replay_rotated"),
    "cold": COLD_ROW_KEYS,
}
