"""``Queue.defer``: options apart from arguments, typed against the task (spec/queue.md Q-50..Q-52).

Goal: a task's own ``delay`` keyword reaches it, options come only from ``task.options``,
their values are checked where they are written, and mypy rejects a wrong argument.
Method: a real queue over the recording backend and a driven clock; mypy --strict run in
a subprocess on two small files, one it must accept and one whose every marked line it
must reject.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import deferq
from deferq._runtime.serialize import decode_context
from tests.queue.helpers import START, DrivenClock, RecordingBackend, run, settle, started

REG = deferq.TaskRegistry()
SEEN: list[tuple[str, object]] = []
ROOT = Path(__file__).resolve().parents[2]


@deferq.task(name="defer.remind", registry=REG, inline=True)  # stepped by a driven clock: no pool thread to race
def remind(who: str, delay: int = 0) -> None:
    SEEN.append(("remind", (who, delay)))


class Greet(deferq.Task, name="defer.Greet", registry=REG):
    async def perform(self, who: str, *, delay: str = "none") -> None:
        SEEN.append(("greet", (who, delay)))


def stored(backend: RecordingBackend, task_id: str) -> tuple[str, dict[str, object], int | None]:
    pending = backend.wal[task_id]
    context = decode_context(pending.context)
    return context.task, context.kwargs, pending.publish_at


@pytest.mark.spec("Q-50")
def test_a_task_keyword_named_delay_reaches_the_task() -> None:
    async def main() -> None:
        SEEN.clear()
        backend, clock = RecordingBackend(), DrivenClock()
        queue = await started(backend, clock, registry=REG)
        first = queue.defer(remind, "ann", delay=5)
        second = await queue.adefer(Greet, "bob", delay="soon")
        assert stored(backend, first) == ("defer.remind", {"delay": 5}, None)
        assert stored(backend, second) == ("defer.Greet", {"delay": "soon"}, None)
        await queue.wait_idle()
        assert sorted(SEEN) == [("greet", ("bob", "soon")), ("remind", ("ann", 5))]
        await queue.stop()

    run(main())


@pytest.mark.spec("Q-50", "Q-51", "Q-114")
def test_options_set_the_publish_time_from_seconds_timedelta_or_aware_datetime() -> None:
    async def main() -> None:
        SEEN.clear()
        backend, clock = RecordingBackend(), DrivenClock()
        queue = await started(backend, clock, registry=REG)
        now = int(START)
        in_seconds = queue.defer(remind.options(delay=90.9), "a")
        in_delta = queue.defer(remind.options(delay=datetime.timedelta(minutes=2)), "b")
        at = datetime.datetime.fromtimestamp(now + 300, datetime.timezone(
            datetime.timedelta(hours=5)))
        at_time = await queue.adefer(Greet.options(at=at), "c")
        past = queue.defer(remind.options(at=at - datetime.timedelta(days=1)), "d")
        zero = queue.defer(remind.options(delay=0), "e")
        assert [backend.wal[i].publish_at for i in (in_seconds, in_delta, at_time, past, zero)
                ] == [now + 90, now + 120, now + 300, None, None]
        await queue.wait_idle()
        assert sorted(SEEN) == [("remind", ("d", 0)), ("remind", ("e", 0))]
        await clock.advance(120)
        assert ("remind", ("b", 0)) in SEEN and ("greet", ("c", "none")) not in SEEN
        await clock.advance(180)
        await settle()
        assert ("greet", ("c", "none")) in SEEN and backend.wal == {}
        await queue.stop()

    run(main())


@pytest.mark.spec("Q-51")
@pytest.mark.parametrize(("options", "message"), [
    ({"at": datetime.datetime(2030, 1, 1)}, "at must be a timezone-aware datetime, got the naive"),
    ({"at": 1_900_000_000}, "at must be a timezone-aware datetime, got int"),
    ({"delay": -1}, "delay must be finite, >= 0"),
    ({"delay": datetime.timedelta(seconds=-5)}, "delay must be finite, >= 0"),
    ({"delay": float("nan")}, "delay must be finite"),
    ({"delay": 10**11}, "at most 10000000000 s"),
    ({"delay": True}, "delay must be seconds .* got bool"),
    ({"delay": "60"}, "delay must be seconds .* got str"),
    ({"delay": 1, "at": datetime.datetime.now(datetime.timezone.utc)}, "not both"),
])
def test_bad_options_raise_naming_the_option_and_nothing_is_stored(
        options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        remind.options(**options)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=message):
        Greet.options(**options)  # type: ignore[arg-type]


@pytest.mark.spec("Q-50")
def test_defer_before_start_only_persists_and_enqueue_still_takes_its_options() -> None:
    async def main() -> None:
        backend, clock = RecordingBackend(), DrivenClock()
        queue = deferq.Queue(backend, registry=REG, clock=clock)
        task_id = queue.defer(remind.options(delay=30), "late")
        old = queue.enqueue(remind, "old", delay=30)  # enqueue's own option, documented
        assert backend.wal[task_id].publish_at == backend.wal[old].publish_at == int(START) + 30
        assert stored(backend, old)[1] == {}
        with pytest.raises(deferq.NotATaskError, match="is not a deferq task"):
            queue.defer(print, "x")  # type: ignore[arg-type]
        await queue.start()
        assert queue.delayed == 2
        await queue.stop()

    run(main())


GOOD = '''
from datetime import timedelta
import deferq

@deferq.task(name="typing.send")
async def send(to: str, *, subject: str = "") -> None: ...

class Charge(deferq.Task, name="typing.Charge"):
    def perform(self, order: int, delay: float = 0.0) -> None: ...

async def use(queue: deferq.Queue) -> None:
    ids: list[str] = [
        queue.defer(send, "a@example.com"),
        queue.defer(send, "a@example.com", subject="hi"),
        queue.defer(send.options(delay=timedelta(minutes=5), key="k"), "a@example.com"),
        queue.defer(Charge, 42, delay=1.5),
        queue.defer(Charge.options(delay=60), order=42),
        await queue.adefer(send, to="b@example.com"),
        await queue.adefer(Charge.options(key="o-42"), 42),
    ]
'''

BAD = '''
import deferq

@deferq.task(name="typing.send")
async def send(to: str, *, subject: str = "") -> None: ...

class Charge(deferq.Task, name="typing.Charge"):
    def perform(self, order: int, delay: float = 0.0) -> None: ...

async def use(queue: deferq.Queue) -> None:
    queue.defer(send, 42)  # E
    queue.defer(send, "a", subject=1)  # E
    queue.defer(send, "a", delay=5)  # E
    queue.defer(send)  # E
    queue.defer(send.options(delay=5), 42)  # E
    queue.defer(Charge, "42")  # E
    queue.defer(Charge.options(key="k"), 1, 2, 3)  # E
    await queue.adefer(Charge, order="x")  # E
    queue.defer(print, "x")  # E
    queue.defer(send.options(at=1_900_000_000), "a")  # E
'''


@pytest.mark.slow
@pytest.mark.spec("Q-52")
def test_mypy_checks_defer_against_the_task_signature(tmp_path: Path) -> None:
    (tmp_path / "good.py").write_text(GOOD)
    (tmp_path / "bad.py").write_text(BAD)
    env = dict(os.environ, MYPYPATH=str(ROOT / "src"))
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", "--hide-error-context",
         "--follow-imports=silent", "--cache-dir", str(tmp_path / "cache"), "good.py", "bad.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)
    errors = [line for line in result.stdout.splitlines() if ": error:" in line]
    assert result.returncode in (0, 1), result.stdout + result.stderr  # 2 would be a crash
    assert not [e for e in errors if e.startswith("good.py")], "\n".join(errors)
    expected = {number for number, line in enumerate(BAD.splitlines(), 1) if line.endswith("# E")}
    flagged = {int(m.group(1)) for e in errors if (m := re.match(r"bad\.py:(\d+):", e))}
    assert flagged == expected, "\n".join(errors)
    assert len(expected) == 10
