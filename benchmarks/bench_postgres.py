"""PostgreSQL backend benchmark (issue #19): deferq's ``Postgres`` against a plain psycopg floor.

Run: ``.venv/bin/python benchmarks/bench_postgres.py`` (``--smoke`` for tiny sizes,
``--backlog N`` for the backlog size, 1,000,000 by default). It starts its own throwaway
cluster (``tests/postgres/cluster.py``: initdb in a temporary directory, as ``nobody`` when run
as root, ``fsync=on``) and measures everything in that one run, so every ratio compares numbers
taken on the same machine at the same time.

The floor is the least SQL that does the same work: one autocommit ``INSERT`` per enqueue, a
claim ``UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED)``, one ``DELETE`` per
completion; its dead store is one table with a ``seq`` index and a primary key. deferq's side is
the backend alone (``add_task`` / ``claim_due`` / ``remove_task``), each producer and worker on
its own ``Postgres`` (its own connection), as separate hosts would be. A third side, the libpq
floor, runs the floor's SQL as named prepared statements through ``psycopg.pq``, the client path
deferq's hot statements take (P-77); the throughput rows print deferq's ratio to it for
information (what deferq does beyond the least client work), with no target: the targets are
against the plain psycopg floor, as issue #19 sets them.

Rows (each prints absolute figures, the ratio deferq / floor and a verdict against its target):
- ``throughput_p1`` / ``throughput_p16``: enqueue+complete of N tasks, 1 or 16 producer threads
  and 4 worker threads running at once; target deferq time <= 1.3x the floor's. The floor and
  deferq run ``--reps`` times each (7 by default), interleaved, the order alternating; the row
  prints their median times and the median of the per-repetition ratios (one repetition of 16
  producers on two shared cores varies by 10 % or more; the median of 3 moved from 1.25x to
  1.49x between runs of one tree, the median of 7 from 1.24x to 1.27x).
- ``claim_latency``: one claim of one due task from a table of 1,000 (p50, p99); target <= 1.3x.
- ``dead_newest`` / ``dead_find``: newest page of 20 and find by id over 100k dead tasks;
  target < 1 ms (absolute) and the ratio is printed.
- ``backlog``: with N pending tasks already in the table (bulk-loaded by SQL for both sides),
  enqueue 1,000 more and claim+complete 1,000 from the head; target <= 1.3x.

pgqueuer, when it installs, runs the throughput rows through its own ``Queries`` (enqueue,
dequeue, log_jobs) and procrastinate through its ``JobManager`` (defer_job_async, fetch_job,
finish_job); each throughput row gives deferq's verdict "ahead of it". A peer that does not
install or set up is printed with the reason and no verdict; never a verdict without a
measurement.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "src"))

import psycopg  # noqa: E402

from deferq.backends import Postgres  # noqa: E402
from deferq.backends._pgschema import quoted  # noqa: E402
from tests.postgres.cluster import Cluster, server_bin_dir  # noqa: E402

TARGET_RATIO = 1.3
TARGET_DEAD_MS = 1.0
WORKERS = 4
CLAIM_BATCH = 10
PAYLOAD = b'{"task":"bench.Noop","args":[],"kwargs":{},"retries":0}'

FLOOR_SCHEMA = (
    "CREATE TABLE floor (id bigserial PRIMARY KEY, payload bytea NOT NULL, "
    "owner text, publish_at bigint)",
    "CREATE INDEX floor_due ON floor ((coalesce(publish_at, 0)), id)",
    "CREATE TABLE floor_dead (id text PRIMARY KEY, seq bigserial, body bytea NOT NULL)",
    "CREATE UNIQUE INDEX floor_dead_newest ON floor_dead (seq)",
)
FLOOR_CLAIM = ("UPDATE floor SET owner = %s WHERE id IN (SELECT id FROM floor WHERE owner IS NULL "
               "AND coalesce(publish_at, 0) <= %s ORDER BY coalesce(publish_at, 0), id "
               "LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING id, payload")


class Floor:
    """The plain psycopg side: one autocommit connection, the least SQL per operation."""

    def __init__(self, dsn: str) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.owner = f"floor-{id(self)}"

    def add(self) -> None:
        self.conn.execute("INSERT INTO floor (payload) VALUES (%s)", (PAYLOAD,))

    def claim(self, limit: int) -> list[int]:
        rows = self.conn.execute(FLOOR_CLAIM, (self.owner, int(time.time() * 1000), limit))
        return [int(r[0]) for r in rows.fetchall()]

    def done(self, task_id: int) -> None:
        self.conn.execute("DELETE FROM floor WHERE id = %s", (task_id,))

    def close(self) -> None:
        self.conn.close()


class LibpqFloor:
    """The floor's SQL as named prepared statements through libpq (``psycopg.pq``), the client
    path deferq's hot statements take (P-77): the least client work, printed for information
    beside the plain psycopg floor that the targets are set against."""

    def __init__(self, dsn: str) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.pg = self.conn.pgconn
        self.owner = f"libpq-{id(self)}".encode()
        self.limits: set[int] = set()
        self._prepare(b"add", "INSERT INTO floor (payload) VALUES ($1)", [17])
        self._prepare(b"done", "DELETE FROM floor WHERE id = $1", [20])

    def _prepare(self, name: bytes, sql: str, types: list[int]) -> None:
        res = self.pg.prepare(name, sql.encode(), types)
        if res.status != psycopg.pq.ExecStatus.COMMAND_OK:
            raise RuntimeError(f"libpq floor: prepare {name!r}: {res.error_message!r}")

    def _run(self, name: bytes, values: list[bytes], formats: list[int]) -> psycopg.pq.abc.PGresult:
        res = self.pg.exec_prepared(name, values, formats, 1)
        if res.status not in (psycopg.pq.ExecStatus.COMMAND_OK, psycopg.pq.ExecStatus.TUPLES_OK):
            raise RuntimeError(f"libpq floor: {name!r}: {res.error_message!r}")
        return res

    def add(self) -> None:
        self._run(b"add", [PAYLOAD], [1])

    def claim(self, limit: int) -> list[int]:
        if limit not in self.limits:  # the limit written in, as deferq does (P-76)
            sql = FLOOR_CLAIM.replace("%s", "$1", 1).replace("%s", "$2", 1).replace(
                "%s", str(int(limit)), 1)
            self._prepare(b"claim%d" % limit, sql, [25, 20])
            self.limits.add(limit)
        res = self._run(b"claim%d" % limit, [self.owner, b"%d" % int(time.time() * 1000)],
                        [0, 0])
        return [int.from_bytes(res.get_value(i, 0) or b"", "big") for i in range(res.ntuples)]

    def done(self, task_id: int) -> None:
        self._run(b"done", [b"%d" % task_id], [0])

    def close(self) -> None:
        self.conn.close()


class Deferq:
    """deferq's side: a ``Postgres`` backend per producer or worker."""

    def __init__(self, dsn: str, schema: str, *, worker: bool) -> None:
        self.db = Postgres(dsn=dsn, schema=schema)
        if worker:
            self.db.start_claiming()

    def add(self) -> None:
        self.db.add_task(PAYLOAD)

    def claim(self, limit: int) -> list[str]:
        return [t.task_id for t in self.db.claim_due(limit)]

    def done(self, task_id: str) -> None:
        self.db.remove_task(task_id)

    def close(self) -> None:
        self.db.close()


class PgQueuer:
    """pgqueuer's own queries (``Queries``: enqueue, dequeue, log_jobs) over psycopg's async
    connection, one event loop per side; its worker loop is not used (no executor overhead)."""

    def __init__(self, dsn: str) -> None:
        import asyncio
        import datetime
        import uuid

        from pgqueuer.queries import EntrypointExecutionParameter, Queries

        self.loop = asyncio.new_event_loop()
        self.conn = self.loop.run_until_complete(
            psycopg.AsyncConnection.connect(dsn, autocommit=True))
        self.q = Queries.from_psycopg_connection(self.conn)
        self.entry = {"bench": EntrypointExecutionParameter(concurrency_limit=0)}
        self.manager = uuid.uuid4()
        self.timeout = datetime.timedelta(seconds=30)
        self.jobs: dict[object, object] = {}

    def install(self) -> None:
        self.loop.run_until_complete(self.q.install())

    def add(self) -> None:
        self.loop.run_until_complete(self.q.enqueue("bench", PAYLOAD))

    def claim(self, limit: int) -> list[object]:
        jobs = self.loop.run_until_complete(self.q.dequeue(
            limit, self.entry, self.manager, None, self.timeout))  # type: ignore[arg-type]
        self.jobs.update((job.id, job) for job in jobs)
        return [job.id for job in jobs]

    def done(self, task_id: object) -> None:
        job = self.jobs.pop(task_id)
        done = [(job, "successful", None)]
        self.loop.run_until_complete(self.q.log_jobs(done))  # type: ignore[arg-type]

    def close(self) -> None:
        self.loop.run_until_complete(self.conn.close())
        self.loop.close()


class Procrastinate:
    """procrastinate's own JobManager (defer_job_async, fetch_job, finish_job) over its psycopg
    connector (a pool of one connection), one event loop per side; no worker loop."""

    def __init__(self, dsn: str, *, worker: bool) -> None:
        import asyncio

        from procrastinate import PsycopgConnector, jobs, manager

        self.jobs_module = jobs
        self.loop = asyncio.new_event_loop()
        self.connector = PsycopgConnector(conninfo=dsn, kwargs={"autocommit": True},
                                          min_size=1, max_size=1)
        self.loop.run_until_complete(self.connector.open_async())
        self.manager = manager.JobManager(self.connector)
        self.worker_id = (self.loop.run_until_complete(self.manager.register_worker())
                          if worker else 0)
        self.held: dict[object, object] = {}

    def install(self) -> None:
        from procrastinate import schema

        self.loop.run_until_complete(
            schema.SchemaManager(self.connector).apply_schema_async())

    def add(self) -> None:
        job = self.jobs_module.Job(queue="bench", task_name="bench.noop", lock=None,
                                   queueing_lock=None, task_kwargs={"p": 1})
        self.loop.run_until_complete(self.manager.defer_job_async(job))

    def claim(self, limit: int) -> list[object]:
        got: list[object] = []
        for _ in range(limit):  # procrastinate fetches one job per query
            job = self.loop.run_until_complete(self.manager.fetch_job(["bench"], self.worker_id))
            if job is None:
                break
            self.held[job.id] = job
            got.append(job.id)
        return got

    def done(self, task_id: object) -> None:
        job = self.held.pop(task_id)
        self.loop.run_until_complete(self.manager.finish_job(
            job, self.jobs_module.Status.SUCCEEDED, delete_job=True))  # type: ignore[arg-type]

    def close(self) -> None:
        self.loop.run_until_complete(self.connector.close_async())
        self.loop.close()


Side = Callable[[bool], "Floor | LibpqFloor | Deferq | PgQueuer | Procrastinate"]


def throughput(make: Side, tasks: int, producers: int) -> float:
    """Seconds for ``producers`` threads to enqueue ``tasks`` and 4 workers to complete them."""
    prods = [make(False) for _ in range(producers)]
    works = [make(True) for _ in range(WORKERS)]
    done = [0]
    lock = threading.Lock()
    produced = threading.Event()
    errors: list[BaseException] = []

    def produce(side: Floor | LibpqFloor | Deferq | PgQueuer | Procrastinate, count: int) -> None:
        try:
            for _ in range(count):
                side.add()
        except BaseException as exc:  # reported below, never swallowed
            errors.append(exc)

    def work(side: Floor | LibpqFloor | Deferq | PgQueuer | Procrastinate) -> None:
        try:
            while True:
                with lock:
                    if done[0] >= tasks or errors:
                        return
                got = side.claim(CLAIM_BATCH)
                for tid in got:
                    side.done(tid)  # type: ignore[arg-type]
                with lock:
                    done[0] += len(got)
                if not got:
                    time.sleep(0.0005 if not produced.is_set() else 0)
        except BaseException as exc:
            errors.append(exc)

    shares = [tasks // producers + (1 if i < tasks % producers else 0) for i in range(producers)]
    threads = [threading.Thread(target=produce, args=(p, n)) for p, n in zip(prods, shares)]
    threads += [threading.Thread(target=work, args=(w,)) for w in works]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads[:producers]:
        t.join()
    produced.set()
    for t in threads[producers:]:
        t.join()
    elapsed = time.perf_counter() - start
    for side in prods + works:
        side.close()
    if errors:
        raise RuntimeError(f"throughput run failed: {errors[0]!r}")
    if done[0] != tasks:
        raise RuntimeError(f"throughput run completed {done[0]} of {tasks} tasks")
    return elapsed


def claim_latency(make: Side, samples: int) -> tuple[float, float]:
    """p50, p99 in ms of one claim of one task (then its completion, untimed)."""
    producer, worker = make(False), make(True)
    for _ in range(samples):
        producer.add()
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        got = worker.claim(1)
        times.append((time.perf_counter() - start) * 1000)
        if len(got) != 1:
            raise RuntimeError(f"claim latency: a claim returned {len(got)} tasks, not 1")
        worker.done(got[0])  # type: ignore[arg-type]
    producer.close()
    worker.close()
    times.sort()
    return statistics.median(times), times[min(len(times) - 1, int(len(times) * 0.99))]


def best_ms(fn: Callable[[], object], repeat: int) -> float:
    """Median of ``repeat`` timed calls, in ms."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def load_dead(dsn: str, schema: str, count: int) -> None:
    s = quoted(schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO {s}.dead (id, task_class, attempts, enqueued_at, failed_at, "
            f"exception_class, exception_message, backtrace, context) "
            f"SELECT 'dead-' || g, 'bench.Task' || (g %% 10), 3, 1700000000 + g, "
            f"1700000000 + g, 'RuntimeError', 'boom ' || g, ARRAY['line 1'], %s "
            f"FROM generate_series(1, %s) AS g", (PAYLOAD, count))
        conn.execute(
            "INSERT INTO floor_dead (id, body) SELECT 'dead-' || g, %s "
            "FROM generate_series(1, %s) AS g", (PAYLOAD, count))
        conn.execute("ANALYZE floor_dead")
        conn.execute(f"ANALYZE {s}.dead")


def dead_rows(dsn: str, schema: str, count: int, repeat: int) -> dict[str, dict[str, float]]:
    load_dead(dsn, schema, count)
    wanted = f"dead-{count // 2}"
    db = Postgres(dsn=dsn, schema=schema)
    floor = psycopg.connect(dsn, autocommit=True)
    try:
        if db.find_dead_task(wanted) is None or len(db.list_dead_tasks(limit=20)) != 20:
            raise RuntimeError("dead rows: the loaded dead tasks are not visible to deferq")
        newest = {
            "deferq": best_ms(lambda: db.list_dead_tasks(limit=20), repeat),
            "floor": best_ms(lambda: floor.execute(
                "SELECT id, body FROM floor_dead ORDER BY seq DESC LIMIT 20").fetchall(), repeat),
        }
        find = {
            "deferq": best_ms(lambda: db.find_dead_task(wanted), repeat),
            "floor": best_ms(lambda: floor.execute(
                "SELECT id, body FROM floor_dead WHERE id = %s", (wanted,)).fetchall(), repeat),
        }
    finally:
        db.close()
        floor.close()
    return {"dead_newest": newest, "dead_find": find}


def load_backlog(dsn: str, schema: str, count: int) -> None:
    s = quoted(schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"INSERT INTO {s}.pending (id, context) SELECT 'b-' || g, %s "
                     f"FROM generate_series(1, %s) AS g", (PAYLOAD, count))
        conn.execute("INSERT INTO floor (payload) SELECT %s FROM generate_series(1, %s)",
                     (PAYLOAD, count))
        conn.execute(f"ANALYZE {s}.pending")
        conn.execute("ANALYZE floor")


def backlog(make: Side, ops: int) -> float:
    """Seconds to enqueue ``ops`` tasks then claim+complete ``ops`` from the head."""
    producer, worker = make(False), make(True)
    start = time.perf_counter()
    for _ in range(ops):
        producer.add()
    left = ops
    while left > 0:
        got = worker.claim(min(CLAIM_BATCH, left))
        if not got:
            raise RuntimeError("backlog: a claim found nothing in a full table")
        for tid in got:
            worker.done(tid)  # type: ignore[arg-type]
        left -= len(got)
    elapsed = time.perf_counter() - start
    producer.close()
    worker.close()
    return elapsed


def reset(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {quoted(schema)}.pending")
        conn.execute("TRUNCATE floor")


def interleaved(reps: int, sides: dict[str, Callable[[], float]],
                times: dict[str, list[float]]) -> dict[str, float]:
    """Each side ``reps`` times, interleaved and the order alternating (each time appended to
    ``times``): the median time of each, and ``ratio``, the median of the per-repetition
    ratios deferq / floor."""
    times.update({name: [] for name in sides})
    names = list(sides)
    for rep in range(reps):
        for name in (names if rep % 2 == 0 else names[::-1]):
            times[name].append(sides[name]())
    row = {name: statistics.median(values) for name, values in times.items()}
    row["ratio"] = statistics.median(d / f for d, f in zip(times["deferq"], times["floor"],
                                                              strict=True))
    if "libpq" in times:
        row["ratio_libpq"] = statistics.median(
            d / f for d, f in zip(times["deferq"], times["libpq"], strict=True))
    return row


def verdict_ratio(ratio: float) -> str:
    return "PASS" if ratio <= TARGET_RATIO else "MISS"


def install_peer(name: str, make: Callable[[], PgQueuer | Procrastinate]) -> str | None:
    """None when ``name`` is installed here and its schema is created, else why not."""
    if importlib.util.find_spec(name) is None:
        return "not installed (pip install -e '.[bench]')"
    try:
        side = make()
        side.install()
        side.close()
    except Exception as exc:  # printed as the reason it has no row
        return f"could not set up: {exc!r}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (a test runs this)")
    parser.add_argument("--tasks", type=int, default=4000, help="tasks per throughput row")
    parser.add_argument("--dead", type=int, default=100_000, help="dead tasks to list from")
    parser.add_argument("--backlog", type=int, default=1_000_000, help="pending backlog size")
    parser.add_argument("--reps", type=int, default=7,
                        help="repetitions of each throughput row's floor and deferq sides")
    parser.add_argument("--json-out", type=Path, help="append the rows as one JSON line")
    args = parser.parse_args(argv)
    if args.smoke:
        args.tasks, args.dead, args.backlog, args.reps = 64, 500, 2000, 1
    if args.reps < 1:
        parser.error(f"--reps must be >= 1, got {args.reps}")
    for name in ("tasks", "dead", "backlog"):
        if getattr(args, name) < 32:
            parser.error(f"--{name} must be >= 32, got {getattr(args, name)}")
    bin_dir = server_bin_dir()
    if bin_dir is None:
        print("bench_postgres: no PostgreSQL server binaries (initdb) found; nothing measured",
              file=sys.stderr)
        return 2
    cluster = Cluster(bin_dir)
    rows: dict[str, dict[str, float]] = {}
    reps_of: dict[str, dict[str, list[float]]] = {}  # each repetition's time, by row and side
    try:
        cluster.init()
        cluster.start()
        dsn, schema = cluster.dsn, "bench"
        Postgres(dsn=dsn, schema=schema, create_schema=True).close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            for statement in FLOOR_SCHEMA:
                conn.execute(statement)

        def floor(_worker: bool) -> Floor | LibpqFloor | Deferq | PgQueuer | Procrastinate:
            return Floor(dsn)

        def libpq(_worker: bool) -> Floor | LibpqFloor | Deferq | PgQueuer | Procrastinate:
            return LibpqFloor(dsn)

        def ours(worker: bool) -> Floor | LibpqFloor | Deferq | PgQueuer | Procrastinate:
            return Deferq(dsn, schema, worker=worker)

        why = {"pgqueuer": install_peer("pgqueuer", lambda: PgQueuer(dsn)),
               "procrastinate": install_peer(
                   "procrastinate", lambda: Procrastinate(dsn, worker=False))}

        def pgq(_worker: bool) -> Floor | LibpqFloor | Deferq | PgQueuer | Procrastinate:
            return PgQueuer(dsn)

        def pro(worker: bool) -> Floor | LibpqFloor | Deferq | PgQueuer | Procrastinate:
            return Procrastinate(dsn, worker=worker)

        for producers in (1, 16):
            key = f"throughput_p{producers}"
            rows[key] = interleaved(args.reps, {
                "floor": lambda: throughput(floor, args.tasks, producers),
                "deferq": lambda: throughput(ours, args.tasks, producers),
                "libpq": lambda: throughput(libpq, args.tasks, producers)},
                reps_of.setdefault(key, {}))
            for peer, make in (("pgqueuer", pgq), ("procrastinate", pro)):
                if why[peer] is None:
                    rows[key][peer] = throughput(make, args.tasks, producers)
        samples = 100 if args.smoke else 1000
        f50, f99 = claim_latency(floor, samples)
        d50, d99 = claim_latency(ours, samples)
        rows["claim_latency_p50"] = {"floor": f50, "deferq": d50}
        rows["claim_latency_p99"] = {"floor": f99, "deferq": d99}
        rows.update(dead_rows(dsn, schema, args.dead, 20 if args.smoke else 200))
        reset(dsn, schema)
        started = time.perf_counter()
        load_backlog(dsn, schema, args.backlog)
        load_s = time.perf_counter() - started
        ops = 100 if args.smoke else 1000
        rows["backlog"] = {"floor": backlog(floor, ops), "deferq": backlog(ours, ops)}
    finally:
        cluster.destroy()

    print(f"PostgreSQL backend benchmark: {args.tasks} tasks per throughput row, {WORKERS} "
          f"workers, {args.dead} dead tasks, {args.backlog} pending backlog "
          f"(bulk-loaded in {load_s:.1f} s)")
    print(f"{'row':<20}{'floor':>12}{'deferq':>12}{'ratio':>8}  verdict")
    for key, row in rows.items():
        ratio = row.setdefault("ratio", row["deferq"] / row["floor"])
        unit = "s" if key.startswith(("throughput", "backlog")) else "ms"
        if key.startswith("dead_"):
            verdict = ("PASS" if row["deferq"] < TARGET_DEAD_MS else "MISS") + \
                f" (target < {TARGET_DEAD_MS} ms)"
        else:
            verdict = verdict_ratio(ratio) + f" (target <= {TARGET_RATIO}x floor)"
        print(f"{key:<20}{row['floor']:>10.3f}{unit:<2}{row['deferq']:>10.3f}{unit:<2}"
              f"{ratio:>7.2f}x  {verdict}")
    for key in ("throughput_p1", "throughput_p16"):
        row = rows[key]
        line = (f"{key:<20}deferq {args.tasks / row['deferq']:.0f} tasks/s, floor "
                f"{args.tasks / row['floor']:.0f} tasks/s, libpq floor "
                f"{args.tasks / row['libpq']:.0f} tasks/s (deferq {row['ratio_libpq']:.2f}x "
                f"of it, for information: no target)")
        for peer in ("pgqueuer", "procrastinate"):
            if peer in row:
                ahead = "PASS" if row["deferq"] < row[peer] else "MISS"
                line += (f", {peer} {args.tasks / row[peer]:.0f} tasks/s: {ahead} "
                         f"(target: deferq ahead of {peer})")
        print(line)
    for peer, reason in why.items():
        if reason is not None:
            print(f"{peer}: {reason}; no verdict")
    if args.json_out is not None:
        with open(args.json_out, "a", encoding="utf-8") as out:
            missing = {peer: reason for peer, reason in why.items() if reason is not None}
            out.write(json.dumps({"rows": rows, "repetitions": reps_of,
                                  "peers": missing, "tasks": args.tasks,
                                  "dead": args.dead, "backlog": args.backlog}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
