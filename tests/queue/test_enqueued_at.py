"""When a dead task was first enqueued (spec/queue.md Q-65, spec/format.md F-17, spec/api.md C-23).

Goal: a dead task's ``enqueued_at`` is the time its task was first enqueued, never the id's
seed, and it is kept across retries, a restart and an operator's retry; records written
before it keep decoding. Method: real queues on a real ``Disk`` and on ``Memory`` with a
manual clock, the real CLI for ``dead retry``, and the codec on hand-written records.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import deferq
from deferq import ContextCodec, ContextError
from deferq._cli import main
from deferq._core.limits import INT_FIELD_MAX
from deferq._core.taskid import id_seed
from deferq._runtime.serialize import Context, decode_context, encode_context, reset_attempts
from deferq.backends import Disk
from deferq.testing import ManualClock, Memory, drain
from tests.queue.helpers import run

REG = deferq.TaskRegistry()
T0 = 1_900_000_000


@deferq.task(name="e.Flaky", max_retries=2, registry=REG)
async def flaky(order: int) -> None:
    raise RuntimeError(f"order {order} failed")


@pytest.mark.spec("F-51", "Q-200")
def test_a_dead_task_keeps_the_time_it_was_first_enqueued_across_retries() -> None:
    async def main_() -> deferq.DeadTask:
        clock = ManualClock(T0)
        backend = Memory(now=clock.time)
        queue = deferq.Queue(backend, clock=clock, registry=REG)
        await queue.start()
        task_id = queue.enqueue(flaky, 7)
        await drain(queue)  # three executions, with backoff delays between them
        [dead] = backend.list_dead_tasks()
        assert dead.id == task_id and dead.attempts == 3
        await queue.stop()
        return dead

    dead = run(main_())
    assert dead.enqueued_at == T0
    # Before this change it was the id's seed, one second ahead of the clock it was taken
    # from; the backoff puts the failure well after the enqueue.
    assert dead.failed_at > dead.enqueued_at
    assert decode_context(dead.context).enqueued_at == T0


@pytest.mark.spec("Q-65", "F-51", "Q-200")
def test_the_enqueue_time_survives_a_restart_and_an_operators_retry(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    storage = tmp_path / "storage"

    async def enqueue_then_stop() -> str:
        with Disk(path=storage, fsync_frequency=0) as disk:
            queue = deferq.Queue(disk, clock=ManualClock(T0), registry=REG)
            return queue.enqueue(flaky, 1)  # persisted only: never started

    async def replay_and_run(now: float) -> None:
        with Disk(path=storage, fsync_frequency=0) as disk:
            clock = ManualClock(now)
            queue = deferq.Queue(disk, clock=clock, registry=REG)
            await queue.start()  # replays what the earlier process left
            await drain(queue)
            await queue.stop()

    first_id = run(enqueue_then_stop())
    run(replay_and_run(T0 + 5000))
    with Disk(path=storage) as disk:
        [dead] = disk.list_dead_tasks()
    assert (dead.id, dead.enqueued_at) == (first_id, T0)

    # The operators' retry moves the stored context, which keeps the time (Q-33).
    assert main(["dead", "retry", first_id, "--path", str(storage)]) == 0
    capsys.readouterr()
    run(replay_and_run(T0 + 90000))
    with Disk(path=storage) as disk:
        [again] = disk.list_dead_tasks()
    assert again.id != first_id and again.enqueued_at == T0 and again.attempts == 3


@pytest.mark.spec("Q-65", "Q-201")
def test_the_record_carries_the_time_after_attempts_and_older_records_still_decode() -> None:
    record = Context("t", (1,), {}, 2, None, T0)
    data = encode_context(record)
    assert data == b'{"v":1,"task":"t","args":[1],"kwargs":{},"attempts":2,"enqueued_at":%d}' % T0
    assert decode_context(data) == record
    assert decode_context(encode_context(record.with_attempts(5))).enqueued_at == T0
    assert json.loads(reset_attempts(data)) == {"v": 1, "task": "t", "args": [1], "kwargs": {},
                                               "attempts": 0, "enqueued_at": T0}
    # A record of the previous version: no time, and its bytes unchanged.
    old = b'{"v":1,"task":"t","args":[1],"kwargs":{},"attempts":2}'
    assert encode_context(Context("t", (1,), {}, 2)) == old
    assert decode_context(old).enqueued_at is None
    # The key comes first, and the slow path and the pickle codec agree.
    keyed = Context("t", ([1],), {"a": {"b": 2}}, 0, "k", T0)
    assert list(json.loads(encode_context(keyed)))[-2:] == ["key", "enqueued_at"]
    assert decode_context(encode_context(keyed)) == keyed
    sealed = ContextCodec(pickle_key=b"p" * 16, use_pickle=True)
    for value in (keyed, keyed._replace(key=None), keyed._replace(enqueued_at=None)):
        assert sealed.decode(sealed.encode(value)) == value


@pytest.mark.spec("Q-201")
@pytest.mark.parametrize("value", [-1, True, 1.5, "1", None, INT_FIELD_MAX + 1])
def test_a_record_with_a_bad_enqueue_time_is_refused_naming_the_field(value: object) -> None:
    data = json.dumps({"v": 1, "task": "t", "args": [], "kwargs": {}, "attempts": 0,
                       "enqueued_at": value}).encode()
    with pytest.raises(ContextError, match="context field 'enqueued_at'"):
        decode_context(data)


@pytest.mark.spec("C-23", "F-51")
def test_add_dead_task_stores_the_given_time_else_the_seed(tmp_path: Path) -> None:
    with Disk(path=tmp_path) as disk:
        generated = disk.add_task(b"x")
        assert generated is not None
        disk.add_dead_task(generated, b"x", RuntimeError("a"), task_class="T", attempts=1)
        disk.add_dead_task("caller-id", b"x", RuntimeError("b"), task_class="T", attempts=1,
                           enqueued_at=T0)
        found = disk.find_dead_task(generated)
        assert found is not None and found.enqueued_at == id_seed(generated) > 0
        found = disk.find_dead_task("caller-id")
        assert found is not None and found.enqueued_at == T0


@pytest.mark.spec("C-23")
@pytest.mark.parametrize("value", [-1, True, 1.0, "1", INT_FIELD_MAX + 1])
@pytest.mark.parametrize("backend", ["disk", "memory"])
def test_add_dead_task_refuses_a_bad_enqueue_time_naming_it(tmp_path: Path, value: object,
                                                           backend: str) -> None:
    store: Disk | Memory = Disk(path=tmp_path) if backend == "disk" else Memory()
    with store:
        with pytest.raises(ValueError, match="enqueued_at"):
            store.add_dead_task("a", b"", RuntimeError("x"), task_class="T", attempts=0,
                                enqueued_at=value)  # type: ignore[arg-type]
        assert store.list_dead_tasks() == []
