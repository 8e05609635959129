"""``deferq pending list``, ``stats`` and ``dead list --offset`` over real storage directories.

``pending list`` and ``stats`` must show the pending tasks recovery would adopt: one replay of
every WAL file in name order (W-42, W-43), checked against the conformance corpus's expected
pending tasks in-process for every case and through a real ``deferq`` subprocess for the cases
where files interact. ``dead list --offset`` pages must partition the decodable dead tasks
whatever undecodable records sit between them (S-33, S-34).
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from deferq._cli import main
from deferq._core.frame import frame
from deferq.backends import Disk
from deferq.conformance.cases import default_corpus, find_cases, materialize

CASES = find_cases(default_corpus())
# Cases where a task's fate depends on more than one file (W-15, W-3 leftovers).
ACROSS_FILES = ["wal-removes-across-files", "wal-adoption-copy-beside-orphan",
                "wal-readd-in-later-file", "wal-rotation-leftover-new-file-first"]


def _pending(rows: list[dict[str, Any]]) -> list[tuple[str, int | None, str]]:
    return [(row["id"], row["publish_at"], row["context_base64"]) for row in rows]


def _cli_rows(rows: list[dict[str, Any]]) -> list[tuple[str, int | None, str]]:
    out = []
    for row in rows:
        context = row["context"]
        # base64 of the bytes, or JSON whose compact dump is exactly the bytes.
        raw = (base64.b64decode(context["base64"]) if context["encoding"] == "base64"
               else json.dumps(context["json"], separators=(",", ":"),
                               ensure_ascii=False).encode("utf-8"))
        assert len(raw) == context["bytes"]
        out.append((row["id"], row["publish_at"], base64.b64encode(raw).decode("ascii")))
    return out


def _deferq(*args: str) -> Any:
    done = subprocess.run([sys.executable, "-m", "deferq", *args], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_corpus_has_the_cases_this_file_relies_on() -> None:
    assert {case.name for case in CASES} >= set(ACROSS_FILES)


@pytest.mark.spec("W-42", "W-43", "W-15", "R-@I", "R-@J")
@pytest.mark.parametrize("case", [c for c in CASES if c.name in ACROSS_FILES],
                         ids=lambda c: c.name)
def test_pending_list_and_stats_merge_the_files_as_recovery_does(case: Any,
                                                                   tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    expected: Any = materialize(case, store)
    prefix = expected["prefix"]
    rows = _deferq("pending", "list", "--json", "--path", str(store), "--prefix", prefix)
    wanted = _pending(expected["pending"])
    assert len(wanted) > 0
    assert [(r["id"], r["publish_at"]) for r in rows] == [(i, p) for i, p, _ in wanted]
    names = {p.name for p in store.iterdir()}
    assert all(row["file"] in names for row in rows)
    report = _deferq("stats", "--json", "--path", str(store), "--prefix", prefix)
    assert report["pending_tasks"] == len(wanted)
    assert report["wal_damaged_lines"] == sum(expected["damage"]["wal"].values())


@pytest.mark.spec("W-42", "W-43", "W-44")
def test_pending_list_agrees_with_every_corpus_case(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    checked = 0
    for case in CASES:
        store = tmp_path / case.name
        store.mkdir()
        expected: Any = materialize(case, store)
        status = main(["pending", "list", "--json", "--path", str(store),
                       "--prefix", expected["prefix"]])
        out, _ = capsys.readouterr()
        if status == 5:  # no store of this prefix here (an empty directory)
            assert expected["pending"] == [] and not any(
                p.name.startswith(expected["prefix"]) for p in store.iterdir()), case.name
            continue
        assert status == 0, case.name
        rows = json.loads(out)
        assert [(r["id"], r["publish_at"]) for r in rows] == [
            (i, p) for i, p, _ in _pending(expected["pending"])], case.name
        assert [c for _, _, c in _cli_rows(rows)] == [
            c for _, _, c in _pending(expected["pending"])], case.name
        checked += 1
    assert checked >= len(CASES) - 2


@pytest.mark.spec("S-33", "S-34", "Q-24")
def test_dead_list_offset_pages_partition_through_a_real_cli(tmp_path: Path) -> None:
    store = tmp_path / "store"
    names = [f"t{n}" for n in range(7)]
    places: list[str | None] = []  # oldest first; None: an undecodable record's place (S-33)
    with Disk(path=store, fsync_frequency=0) as disk:
        for n, name in enumerate(names):
            disk.add_dead_task(name, b"", RuntimeError(name), task_class="T", attempts=1)
            places.append(name)
            if n % 2 == 0:  # valid frame, JSON that does not decode (R-@G)
                with (store / "deferred-dead_tasks-0").open("ab") as f:
                    f.write(frame(b'dead_task:bad%d:{"not":"a dead task"}' % n))
                places.append(None)
    places.reverse()
    seen: list[str] = []
    for offset in range(0, len(places), 3):
        page = _deferq("dead", "list", "--json", "--path", str(store),
                       "--offset", str(offset), "--limit", "3")
        assert [row["id"] for row in page] == [
            p for p in places[offset:offset + 3] if p is not None], offset
        seen.extend(row["id"] for row in page)
    assert seen == names[::-1]


@pytest.mark.spec("S-35", "R-@G", "R-@H", "Q-17")
def test_verify_counts_r_g_as_listings_do_on_every_corpus_case(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    differing = 0
    for case in CASES:
        store = tmp_path / case.name
        store.mkdir()
        expected: Any = materialize(case, store)
        (store / "expected.json").unlink(missing_ok=True)
        status = main(["verify", "--json", "--path", str(store), "--prefix", expected["prefix"]])
        out, _ = capsys.readouterr()
        if status == 5:
            continue
        files = json.loads(out)["files"]
        counted = sum(f["faults"].get("R-@G", 0) for f in files if f["kind"] == "dead")
        assert counted == expected["damage"]["dead"].get("R-@G", 0), case.name
        differing += counted > 0
    assert differing >= 4  # the R-@G cases were really checked
