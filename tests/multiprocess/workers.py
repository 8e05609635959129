"""Worker processes for the multi-process tests, and the parent's handle on them.

Goal: drive real OS processes that share one storage directory, so that flock,
rename and SIGKILL behave exactly as in production (spec/assumptions.md A-1,
A-8). Method: the parent starts ``python -m tests.multiprocess.workers OPTIONS``
(a fresh interpreter, no fork), the child opens a ``Disk`` and then serves one
JSON command per stdin line, answering with one JSON line on stdout. The child
never sleeps to synchronize: it answers when an operation returned, and a
"stalled" child announces the stall on stdout and then blocks on stdin, so the
parent knows exactly when a SIGKILL lands mid-operation. A child whose stdin
closes (the parent died or finished) exits, so no child outlives its test.

Child side: ``serve`` and the ops in ``_OPS``, plus three special pieces:
``StallingEnv`` (an ``OsEnv`` whose big writes write half and then block, to
leave a real torn tail behind a real held lock), ``PauseBeforeNewFileLockEnv``
(pauses between creating a new WAL file and locking it, until told to go on)
and ``CachedFdDeadTaskStore`` (a deliberately BROKEN store that caches its data
descriptor from init, the renamed-inode race of the reference design; tests use
it to prove they bite).

Parent side: ``WorkerPool`` (spawns, and always reaps, every child; starts
several commands together behind a flock gate), ``Worker`` (send/receive/kill)
and ``Reply`` (typed access to a JSON answer), plus helpers that inspect files
directly, without deferq's readers.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import random
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import Final

from deferq._engine.deadstore import DeadTaskStore
from deferq._engine.env import Env, MappedWindow, OpenFlag
from deferq._core.deadcodec import decode_dead_line, decode_dead_payload, encode_dead
from deferq._core.frame import BadLine
from deferq._core.names import dead_data_name, dead_lock_name, is_wal_file_name
from deferq._core.walcodec import WalAdd, decode_wal_line
from deferq._engine.io import repair_tail, write_all
from deferq._engine.osenv import OsEnv
from deferq._core.types import DeadTask
from deferq.backends import Disk

ROOT: Final = Path(__file__).resolve().parents[2]
PREFIX: Final = "deferred-"
REPLY_TIMEOUT_S: Final = 30.0
JsonObject = dict[str, object]


# ============================================================================ child side


def _emit(message: JsonObject) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _block_until_stdin_closes() -> None:
    """Park this process until the parent kills it (or closes our stdin: then exit)."""
    while sys.stdin.buffer.readline():
        pass
    os._exit(3)


class StallingEnv(OsEnv):
    """An ``OsEnv`` whose first write of at least ``threshold`` bytes stalls halfway.

    It writes the first half of the buffer for real, announces
    ``{"event": "stalled"}`` and blocks, so the caller (the real WAL or store
    code, holding its real locks) is frozen mid-write until SIGKILL.
    """

    def __init__(self, threshold_bytes: int) -> None:
        self._threshold_bytes = threshold_bytes

    def write(self, fd: int, data: bytes) -> int:
        if len(data) < self._threshold_bytes:
            return os.write(fd, data)
        half = data[: len(data) // 2]
        view = memoryview(half)
        while view:
            view = view[os.write(fd, bytes(view)):]
        _emit({"event": "stalled", "written": len(half), "size": len(data), "via": "write"})
        _block_until_stdin_closes()
        raise AssertionError("unreachable")  # pragma: no cover

    def map_shared(self, fd: int, offset: int, length: int) -> MappedWindow:
        return _StallingWindow(super().map_shared(fd, offset, length), self._threshold_bytes)


class _StallingWindow:
    """A mapped window (W-26) whose first store of at least the threshold stalls halfway,
    as ``StallingEnv.write`` does: the memory copy a SIGKILL interrupts."""

    def __init__(self, inner: MappedWindow, threshold_bytes: int) -> None:
        self._inner = inner
        self._threshold_bytes = threshold_bytes

    def __setitem__(self, index: slice[int, int, None], value: bytes, /) -> None:
        if len(value) < self._threshold_bytes:
            self._inner[index] = value
            return
        half = len(value) // 2
        self._inner[index.start:index.start + half] = value[:half]
        _emit({"event": "stalled", "written": half, "size": len(value), "via": "store"})
        _block_until_stdin_closes()
        raise AssertionError("unreachable")  # pragma: no cover

    def close(self) -> None:
        self._inner.close()


class PauseBeforeNewFileLockEnv(OsEnv):
    """An ``OsEnv`` that pauses between creating a file (O_EXCL) and its first flock.

    It announces ``{"event": "stalled"}`` and waits for one stdin line, so the
    parent can let another worker list the directory inside that window.
    """

    def __init__(self) -> None:
        self._new_fds: set[int] = set()
        self._paused = False

    def open(self, path: str, flags: OpenFlag, mode: int = 0o600) -> int:
        fd = super().open(path, flags, mode)
        if OpenFlag.EXCLUSIVE in flags:
            self._new_fds.add(fd)
        return fd

    def flock_exclusive_nb(self, fd: int) -> bool:
        if fd in self._new_fds and not self._paused:
            self._paused = True
            _emit({"event": "stalled"})
            if not sys.stdin.buffer.readline():
                os._exit(3)
        return super().flock_exclusive_nb(fd)


class CachedFdDeadTaskStore(DeadTaskStore):
    """DELIBERATELY BROKEN (violates S-3): keeps the data descriptor opened at init.

    It still serializes on the lock file, but appends to the inode that was at
    the data path when it opened. After another process compacts (renames a
    new file over the path), its adds go to a ghost inode nobody reads.
    """

    def __init__(self, env: Env, path: str, prefix: str) -> None:
        super().__init__(env, path, prefix)
        self._cached_fd = env.open(self._data, OpenFlag.READ | OpenFlag.WRITE | OpenFlag.APPEND)

    def add(self, task: DeadTask) -> str:
        line = encode_dead(task)
        with self._locked("add a task to"):
            repair_tail(self._env, self._cached_fd)
            write_all(self._env, self._cached_fd, line)
            self._env.fsync(self._cached_fd)
        return task.id

    def close(self) -> None:
        super().close()
        self._env.close(self._cached_fd)


@dataclasses.dataclass
class _Child:
    """The state of one worker process."""

    disk: Disk | None
    held_lock_fds: list[int]


def _text(args: JsonObject, key: str) -> str:
    value = args[key]
    assert isinstance(value, str), (key, value)
    return value


def _number(args: JsonObject, key: str) -> int:
    value = args[key]
    assert isinstance(value, int) and not isinstance(value, bool), (key, value)
    return value


def _texts(args: JsonObject, key: str) -> list[str]:
    value = args[key]
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), (key, value)
    return [str(v) for v in value]


def _disk(child: _Child) -> Disk:
    assert child.disk is not None, "this worker was started without a Disk"
    return child.disk


def _failure() -> RuntimeError:
    """The exception recorded with every dead task (raised, so it has a traceback)."""
    try:
        raise RuntimeError("worker gave up")
    except RuntimeError as exc:
        return exc


def _context(task_id: str, size: int) -> bytes:
    """A deterministic context, so a reader can recompute what was stored."""
    seed = task_id.encode() + b"|"
    return (seed * (size // len(seed) + 1))[:size]


def _op_add_task(child: _Child, args: JsonObject) -> JsonObject:
    context = bytes.fromhex(_text(args, "context_hex")) if "context_hex" in args else (
        b"\xab" * _number(args, "context_bytes"))
    publish_at = args.get("publish_at")
    assert publish_at is None or isinstance(publish_at, int)
    task_id = args.get("task_id")
    assert task_id is None or isinstance(task_id, str)
    return {"task_id": _disk(child).add_task(context, publish_at, task_id)}


def _op_add_tasks(child: _Child, args: JsonObject) -> JsonObject:
    """Add ``count`` tasks and remove every ``remove_every``-th one right after adding it."""
    disk = _disk(child)
    acked: list[list[object]] = []
    removed: list[str] = []
    remove_every = _number(args, "remove_every")
    for index in range(1, _number(args, "count") + 1):
        publish_at = None if index % 2 else 1_000_000_000 + index
        context = _context(f"{os.getpid()}-{index}", 24 + index % 7)
        task_id = disk.add_task(context, publish_at)
        acked.append([task_id, context.hex(), publish_at])
        if remove_every and index % remove_every == 0:
            disk.remove_task(task_id)
            removed.append(task_id)
    return {"acked": acked, "removed": removed}


def _op_pending(child: _Child, args: JsonObject) -> JsonObject:
    tasks = _disk(child).pending_tasks()
    return {"tasks": [[t.task_id, t.context.hex(), t.publish_at] for t in tasks]}


def _op_wal_file(child: _Child, args: JsonObject) -> JsonObject:
    return {"name": _disk(child)._wal.file_name}


def _add_dead(disk: Disk, task_id: str, context_bytes: int) -> None:
    disk.add_dead_task(task_id, _context(task_id, context_bytes), _failure(),
                       task_class="tests.Job", attempts=3)


def _op_add_dead(child: _Child, args: JsonObject) -> JsonObject:
    task_id = _text(args, "task_id")
    _add_dead(_disk(child), task_id, _number(args, "context_bytes"))
    return {"task_id": task_id}


def _op_add_dead_many(child: _Child, args: JsonObject) -> JsonObject:
    """Add ``{prefix}{n}`` for n in [start, start + count); retry an add that timed out.

    A timed-out add acknowledged nothing (L-3, D-8), so retrying the same id is what
    the queue does when it recovers the task from its WAL. Each acknowledged id is
    appended to ``ack_file`` (when given) at once, for concurrent removers to pick.
    """
    disk = _disk(child)
    ack_path = args.get("ack_file")
    ack_fd = None if ack_path is None else os.open(
        str(ack_path), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    acked: list[str] = []
    timeouts = 0
    prefix = _text(args, "prefix")
    start = _number(args, "start")
    try:
        for number in range(start, start + _number(args, "count")):
            task_id = f"{prefix}{number}"
            while True:
                try:
                    _add_dead(disk, task_id, 64)
                    break
                except TimeoutError:
                    timeouts += 1
            acked.append(task_id)
            if ack_fd is not None:
                os.write(ack_fd, f"{task_id}\n".encode())
    finally:
        if ack_fd is not None:
            os.close(ack_fd)
    return {"acked": acked, "timeouts": timeouts}


def _acked_ids(paths: Iterable[str]) -> list[str]:
    ids: list[str] = []
    for path in paths:
        with open(path, "rb") as file:
            data = file.read()
        ids.extend(line.decode() for line in data[: data.rfind(b"\n") + 1].splitlines())
    return ids


def _op_remove_dead_random(child: _Child, args: JsonObject) -> JsonObject:
    """``count`` times: remove one id chosen among those the adders acknowledged so far."""
    disk = _disk(child)
    rng = random.Random(_number(args, "seed"))
    removed: list[str] = []
    not_found = 0
    timeouts = 0
    for _ in range(_number(args, "count")):
        candidates = _acked_ids(_texts(args, "ack_files"))
        assert candidates, "the parent starts removers only after some adds were acknowledged"
        task_id = rng.choice(candidates)
        try:
            found = disk.remove_dead_tasks(task_id)
        except TimeoutError:
            timeouts += 1
            continue
        if found:
            assert found == 1
            removed.append(task_id)
        else:
            not_found += 1
    return {"removed": removed, "not_found": not_found, "timeouts": timeouts}


def _op_remove_dead(child: _Child, args: JsonObject) -> JsonObject:
    return {"count": _disk(child).remove_dead_tasks(_texts(args, "ids"))}


def _op_list_dead(child: _Child, args: JsonObject) -> JsonObject:
    tasks = _disk(child).list_dead_tasks()
    assert all(t.context == _context(t.id, len(t.context)) for t in tasks), "context changed"
    return {"ids": [t.id for t in tasks]}


def _op_find_dead(child: _Child, args: JsonObject) -> JsonObject:
    task = _disk(child).find_dead_task(_text(args, "task_id"))
    return {"found": task is not None}


def _op_flock_hold(child: _Child, args: JsonObject) -> JsonObject:
    """Take flock(LOCK_EX | LOCK_NB) on a file by path, on a descriptor of our own, and keep it."""
    fd = os.open(_text(args, "path"), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    child.held_lock_fds.append(fd)
    return {}


def _op_flock_release(child: _Child, args: JsonObject) -> JsonObject:
    for fd in child.held_lock_fds:
        os.close(fd)
    child.held_lock_fds.clear()
    return {}


def _op_append_raw(child: _Child, args: JsonObject) -> JsonObject:
    """Append raw bytes to a file (to leave a partial line behind, as a crash would)."""
    fd = os.open(_text(args, "path"), os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, bytes.fromhex(_text(args, "data_hex")))
    finally:
        os.close(fd)
    return {}


_OPS: Final[dict[str, Callable[[_Child, JsonObject], JsonObject]]] = {
    "add_task": _op_add_task,
    "add_tasks": _op_add_tasks,
    "pending": _op_pending,
    "wal_file": _op_wal_file,
    "add_dead": _op_add_dead,
    "add_dead_many": _op_add_dead_many,
    "remove_dead": _op_remove_dead,
    "remove_dead_random": _op_remove_dead_random,
    "list_dead": _op_list_dead,
    "find_dead": _op_find_dead,
    "flock_hold": _op_flock_hold,
    "flock_release": _op_flock_release,
    "append_raw": _op_append_raw,
}


def _open_disk(options: JsonObject) -> Disk | None:
    if not options.get("open_disk", True):
        return None
    env: OsEnv = OsEnv()
    if options.get("stall_writes_over") is not None:
        env = StallingEnv(_number(options, "stall_writes_over"))
    elif options.get("pause_before_new_file_lock"):
        env = PauseBeforeNewFileLockEnv()
    disk = Disk(path=_text(options, "path"), prefix=PREFIX,
                fsync_frequency=_number(options, "fsync_frequency"), env=env)
    if options.get("dead_store") == "cached_fd":
        disk._dead.close()
        disk._dead = CachedFdDeadTaskStore(env, disk.path, disk.prefix)
    return disk


def _pass_gate(path: str) -> None:
    """Announce arrival, then wait until the parent opens the gate (releases its flock)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        _emit({"event": "at_gate"})
        fcntl.flock(fd, fcntl.LOCK_SH)
    finally:
        os.close(fd)


def serve(options: JsonObject) -> None:
    """The child's main loop: open, announce readiness, then answer commands until EOF."""
    child = _Child(disk=_open_disk(options), held_lock_fds=[])
    wal = None if child.disk is None else child.disk._wal.file_name
    _emit({"event": "ready", "pid": os.getpid(), "wal_file": wal})
    while line := sys.stdin.buffer.readline():
        command = json.loads(line)
        assert isinstance(command, dict)
        op = command.pop("op")
        gate = command.pop("gate", None)
        if gate is not None:
            _pass_gate(str(gate))
        started_at = time.time()
        started = time.monotonic()
        try:
            result = _OPS[op](child, command)
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which decides.
            _emit({"event": "error", "type": type(exc).__name__, "message": str(exc),
                   "elapsed_s": time.monotonic() - started})
            continue
        _emit({"event": "result", "elapsed_s": time.monotonic() - started,
               "started_at": started_at, "ended_at": time.time(), **result})
    if child.disk is not None:
        child.disk.close()


# ============================================================================ parent side


class WorkerDiedError(AssertionError):
    """A worker exited or went silent while the parent waited for its answer."""


@dataclasses.dataclass(frozen=True)
class Reply:
    """One JSON answer of a worker, with typed accessors."""

    data: JsonObject

    @property
    def event(self) -> str:
        return self.text("event")

    def text(self, key: str) -> str:
        return _text(self.data, key)

    def number(self, key: str) -> int:
        return _number(self.data, key)

    def seconds(self, key: str) -> float:
        value = self.data[key]
        assert isinstance(value, (int, float)), (key, value)
        return float(value)

    def texts(self, key: str) -> list[str]:
        return _texts(self.data, key)

    def tasks(self, key: str) -> list[tuple[str, bytes, int | None]]:
        """A list of ``[task_id, context_hex, publish_at]`` as typed tuples."""
        value = self.data[key]
        assert isinstance(value, list)
        out: list[tuple[str, bytes, int | None]] = []
        for item in value:
            assert isinstance(item, list) and len(item) == 3, item
            task_id, context_hex, publish_at = item
            assert isinstance(task_id, str) and isinstance(context_hex, str)
            assert publish_at is None or isinstance(publish_at, int)
            out.append((task_id, bytes.fromhex(context_hex), publish_at))
        return out


class Worker:
    """A running worker process. Created by ``WorkerPool.spawn``, which reaps it."""

    def __init__(self, process: subprocess.Popen[bytes], stderr_path: Path) -> None:
        self.process = process
        self._stderr_path = stderr_path
        self._buffer = b""
        assert process.stdout is not None and process.stdin is not None
        self._out_fd = process.stdout.fileno()
        self.pid = process.pid

    def stderr_text(self) -> str:
        return self._stderr_path.read_text(errors="replace")

    def send(self, op: str, **args: object) -> None:
        """Send one command without waiting for its answer."""
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"op": op, **args}).encode() + b"\n")
        self.process.stdin.flush()

    def receive(self, timeout_s: float = REPLY_TIMEOUT_S) -> Reply:
        """The next JSON line from the worker; fails if it dies or stays silent."""
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            ready, _, _ = select.select([self._out_fd], [], [], max(remaining, 0.0))
            if not ready:
                raise WorkerDiedError(f"worker {self.pid} silent for {timeout_s} s; "
                                      f"stderr:\n{self.stderr_text()}")
            chunk = os.read(self._out_fd, 1 << 20)
            if not chunk:
                self.process.wait()
                raise WorkerDiedError(f"worker {self.pid} exited with {self.process.returncode}"
                                      f"; stderr:\n{self.stderr_text()}")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        message = json.loads(line)
        assert isinstance(message, dict)
        return Reply(message)

    def expect(self, event: str, timeout_s: float = REPLY_TIMEOUT_S) -> Reply:
        reply = self.receive(timeout_s)
        assert reply.event == event, f"worker {self.pid}: expected {event}, got {reply.data}"
        return reply

    def call(self, op: str, **args: object) -> Reply:
        """Send a command and return its successful result."""
        self.send(op, **args)
        return self.expect("result")

    def kill(self) -> None:
        """SIGKILL and reap; the worker must have died of exactly that signal."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=REPLY_TIMEOUT_S)
        assert self.process.returncode == -signal.SIGKILL, self.process.returncode

    def close(self) -> None:
        """Close the worker's stdin and wait for a clean exit (it closes its Disk)."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=REPLY_TIMEOUT_S)
        assert self.process.returncode == 0, (self.process.returncode, self.stderr_text())

    def reap(self) -> None:
        """End the worker however it is: close its stdin, kill it if still running, wait."""
        try:
            if self.process.poll() is None:
                self.process.kill()
            self.process.wait(timeout=REPLY_TIMEOUT_S)
        finally:
            for pipe in (self.process.stdin, self.process.stdout):
                if pipe is not None and not pipe.closed:
                    try:
                        pipe.close()
                    except OSError:
                        pass


class WorkerPool:
    """Spawns workers for one test and reaps every one of them on exit, pass or fail."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.storage = tmp_path / "storage"
        self._workers: list[Worker] = []

    def spawn(self, *, open_disk: bool = True, fsync_frequency: int = 0,
              dead_store: str = "correct", stall_writes_over: int | None = None,
              pause_before_new_file_lock: bool = False, wait_ready: bool = True) -> Worker:
        """Start a worker on ``self.storage``; wait until it has opened its Disk unless told not to."""
        options: JsonObject = {"path": str(self.storage), "open_disk": open_disk,
                               "fsync_frequency": fsync_frequency, "dead_store": dead_store,
                               "stall_writes_over": stall_writes_over,
                               "pause_before_new_file_lock": pause_before_new_file_lock}
        stderr_path = self.tmp_path / f"worker-{len(self._workers)}.stderr"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH", "")) if p)
        with open(stderr_path, "wb") as stderr:
            process = subprocess.Popen(
                [sys.executable, "-m", "tests.multiprocess.workers", json.dumps(options)],
                cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=stderr)
        worker = Worker(process, stderr_path)
        self._workers.append(worker)
        if wait_ready:
            worker.expect("ready")
        return worker

    def start_together(self, commands: list[tuple[Worker, str, JsonObject]]) -> None:
        """Send each worker its command behind one gate, then open the gate for all at once.

        The gate is a flock the parent holds exclusively; each worker announces that it
        reached the gate and then blocks on a shared flock, so no worker starts its
        command before every worker is ready to start its own.
        """
        gate = self.tmp_path / f"gate-{len(self._workers)}-{time.monotonic_ns()}"
        fd = os.open(gate, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            for worker, op, args in commands:
                worker.send(op, gate=str(gate), **args)
            for worker, _, _ in commands:
                worker.expect("at_gate")
        finally:
            os.close(fd)

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        errors: list[BaseException] = []
        for worker in self._workers:
            try:
                worker.reap()
            except BaseException as error:  # noqa: BLE001 - reap the others first.
                errors.append(error)
        if errors:
            raise errors[0]

    # --- file inspection (parent side, no Disk involved)

    @property
    def dead_data_path(self) -> Path:
        return self.storage / dead_data_name(PREFIX)

    @property
    def dead_lock_path(self) -> Path:
        return self.storage / dead_lock_name(PREFIX)

    def wal_files(self) -> list[str]:
        return sorted(n for n in os.listdir(self.storage) if is_wal_file_name(PREFIX, n))


@dataclasses.dataclass(frozen=True)
class FileScan:
    """What a data file holds, line by line: ids of valid records, damaged lines, the tail."""

    ids: list[str]
    damaged: int
    tail: bytes


def _complete_lines(path: Path, *, wal: bool = False) -> tuple[list[bytes], bytes]:
    """The newline-terminated lines of a file (without newlines) and the bytes after the last;
    for a WAL file, without the space reserved after its records (R-@L, W-25)."""
    data = path.read_bytes()
    lines = (data.rstrip(b"\0") if wal else data).split(b"\n")
    tail = lines.pop()
    return lines, tail


def scan_dead_file(path: Path) -> FileScan:
    """Decode every line of a dead-task data file (F-2, F-10, F-11) outside deferq's reader."""
    lines, tail = _complete_lines(path)
    ids: list[str] = []
    damaged = 0
    for line in lines:
        framed = decode_dead_line(line)
        task = framed if isinstance(framed, BadLine) else decode_dead_payload(framed)
        if isinstance(task, BadLine):
            damaged += 1
        else:
            ids.append(task.id)
    return FileScan(ids, damaged, tail)


def scan_wal_file(path: Path) -> FileScan:
    """Decode every line of a WAL file (F-6, F-7): ids of add records, damaged lines, the tail."""
    lines, tail = _complete_lines(path, wal=True)
    ids: list[str] = []
    damaged = 0
    for line in lines:
        record = decode_wal_line(line)
        if isinstance(record, BadLine):
            damaged += 1
        elif isinstance(record, WalAdd):
            ids.append(record.task_id)
    return FileScan(ids, damaged, tail)


def assert_ran_concurrently(replies: list[Reply]) -> None:
    """The commands answered by ``replies`` were all running at one instant (wall clock)."""
    latest_start = max(reply.seconds("started_at") for reply in replies)
    earliest_end = min(reply.seconds("ended_at") for reply in replies)
    assert latest_start < earliest_end, "one worker finished before another started"


def lock_is_free(path: Path) -> bool:
    """Probe flock(LOCK_EX | LOCK_NB) on ``path`` from a new open file description."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # Closing releases the probe's lock if it was taken.
    return True


if __name__ == "__main__":
    parsed = json.loads(sys.argv[1])
    assert isinstance(parsed, dict)
    serve(parsed)
