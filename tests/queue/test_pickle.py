"""Opt-in pickled contexts, sealed with HMAC-SHA256 (Q-18, Q-34).

Goal: the default queue never unpickles; an opted-in queue round-trips
arbitrary picklable arguments, and any context whose tag does not verify (a
changed byte, another key) is refused before unpickling and dead-lettered
with the reason. Method: a recording in-memory backend and a driven clock
(tests/queue/helpers.py); tampering is done on the stored bytes.
"""

from __future__ import annotations

import datetime
import threading

import pytest

import deferq
from deferq import ContextCodec, ContextError, PendingTask, SerializationError
from deferq._runtime.serialize import PICKLE_MAGIC, Context
from tests.queue.helpers import DrivenClock, RecordingBackend, run

REG = deferq.TaskRegistry()
SEEN: list[object] = []
KEY = b"k" * 32


class Stamp(deferq.Task, name="p.Stamp", registry=REG):
    def perform(self, when: datetime.date, tags: frozenset[str]) -> None:
        SEEN.append((when, tags))


def pickled(codec: ContextCodec, *args: object) -> bytes:
    return codec.encode(Context("p.Stamp", args, {}, 0))


@pytest.mark.spec("Q-18")
def test_an_opted_in_queue_runs_picklable_arguments_json_cannot_hold() -> None:
    SEEN.clear()
    codec = ContextCodec(pickle_key=KEY, use_pickle=True)

    async def main() -> None:
        backend = RecordingBackend()
        queue = deferq.Queue(backend, registry=REG, clock=DrivenClock(), codec=codec)
        await queue.start()
        task_id = queue.enqueue(Stamp, datetime.date(2026, 12, 2), frozenset({"a"}))
        assert backend.wal[task_id].context.startswith(PICKLE_MAGIC)
        await queue.wait_idle()
        await queue.stop()

    run(main())
    assert SEEN == [(datetime.date(2026, 12, 2), frozenset({"a"}))]


@pytest.mark.spec("Q-18")
def test_arguments_that_cannot_be_pickled_raise_before_anything_is_stored() -> None:
    async def main() -> None:
        backend = RecordingBackend()
        queue = deferq.Queue(backend, registry=REG, clock=DrivenClock(),
                             codec=ContextCodec(pickle_key=KEY, use_pickle=True))
        await queue.start()
        with pytest.raises(SerializationError, match="cannot be pickled"):
            queue.enqueue(Stamp, threading.Lock(), frozenset())
        assert backend.calls == []
        await queue.stop()

    run(main())


@pytest.mark.spec("Q-18")
def test_codec_options_are_validated() -> None:
    with pytest.raises(ValueError, match="needs a pickle_key"):
        ContextCodec(use_pickle=True)
    with pytest.raises(ValueError, match="at least 16 bytes"):
        ContextCodec(pickle_key=b"short")


def replayed(context: bytes, codec: ContextCodec | None) -> RecordingBackend:
    backend = RecordingBackend([PendingTask("t-1", context, None)])

    async def main() -> None:
        queue = deferq.Queue(backend, registry=REG, clock=DrivenClock(), codec=codec)
        await queue.start()
        await queue.wait_idle()
        await queue.stop()

    run(main())
    return backend


@pytest.mark.spec("Q-18", "Q-9")
def test_the_default_queue_refuses_to_unpickle_and_dead_letters_the_task() -> None:
    data = pickled(ContextCodec(pickle_key=KEY, use_pickle=True), datetime.date.today(), frozenset())
    backend = replayed(data, None)
    dead = backend.dead["t-1"]
    assert "no pickle key is configured" in dead.exception_message
    assert "t-1" not in backend.wal
    assert backend.methods("t-1") == ["add_dead_task:start", "add_dead_task:done", "remove_task"]


@pytest.mark.spec("Q-34")
@pytest.mark.parametrize("tamper", ["flip a pickle byte", "flip a tag digit", "other key",
                                    "drop the separator"])
def test_a_context_whose_tag_does_not_verify_is_refused_and_dead_lettered(tamper: str) -> None:
    codec = ContextCodec(pickle_key=KEY, use_pickle=True)
    data = bytearray(pickled(codec, datetime.date(2026, 1, 1), frozenset()))
    start = len(PICKLE_MAGIC)
    if tamper == "flip a pickle byte":
        data[-2] ^= 0x01
    elif tamper == "flip a tag digit":
        data[start] = ord("0") if data[start] != ord("0") else ord("1")
    elif tamper == "other key":
        data = bytearray(pickled(ContextCodec(pickle_key=b"x" * 32, use_pickle=True),
                                 datetime.date(2026, 1, 1), frozenset()))
    else:
        del data[start + 64]
    with pytest.raises(ContextError, match="failed authentication"):
        codec.decode(bytes(data))
    backend = replayed(bytes(data), codec)
    assert "failed authentication" in backend.dead["t-1"].exception_message
    assert backend.dead["t-1"].exception_class.endswith("UnloadableTaskError")


@pytest.mark.spec("Q-34")
def test_the_envelope_is_magic_hex_tag_colon_pickle() -> None:
    import hashlib
    import hmac
    import pickle

    data = pickled(ContextCodec(pickle_key=KEY, use_pickle=True), 1, 2)
    head, tag, body = data[:len(PICKLE_MAGIC)], data[len(PICKLE_MAGIC):len(PICKLE_MAGIC) + 64], \
        data[len(PICKLE_MAGIC) + 65:]
    assert head == PICKLE_MAGIC and data[len(PICKLE_MAGIC) + 64:len(PICKLE_MAGIC) + 65] == b":"
    assert tag == hmac.new(KEY, PICKLE_MAGIC + body, hashlib.sha256).hexdigest().encode()
    assert pickle.loads(body) == (1, "p.Stamp", (1, 2), {}, 0)


class _Planted:
    """Unpickling this creates a file: what a context sealed by a worker account could do."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (self.marker, "w"))


@pytest.mark.spec("Q-34", "Q-33", "Q-158", "Q-159")
def test_cli_retry_moves_a_pickled_context_unchanged_and_never_unpickles_it(
        tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    import pickle
    from pathlib import Path

    from deferq._cli import main
    from deferq.backends import Disk

    storage = Path(str(tmp_path)) / "storage"
    marker = Path(str(tmp_path)) / "ran-as-operator"
    codec = ContextCodec(pickle_key=KEY, use_pickle=True)
    # A sealed pickle whose loading runs code: anyone with the key (every worker account)
    # can write one. The operator's retry must move it without loading it.
    body = pickle.dumps((1, "p.Stamp", (_Planted(str(marker)),), {}, 7))
    data = codec.encode(Context("p.Stamp", (), {}, 7))
    data = data[:len(PICKLE_MAGIC)] + codec._tag(body) + b":" + body  # noqa: SLF001 - sealing by hand
    with Disk(path=storage, fsync_frequency=0) as disk:
        disk.add_dead_task("old-1", data, RuntimeError("x"), task_class="p.Stamp", attempts=7)
    monkeypatch.setenv("DEFERQ_PICKLE_KEY", KEY.decode())  # a key in reach changes nothing
    assert main(["dead", "retry", "old-1", "--path", str(storage)]) == 0
    assert not marker.exists()
    with Disk(path=storage, fsync_frequency=0) as disk:
        [pending] = disk.pending_tasks()
        assert disk.list_dead_tasks() == []
    assert pending.context == data  # byte for byte: its attempts stay 7
    assert main(["dead", "retry", "old-1", "--pickle-key-env", "X", "--path", str(storage)]) == 2
