"""What the operator commands print (spec/queue.md Q-26..Q-28), through the real command.

Goal: programs get exactly one JSON document from every command, with contexts they can
turn back into the exact stored bytes; people get aligned tables in which nothing from
the store can act on their terminal. Method: build a store with ``Disk`` holding dead tasks
with hostile text and binary contexts, run ``python -m deferq`` in subprocesses for every
command (successes, failures and usage errors), and parse what each printed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deferq._cli.output import context_bytes
from deferq.backends import Disk

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = "disk \x1b[2J\x1b[31mfull\u202egnp.exe \x07 done"
CONTEXTS = {
    "binary": b"\xff\x00\x01",
    "backslash-text": b"\\xff",
    "queue": b'{"v":1,"task":"app.Mail","args":[1],"kwargs":{},"attempts":3}',
    "spaced-json": b'{"a": 1}',
    "pickled": b"deferq-pickle-1:" + b"0" * 64 + b":\x80\x04K\x01.",
}


def deferq(*args: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("DEFERQ_")}
    return subprocess.run([sys.executable, "-m", "deferq", *args], cwd=ROOT, env=environ,
                          capture_output=True, text=True, timeout=60, check=False)


def _fail(message: str) -> Exception:
    try:
        raise OSError(message)
    except OSError as caught:
        return caught


@pytest.fixture
def store(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A store with one dead task per context above (the id of each by its name)."""
    path = tmp_path / "storage"
    ids = {}
    with Disk(path=path) as disk:
        for name, context in CONTEXTS.items():
            task_id = disk.add_task(context)
            disk.add_dead_task(task_id, context, _fail(HOSTILE if name == "queue" else name),
                               task_class="app.Mail", attempts=3)
            disk.remove_task(task_id)
            ids[name] = task_id
        disk.add_task(CONTEXTS["binary"], publish_at=2_000_000_000)
    return path, ids


@pytest.mark.slow
@pytest.mark.spec("Q-26", "Q-133", "Q-134", "Q-112")
def test_every_command_prints_exactly_one_json_document(store: tuple[Path, dict[str, str]],
                                                        tmp_path: Path) -> None:
    path, ids = store
    p = ("--path", str(path))
    cases: list[tuple[tuple[str, ...], int, type]] = [
        (("dead", "list", *p), 0, list),
        (("dead", "show", ids["queue"], *p), 0, dict),
        (("dead", "show", "1-1-404", *p), 3, type(None)),
        (("dead", "retry", ids["binary"], "--dry-run", *p), 0, dict),
        (("dead", "remove", "1-1-404", ids["binary"], "--dry-run", *p), 3, dict),
        (("pending", "list", *p), 0, list),
        (("stats", *p), 0, dict),
        (("verify", *p), 0, dict),
        (("dead", "remove", "1-1-404", ids["spaced-json"], *p), 3, dict),
        (("dead", "retry", ids["binary"], *p), 0, dict),
        (("stats", "--path", str(tmp_path / "nowhere")), 5, dict),  # no store: an error document
        (("dead", "list", "--limit", "-1", *p), 2, dict),  # a usage error too
        (("dead", "remove", *p), 2, dict),
    ]
    for argv, status, shape in cases:
        result = deferq(*argv, "--json")
        assert result.returncode == status, (argv, result)
        document = json.loads(result.stdout)  # exactly one document: json.loads rejects more
        assert isinstance(document, shape), (argv, document)
        if status in (1, 2, 5):
            assert isinstance(document, dict) and set(document) == {"error", "status"}
            assert document["status"] == status and isinstance(document["error"], str)
            assert result.stderr.strip().splitlines()[-1].startswith("deferq: error: ")
    # the shape of each result.
    shown = json.loads(deferq("dead", "show", ids["queue"], *p, "--json").stdout)
    assert set(shown) == {"id", "task_class", "attempts", "enqueued_at", "failed_at",
                          "exception_class", "exception_message", "backtrace", "context", "meta"}
    assert isinstance(shown["backtrace"], list) and isinstance(shown["failed_at"], int)
    stats = json.loads(deferq("stats", *p, "--json").stdout)
    assert set(stats) == {"path", "prefix", "wal_files", "pending_tasks", "wal_damaged_lines",
                          "dead_tasks", "by_task_class", "by_exception_class"}
    pending = json.loads(deferq("pending", "list", *p, "--json").stdout)
    assert pending and all(set(t) == {"file", "id", "publish_at", "context"} for t in pending)
    files = json.loads(deferq("verify", *p, "--json").stdout)["files"]
    assert files and all(set(f) == {"file", "kind", "bytes", "reserved_bytes", "records", "faults",
                                    "torn_tail_bytes"} for f in files)
    retried = json.loads(deferq("dead", "retry", "1-1-404", *p, "--json").stdout)
    assert retried == {"retried": [], "missing": ["1-1-404"]}
    dry = json.loads(deferq("dead", "remove", ids["queue"], "--dry-run", *p, "--json").stdout)
    assert set(dry) == {"dry_run", "would_remove", "missing"} and dry["dry_run"] is True
    removed = json.loads(deferq("dead", "remove", "1-1-404", ids["queue"], *p, "--json").stdout)
    assert removed == {"removed": 1, "missing": ["1-1-404"]}
    summary = json.loads(deferq("verify", *p, "--json").stdout)["summary"]
    # The service's WAL, the retry's hand-off WAL file (W-34: a retry no longer adopts the
    # service's file) and the dead-task data file.
    assert summary == {"files": 3, "records": summary["records"], "damaged_files": 0}


@pytest.mark.slow
@pytest.mark.spec("Q-27")
def test_contexts_come_back_byte_for_byte_and_binary_never_looks_like_text(
        store: tuple[Path, dict[str, str]]) -> None:
    path, ids = store
    listed = json.loads(deferq("dead", "list", "--path", str(path), "--json").stdout)
    by_id = {task["id"]: task["context"] for task in listed}
    for name, context in CONTEXTS.items():
        view = by_id[ids[name]]
        assert context_bytes(view) == context, name
        assert view["bytes"] == len(context)
    assert by_id[ids["queue"]]["encoding"] == "json"
    assert by_id[ids["queue"]]["json"]["task"] == "app.Mail"
    for name in ("binary", "backslash-text", "spaced-json", "pickled"):
        assert by_id[ids[name]]["encoding"] == "base64", name
    assert by_id[ids["binary"]] != by_id[ids["backslash-text"]]
    pending = json.loads(deferq("pending", "list", "--path", str(path), "--json").stdout)
    assert [context_bytes(row["context"]) for row in pending] == [CONTEXTS["binary"]]


@pytest.mark.slow
@pytest.mark.spec("Q-28")
def test_text_output_escapes_what_could_act_on_a_terminal_and_json_stays_exact(
        store: tuple[Path, dict[str, str]]) -> None:
    path, ids = store
    p = ("--path", str(path))
    for argv in (("dead", "list", *p), ("dead", "show", ids["queue"], *p),
                 ("dead", "remove", ids["queue"], "--dry-run", *p)):
        out = deferq(*argv).stdout
        assert "\x1b" not in out and "\u202e" not in out and "\x07" not in out, argv
        assert "\\x1b[2J\\x1b[31mfull\\u202egnp.exe \\x07 done" in out, argv
    exact = json.loads(deferq("dead", "show", ids["queue"], *p, "--json").stdout)
    assert exact["exception_message"] == HOSTILE


@pytest.mark.slow
@pytest.mark.spec("Q-28")
def test_lists_are_aligned_tables_with_headers_and_utc_times(
        store: tuple[Path, dict[str, str]]) -> None:
    path, _ = store
    lines = deferq("dead", "list", "--path", str(path)).stdout.splitlines()
    header, rows = lines[0], lines[1:-1]
    assert header.split()[:2] == ["ID", "TASK"] and len(rows) == len(CONTEXTS)
    for column in ("TASK CLASS", "ATTEMPTS", "FAILED AT", "EXCEPTION"):
        start = header.index(column)
        assert all(row[start - 2:start] == "  " and row[start] != " " for row in rows), column
    assert all("Z  " in row and "T" in row for row in rows)
    pending = deferq("pending", "list", "--path", str(path)).stdout.splitlines()
    assert pending[0].split() == ["ID", "TASK", "ATTEMPTS", "RUNS", "AT", "WAL", "FILE"]
    assert "2033-05-18T03:33:20Z" in pending[1]
    stats = deferq("stats", "--path", str(path)).stdout
    assert "dead tasks" in stats and "app.Mail" in stats and "{" not in stats


@pytest.mark.slow
@pytest.mark.spec("Q-24", "Q-132")
def test_remove_names_every_id_it_did_not_find(store: tuple[Path, dict[str, str]]) -> None:
    path, ids = store
    result = deferq("dead", "remove", ids["binary"], "1-1-404", "--path", str(path))
    assert result.returncode == 3
    assert result.stderr.strip() == "deferq: error: no dead task with id '1-1-404'"
    assert result.stdout.strip() == "removed 1 dead task(s)"
    broken = deferq("dead", "remove", "bad:id", "--path", str(path))
    assert broken.returncode == 1 and broken.stderr.count("\n") == 1
    assert "--version" in deferq("--help").stdout and "exit status:" in deferq("--help").stdout
    assert deferq("--version").stdout.startswith("deferq ")


def _run_with_terminal_stderr(*args: str) -> tuple[int, str, str]:
    """Run the command with standard error on a pseudo-terminal, standard output on a pipe."""
    import pty  # noqa: PLC0415 - POSIX only, as deferq

    leader, follower = pty.openpty()
    try:
        process = subprocess.Popen([sys.executable, "-m", "deferq", *args], cwd=ROOT,
                                   stdout=subprocess.PIPE, stderr=follower, text=True)
        os.close(follower)
        out, _ = process.communicate(timeout=60)
        seen = b""
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # EIO: the terminal's last writer is gone
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(leader)
    return process.returncode, out, seen.decode("utf-8", "replace")


@pytest.mark.slow
def test_long_work_shows_progress_on_a_terminal_and_nothing_when_piped(
        store: tuple[Path, dict[str, str]]) -> None:
    path, ids = store
    status, out, terminal = _run_with_terminal_stderr("verify", "--path", str(path))
    assert status == 0 and "verify: files scanned 1" in terminal
    assert "files scanned" not in out and out.splitlines()[-1].startswith("verify: files=2")
    status, out, terminal = _run_with_terminal_stderr("dead", "retry", ids["binary"],
                                                      "--path", str(path))
    assert status == 0 and "retry: steps 1/2" in terminal and "steps" not in out
    piped = deferq("verify", "--path", str(path))
    assert piped.returncode == 0 and piped.stderr == ""


@pytest.mark.slow
def test_a_reader_that_closes_the_pipe_early_ends_the_command_quietly(tmp_path: Path) -> None:
    import tempfile

    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else tmp_path
    with tempfile.TemporaryDirectory(dir=shm) as scratch:
        path = Path(scratch) / "storage"
        with Disk(path=path) as disk:  # more than a pipe holds, so writes after the close fail
            for n in range(2500):
                disk.add_dead_task(f"1-1-{n}", b"{}", RuntimeError("x" * 60), task_class="t",
                                   attempts=1)
        environ = {k: v for k, v in os.environ.items() if not k.startswith("DEFERQ_")}
        process = subprocess.Popen([sys.executable, "-m", "deferq", "dead", "list",
                                    "--path", str(path)], cwd=ROOT, env=environ,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert process.stdout is not None and process.stderr is not None
        first = process.stdout.readline()
        process.stdout.close()  # what `| head -1` does
        error = process.stderr.read().decode()
        status = process.wait(timeout=60)
    assert first.startswith(b"ID")
    assert "Traceback" not in error and "BrokenPipeError" not in error, error
    assert status in (0, 1)
