"""``deferq verify``: the read-only damage scan of a storage directory (Q-17).

Goal: verify reports records and every kind of damage per file, exits 4 on
damage and 0 when clean, and changes nothing. Method: build storage with a
real Disk, damage it by hand, run the CLI in-process and compare the files'
bytes before and after.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deferq._cli import main
from deferq._core.frame import frame
from deferq._core.walcodec import encode_rem
from deferq.backends import Disk
from tests.fsenv import append_to_wal, wal_size


def files(storage: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(storage.iterdir())}


def populate(storage: Path) -> str:
    with Disk(path=storage, fsync_frequency=0) as disk:
        keep = disk.add_task(b"ctx")
        disk.remove_task(disk.add_task(b"done"))
        disk.add_dead_task("dead-1", b"c", RuntimeError("x"), task_class="T", attempts=1)
        return keep


@pytest.mark.spec("Q-17", "W-25", "W-60")
def test_verify_of_clean_storage_exits_zero_and_changes_nothing(
        storage: Path, capsys: pytest.CaptureFixture[str]) -> None:
    populate(storage)
    before = files(storage)
    assert main(["verify", "--path", str(storage)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == "verify: files=2 records=4 damaged_files=0"
    (wal,) = [p for p in storage.iterdir() if p.name.startswith("deferred-0-")]
    records, reserved = wal_size(wal), wal.stat().st_size - wal_size(wal)
    assert (f"wal  {wal.name}: {records} bytes (+{reserved} reserved), 3 records, damage: none"
            in out.splitlines())  # the records' size, not the reserved space (W-25)
    assert files(storage) == before


@pytest.mark.spec("Q-17", "Q-132", "R-@B", "R-@C", "R-@F", "R-@G", "R-@L")
def test_verify_counts_each_kind_of_damage_and_exits_four(
        storage: Path, capsys: pytest.CaptureFixture[str]) -> None:
    populate(storage)
    [wal] = [p for p in storage.iterdir() if p.name.startswith("deferred-0-")]
    append_to_wal(wal, b"garbage line\n"  # R-@B
                  + b"00000000" + encode_rem("x")[8:]  # R-@C
                  + b"0123")  # R-@F, 4 bytes (the reserved zeros after it are R-@L: no damage)
    dead = storage / "deferred-dead_tasks-0"
    with dead.open("ab") as f:
        f.write(frame(b'dead_task:bad:{"id":"bad"}'))  # R-@G
    before = files(storage)
    assert main(["verify", "--path", str(storage), "--json"]) == 4
    out = capsys.readouterr().out
    document = json.loads(out)  # one document, the summary inside it
    assert document["summary"] == {"files": 2, "records": 4, "damaged_files": 2}
    by_kind = {r["kind"]: r for r in document["files"]}
    assert by_kind["wal"]["faults"] == {"R-@B": 1, "R-@C": 1, "R-@F": 1}
    assert by_kind["wal"]["torn_tail_bytes"] == 4
    assert by_kind["wal"]["records"] == 3
    wal_file = storage / by_kind["wal"]["file"]
    assert by_kind["wal"]["reserved_bytes"] == wal_file.stat().st_size - wal_size(wal_file) > 0
    assert by_kind["dead"]["reserved_bytes"] == 0
    assert by_kind["dead"]["faults"] == {"R-@G": 1} and by_kind["dead"]["records"] == 1
    assert main(["verify", "--path", str(storage)]) == 4
    assert capsys.readouterr().out.splitlines()[-1] == "verify: files=2 records=4 damaged_files=2"
    assert files(storage) == before


@pytest.mark.spec("Q-17", "Q-25")
def test_verify_of_a_missing_directory_is_an_error_and_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    assert main(["verify", "--path", str(missing)]) == 5  # no store there
    assert not missing.exists()


@pytest.mark.spec("Q-24", "Q-117")
def test_storage_options_work_before_and_after_the_subcommand(
        storage: Path, capsys: pytest.CaptureFixture[str]) -> None:
    populate(storage)
    assert main(["--path", str(storage), "dead", "list"]) == 0
    before = capsys.readouterr().out
    assert main(["dead", "list", "--path", str(storage)]) == 0
    assert capsys.readouterr().out == before
    assert "dead-1" in before
    # A prefix with no store there is refused, never verified as an empty store.
    assert main(["--path", str(storage), "--prefix", "other-", "verify"]) == 5
    assert capsys.readouterr().out == ""
