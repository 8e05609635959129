"""The operator API and the ``deferq dead|pending|stats`` commands on a real storage directory.

Goal: Q-13..Q-15, Q-24, Q-25, Q-33: retry is add + fsync before removal, with new ids and
attempts reset; bulk actions touch only what the filters select and say how
many; ``--dry-run`` changes nothing; ``pending list`` reads WAL files without
claiming them, even while a live ``Disk`` holds its file. Method: build the
storage with a real ``Disk`` (dead tasks with real contexts), run
``deferq._cli.main`` in-process and read its output, then check the files
with a fresh ``Disk``. The cross-process run is in test_processes.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from deferq import Operator
from deferq._cli import main
from deferq._cli.ops import file_size_text
from deferq._core.walcodec import encode_add
from deferq._runtime.serialize import Context, decode_context, encode_context
from deferq.backends import Disk
from tests.queue.helpers import RecordingBackend


class MailError(Exception):
    pass


def _fail(exc: Exception) -> Exception:
    try:
        raise exc
    except Exception as caught:  # noqa: BLE001 - a real traceback for the record
        return caught


def build(storage: Path) -> list[str]:
    """Three dead tasks (two Mail, one Sms) and one pending task; return the dead ids, oldest first."""
    ids = []
    with Disk(path=storage) as disk:
        for n, (name, exc) in enumerate([("app.Mail", MailError("smtp down")),
                                         ("app.Sms", ValueError("bad number")),
                                         ("app.Mail", MailError("quota"))]):
            context = encode_context(Context(name, (n,), {"to": f"u{n}"}, 21))
            task_id = disk.add_task(context)
            disk.add_dead_task(task_id, context, _fail(exc), task_class=name, attempts=21)
            disk.remove_task(task_id)
            ids.append(task_id)
        disk.add_task(encode_context(Context("app.Report", (), {}, 2)), publish_at=2_000_000_000)
    return ids


def cli(capsys: pytest.CaptureFixture[str], storage: Path, *args: str) -> tuple[int, str, str]:
    status = main([*args, "--path", str(storage)])
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.spec("Q-24", "Q-13")
def test_dead_list_text_json_paging_and_filters(storage: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    ids = build(storage)
    status, out, _ = cli(capsys, storage, "dead", "list")
    assert status == 0
    lines = out.splitlines()
    assert lines[0].split() == ["ID", "TASK", "CLASS", "ATTEMPTS", "FAILED", "AT", "EXCEPTION"]
    assert [line.split()[0] for line in lines[1:-1]] == ids[::-1]
    assert "app.Mail" in lines[1] and "tests.queue.test_cli_ops.MailError: quota" in lines[1]
    # aligned columns, times in UTC ISO-8601.
    assert len({line.index("app.") for line in lines[1:-1]}) == 1
    assert re.search(r"  \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ  ", lines[1])
    assert lines[-1] == "3 dead task(s)"
    status, out, _ = cli(capsys, storage, "dead", "list", "--json", "--limit", "1", "--offset", "1")
    [record] = json.loads(out)
    assert record["id"] == ids[1] and record["context"]["encoding"] == "json"
    assert record["context"]["json"] == {
        "v": 1, "task": "app.Sms", "args": [1], "kwargs": {"to": "u1"}, "attempts": 21}
    assert record["backtrace"] and record["backtrace"][-1].endswith("in _fail")
    status, out, _ = cli(capsys, storage, "dead", "list", "--json", "--task-class", "app.Mail",
                         "--exception-class", "tests.queue.test_cli_ops.MailError")
    assert [r["id"] for r in json.loads(out)] == [ids[2], ids[0]]
    status, out, _ = cli(capsys, storage, "dead", "list", "--task-class", "nope")
    assert out.strip() == "0 dead task(s)"


@pytest.mark.spec("Q-24")
def test_dead_show(storage: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ids = build(storage)
    status, out, _ = cli(capsys, storage, "dead", "show", ids[1])
    assert status == 0
    assert f"id:          {ids[1]}" in out and "ValueError: bad number" in out
    assert '"kwargs": {"to": "u1"}' in out
    status, _, err = cli(capsys, storage, "dead", "show", "1-2-3")
    assert status == 3 and "no dead task" in err


@pytest.mark.spec("Q-24", "Q-119", "Q-132", "Q-13")
def test_dead_remove_by_id_and_by_filter_with_dry_run(storage: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    ids = build(storage)
    data = sorted(storage.iterdir())
    before = {p.name: p.read_bytes() for p in data}
    status, out, _ = cli(capsys, storage, "dead", "remove", "--all", "--task-class", "app.Mail",
                         "--dry-run")
    assert status == 0 and out.splitlines()[-1] == "dry run: would remove 2 dead task(s)"
    assert {p.name: p.read_bytes() for p in sorted(storage.iterdir())} == before
    status, out, _ = cli(capsys, storage, "dead", "remove", "--all", "--task-class", "app.Mail")
    assert status == 0 and out.strip() == "removed 2 dead task(s)"
    status, out, _ = cli(capsys, storage, "dead", "remove", ids[1], "1-1-1")
    assert status == 3 and out.strip() == "removed 1 dead task(s)"
    status, _, err = cli(capsys, storage, "dead", "remove", ids[1], "--all")
    assert status == 2 and "not both" in err
    status, _, err = cli(capsys, storage, "dead", "remove")
    assert status == 2
    with Disk(path=storage) as disk:
        assert disk.list_dead_tasks() == []


@pytest.mark.spec("Q-24", "Q-33", "Q-13")
def test_dead_retry_all_with_filter(storage: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ids = build(storage)
    status, out, _ = cli(capsys, storage, "dead", "retry", "--all", "--exception-class",
                         "ValueError", "--dry-run")
    assert status == 0 and "would retry 1 dead task(s)" in out
    status, out, _ = cli(capsys, storage, "dead", "retry", "--all", "--exception-class",
                         "ValueError")
    assert status == 0
    assert out.splitlines()[-1].startswith("retried 1 dead task(s)")
    new_id = out.split(" as ")[1].split()[0]
    with Disk(path=storage) as disk:  # adopts the CLI's WAL file, like the next worker start
        pending = {t.task_id: t for t in disk.pending_tasks()}
        assert new_id in pending and ids[1] not in pending and new_id != ids[1]
        context = decode_context(pending[new_id].context)
        assert context == Context("app.Sms", (1,), {"to": "u1"}, 0)
        assert pending[new_id].publish_at is None
        assert [t.id for t in disk.list_dead_tasks()] == [ids[2], ids[0]]


@pytest.mark.spec("Q-14", "Q-24")
def test_pending_list_reads_a_live_workers_wal_without_claiming_it(
        storage: Path, capsys: pytest.CaptureFixture[str]) -> None:
    build(storage)
    with Disk(path=storage, fsync_frequency=0) as live:
        task_id = live.add_task(encode_context(Context("app.Mail", ("x",), {}, 0)))
        wal_files = sorted(p for p in storage.iterdir() if p.name.startswith("deferred-0-"))
        before = {p: p.read_bytes() for p in wal_files}
        status, out, _ = cli(capsys, storage, "pending", "list", "--json")
        assert status == 0
        rows = json.loads(out)
        assert {r["id"] for r in rows} >= {task_id}
        assert {r["context"]["json"]["task"] for r in rows} == {"app.Mail", "app.Report"}
        report = [r for r in rows if r["context"]["json"]["task"] == "app.Report"][0]
        assert report["publish_at"] == 2_000_000_000
        status, out, _ = cli(capsys, storage, "pending", "list")
        assert out.splitlines()[-1] == "2 pending task(s) in 1 WAL file(s)"
        assert {p: p.read_bytes() for p in wal_files} == before
        live.remove_task(task_id)  # the live worker still owns and writes its file
        assert task_id not in {t.task_id for t in live.pending_tasks()}


@pytest.mark.spec("Q-24")
def test_stats_and_missing_storage(storage: Path, capsys: pytest.CaptureFixture[str],
                                   tmp_path: Path) -> None:
    build(storage)
    status, out, _ = cli(capsys, storage, "stats", "--json")
    report = json.loads(out)
    assert status == 0
    assert report["dead_tasks"] == 3 and report["pending_tasks"] == 1
    assert report["by_task_class"] == {"app.Mail": 2, "app.Sms": 1}
    missing = tmp_path / "nowhere"
    for command in (["dead", "list"], ["stats"], ["pending", "list"], ["dead", "retry", "--all"]):
        status, _, err = cli(capsys, missing, *command)
        assert status == 5 and "no storage directory" in err
    assert not missing.exists()


class FailingSync(RecordingBackend):
    def sync(self) -> None:
        super().sync()
        raise OSError("fsync failed")


@pytest.mark.spec("Q-33")
def test_operator_retry_removes_nothing_when_the_wal_sync_fails() -> None:
    backend = FailingSync()
    context = encode_context(Context("t", (), {}, 5))
    backend.add_dead_task("7-1-1", context, RuntimeError("x"), task_class="t", attempts=5)
    backend.calls.clear()
    with pytest.raises(OSError):
        Operator(backend, backend).retry_dead(["7-1-1"])
    assert "7-1-1" in backend.dead
    assert [m for m, _ in backend.calls] == ["find_dead_task", "add_task", "sync"]


@pytest.mark.spec("Q-33", "Q-158")
def test_operator_retry_keeps_an_undecodable_context_as_is() -> None:
    backend = RecordingBackend()
    backend.add_dead_task("7-1-1", b"raw", RuntimeError("x"), task_class="t", attempts=5)
    [item], missing = Operator(backend, backend).retry_dead(["7-1-1", "7-1-1"])
    assert missing == [] and item.context == b"raw"
    assert backend.wal[item.new_id or ""].context == b"raw"


def test_queue_demo_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The narrated demo (``deferq queue-demo``) completes and ends in the state it describes."""
    path = tmp_path / "demo"
    assert main(["queue-demo", "--path", str(path)]) == 0
    out = capsys.readouterr().out
    assert "ChargeCard(1042) attempt 3: ok" in out
    assert "ParseUpload('leads.csv') attempt 1: ok (the parser was fixed)" in out
    assert out.rstrip().endswith("queue demo: ok")
    with Disk(path=path) as disk:
        assert [decode_context(t.context).task for t in disk.pending_tasks()] == [
            "demo.MonthlyReport"]
        assert disk.list_dead_tasks() == []


@pytest.mark.spec("W-25", "W-60")
def test_file_sizes_shown_to_people_split_a_wal_files_records_from_its_reserved_space(
        tmp_path: Path) -> None:
    with Disk(path=tmp_path, fsync_frequency=0) as disk:
        disk.add_task(b"x", task_id="t")
    (wal,) = [p for p in tmp_path.iterdir() if p.name.startswith("deferred-0-")]
    records = len(encode_add("t", None, b"x"))
    assert wal.stat().st_size > records
    assert file_size_text(str(wal)) == (
        f"{records:>7} bytes (+{wal.stat().st_size - records} reserved)")
    lock = tmp_path / "deferred-dead_tasks.lock"
    assert file_size_text(str(lock)) == "      0 bytes"


@pytest.mark.spec("Q-33", "Q-158", "Q-159")
def test_retry_resets_attempts_by_rewriting_the_field_and_builds_nothing() -> None:
    import uuid

    from deferq import ContextCodec, JsonTypes
    from deferq._runtime.serialize import reset_attempts

    plain = encode_context(Context("t", (1, "x"), {"k": [None]}, 9))
    assert reset_attempts(plain) == encode_context(Context("t", (1, "x"), {"k": [None]}, 0))
    tagged = ContextCodec(json_types=JsonTypes()).encode(Context("t", (uuid.UUID(int=5),), {}, 4))
    reset = reset_attempts(tagged)
    assert json.loads(reset)["attempts"] == 0 and json.loads(reset)["args"] == json.loads(tagged)["args"]
    for unchanged in (b'{"v": 1, "task": "t", "args": [], "kwargs": {}, "attempts": 3}',
                      b"deferq-pickle-1:" + b"0" * 64 + b":\x80\x04N.", b"\xff", b"[]",
                      b'{"v":3,"task":"t","args":[],"kwargs":{},"attempts":3}'):
        assert reset_attempts(unchanged) == unchanged
