"""Every integer a record stores fits a signed 64-bit integer (spec/format.md F-19).

Goal: a writer refuses a larger one at the call, naming it, and a reader treats a record
holding one as a record that does not parse, as the recovery table says. Method: real
``Disk`` and ``Memory`` calls, and hand-framed records read back by a real ``Disk``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from deferq._core.deadcodec import decode_dead_line, decode_dead_payload, encode_dead
from deferq._core.frame import BadLine, frame
from deferq._core.limits import INT_FIELD_MAX
from deferq._core.names import wal_file_name
from deferq._core.types import DeadTask
from deferq._core.walcodec import WalAdd, decode_wal_line, encode_add
from deferq.backends import Disk
from deferq.backends._deadtask import dead_task_for
from deferq.testing import Memory


@pytest.mark.spec("F-19", "F-55")
@pytest.mark.parametrize("backend", ["disk", "memory"])
def test_add_dead_task_refuses_attempts_beyond_64_bits_and_stores_the_largest(
        tmp_path: Path, backend: str) -> None:
    store: Disk | Memory = Disk(path=tmp_path) if backend == "disk" else Memory()
    with store:
        for attempts in (INT_FIELD_MAX + 1, 10**4000):
            with pytest.raises(ValueError, match="^attempts must be at most 9223372036854775807"):
                store.add_dead_task("a", b"", RuntimeError("x"), task_class="T",
                                    attempts=attempts)
        assert store.list_dead_tasks() == []
        store.add_dead_task("a", b"", RuntimeError("x"), task_class="T", attempts=INT_FIELD_MAX,
                            enqueued_at=INT_FIELD_MAX)
        [task] = store.list_dead_tasks()
        assert (task.attempts, task.enqueued_at) == (INT_FIELD_MAX, INT_FIELD_MAX)


@pytest.mark.spec("F-55")
def test_a_clock_beyond_64_bits_is_refused_when_the_dead_task_is_built() -> None:
    with pytest.raises(ValueError, match="times must be at most"):
        dead_task_for("a", b"", RuntimeError("x"), "T", 1, INT_FIELD_MAX + 1)


def _dead(**changes: int) -> DeadTask:
    fields: dict[str, int] = {"attempts": 1, "enqueued_at": 1, "failed_at": 1, **changes}
    return DeadTask(id="a", task_class="T", exception_class="E", exception_message="m",
                    backtrace=(), context=b"c", **fields)


@pytest.mark.spec("F-19", "R-@D", "R-@G", "F-56")
def test_readers_treat_an_integer_beyond_64_bits_as_a_record_that_does_not_parse(
        tmp_path: Path) -> None:
    assert decode_wal_line(encode_add("a", INT_FIELD_MAX, b"x")[:-1]) == WalAdd(
        "a", INT_FIELD_MAX, b"x")
    for when in (INT_FIELD_MAX + 1, 2**64, 10**19 * 9):
        assert isinstance(decode_wal_line(frame(b"add:a:%d:eA==" % when)[:-1]), BadLine)
    for field in ("attempts", "enqueued_at", "failed_at"):
        # encode_dead's contract wants a valid task: the writer here is a foreign one.
        line = encode_dead(_dead(**{field: INT_FIELD_MAX + 1}))
        framed = decode_dead_line(line[:-1])
        assert not isinstance(framed, BadLine)
        assert isinstance(decode_dead_payload(framed), BadLine), field
    # A real Disk adopting such a WAL file: the record is damage (R-@D), the next one is read.
    tmp_path.mkdir(exist_ok=True)
    name = wal_file_name("deferred-", "20260807", 4242, 1)
    (tmp_path / name).write_bytes(frame(b"add:big:%d:eA==" % (INT_FIELD_MAX + 1))
                                  + encode_add("ok", INT_FIELD_MAX, b"x"))
    with Disk(path=tmp_path) as disk:
        assert [(t.task_id, t.publish_at) for t in disk.pending_tasks()] == [
            ("ok", INT_FIELD_MAX)]
