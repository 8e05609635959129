"""A task's metadata: string keys and values stored with it (spec/queue.md Q-66, Q-67).

Goal: metadata such as a W3C ``traceparent`` is checked at enqueue, survives retries, a
restart and an operator's retry, shows on the dead task and in ``deferq dead show`` (text
and JSON), and records without it keep their bytes. Method: a real queue on a real
``Disk`` restarted in between, the real CLI, and the codecs on hand-written records.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import deferq
from deferq import ContextCodec, ContextError
from deferq._cli import main
from deferq._core.limits import META_BYTES_MAX, META_ITEMS_MAX
from deferq._core.types import DeadTask
from deferq._runtime.serialize import Context, decode_context, encode_context, reset_attempts
from deferq.backends import Disk
from deferq.testing import ManualClock, Memory, drain
from tests.queue.helpers import run

REG = deferq.TaskRegistry()
T0 = 1_900_000_000
TRACE = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
         "tenant": "acme\x1b[31m"}


@deferq.task(name="m.Fails", max_retries=1, registry=REG)
async def fails(order: int) -> None:
    raise RuntimeError(f"order {order} failed")


def enqueue_with_meta(queue: deferq.Queue, meta: object) -> str:
    """Metadata given as the task's option (Q-66), checked when ``options`` is called."""
    return queue.defer(fails.options(meta=meta), 1)  # type: ignore[arg-type]


@pytest.mark.spec("Q-67", "Q-203")
def test_metadata_survives_a_restart_retries_and_an_operators_retry(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    storage = tmp_path / "storage"

    async def enqueue_only() -> str:
        with Disk(path=storage, fsync_frequency=0) as disk:
            return enqueue_with_meta(deferq.Queue(disk, clock=ManualClock(T0), registry=REG),
                                     TRACE)

    async def replay_and_run() -> None:
        with Disk(path=storage, fsync_frequency=0) as disk:
            queue = deferq.Queue(disk, clock=ManualClock(T0 + 60), registry=REG)
            await queue.start()
            await drain(queue)  # two executions, then the give-up
            await queue.stop()

    first = run(enqueue_only())
    run(replay_and_run())
    with Disk(path=storage) as disk:
        [dead] = disk.list_dead_tasks()
    assert dead.id == first and dead.attempts == 2 and dead.meta == TRACE

    assert main(["dead", "show", first, "--json", "--path", str(storage)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["meta"] == TRACE and shown["context"]["json"]["meta"] == TRACE
    assert main(["dead", "show", first, "--path", str(storage)]) == 0
    text = capsys.readouterr().out
    assert "  traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\n" in text
    assert "  tenant: acme\\x1b[31m\n" in text  # escaped for a terminal

    assert main(["dead", "retry", first, "--path", str(storage)]) == 0
    capsys.readouterr()
    run(replay_and_run())
    with Disk(path=storage) as disk:
        [again] = disk.list_dead_tasks()
    assert again.id != first and again.meta == TRACE


@pytest.mark.spec("Q-66")
@pytest.mark.parametrize(("meta", "message"), [
    (["traceparent"], "must be a mapping"),
    ({"": "x"}, "keys must be non-empty str"),
    ({1: "x"}, "keys must be non-empty str"),
    ({"a": 1}, "values must be str"),
    ({"a": "\ud800"}, "lone surrogate"),
    ({f"k{i}": "" for i in range(META_ITEMS_MAX + 1)}, f"at most {META_ITEMS_MAX}"),
    ({"k": "x" * META_BYTES_MAX}, f"at most {META_BYTES_MAX}"),
])
def test_bad_metadata_is_refused_at_enqueue_naming_the_problem(meta: object,
                                                               message: str) -> None:
    async def main_() -> None:
        backend = Memory()
        queue = deferq.Queue(backend, registry=REG)
        with pytest.raises(ValueError, match=f"^meta .*{message}"):
            enqueue_with_meta(queue, meta)
        assert backend.pending_tasks() == []

    run(main_())


@pytest.mark.spec("Q-66", "Q-202")
def test_metadata_at_its_limits_is_stored_and_empty_metadata_stores_nothing() -> None:
    async def main_() -> None:
        backend = Memory()
        queue = deferq.Queue(backend, clock=ManualClock(T0), registry=REG)
        full = {f"k{i:02d}": "v" * (META_BYTES_MAX // META_ITEMS_MAX - 3)
                for i in range(META_ITEMS_MAX)}
        enqueue_with_meta(queue, full)
        enqueue_with_meta(queue, {})
        first, second = backend.pending_tasks()
        assert decode_context(first.context).meta == full
        assert b'"meta"' not in second.context

    run(main_())


@pytest.mark.spec("Q-202")
def test_the_record_carries_metadata_last_and_records_without_it_keep_their_bytes() -> None:
    record = Context("t", (1,), {}, 2, None, T0, {"a": "b"})
    data = encode_context(record)
    assert data == b'{"v":1,"task":"t","args":[1],"kwargs":{},"attempts":2,' \
                   b'"enqueued_at":%d,"meta":{"a":"b"}}' % T0
    assert decode_context(data) == record
    assert decode_context(encode_context(record.with_attempts(4))).meta == {"a": "b"}
    assert decode_context(reset_attempts(data)) == record.with_attempts(0)
    plain = b'{"v":1,"task":"t","args":[1],"kwargs":{},"attempts":2}'
    assert encode_context(Context("t", (1,), {}, 2)) == plain
    assert decode_context(plain).meta is None
    sealed = ContextCodec(pickle_key=b"p" * 16, use_pickle=True)
    for value in (record, record._replace(enqueued_at=None), record._replace(key="k")):
        assert sealed.decode(sealed.encode(value)) == value


@pytest.mark.spec("Q-204")
@pytest.mark.parametrize("meta", [[], {"a": 1}, {"": "b"}, "x", None])
def test_a_record_with_bad_metadata_is_refused_naming_the_field(meta: object) -> None:
    data = json.dumps({"v": 1, "task": "t", "args": [], "kwargs": {}, "attempts": 0,
                       "meta": meta}).encode()
    with pytest.raises(ContextError, match="context field 'meta'"):
        decode_context(data)


@pytest.mark.spec("Q-205")
@pytest.mark.parametrize(("context", "meta"), [
    (b'{"v":1,"task":"t","args":[],"kwargs":{},"attempts":0,"meta":{"a":"b"}}', {"a": "b"}),
    (b'{"v":1,"task":"t","args":[],"kwargs":{},"attempts":0}', {}),
    (b'{"v":1,"meta":{"a":1}}', {}),                 # not metadata: shown as none
    (b'{"v":9,"meta":{"a":"b"}}', {}),               # another record version
    (b'deferq-pickle-1:' + b'0' * 64 + b':"meta"', {}),  # pickled: never opened
    (b'\xff"meta"', {}),
])
def test_a_dead_tasks_metadata_is_read_from_its_context_and_never_fails(
        context: bytes, meta: dict[str, str]) -> None:
    dead = DeadTask(id="a", task_class="t", attempts=1, enqueued_at=0, failed_at=0,
                    exception_class="E", exception_message="", backtrace=(), context=context)
    assert dead.meta == meta
