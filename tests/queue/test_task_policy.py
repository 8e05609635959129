"""Task definitions, registry, retry policy and the context record (Q-1..Q-6).

Goal: the retry-policy edge cases of the reference (reference-behaviour.md 3.3)
and the strict JSON context hold exactly. Method: call the pure pieces
directly (``next_retry_in``, ``default_backoff``, ``encode_context``) with a
seeded or scripted random source; no queue, no loop.
"""

from __future__ import annotations

import logging
import random

import pytest

import deferq
from deferq._runtime.serialize import Context, ContextError, decode_context, encode_context
from deferq._runtime.task import check_max_retries, default_backoff, next_retry_in

LOCAL = deferq.TaskRegistry()


class Plain(deferq.Task, name="tests.Plain", registry=LOCAL):
    def perform(self, *args: object, **kwargs: object) -> None:
        return None


class FixedRng(random.Random):
    """randint always returns ``value``."""

    def __init__(self, value: int) -> None:
        super().__init__(0)
        self.value = value
        self.calls: list[tuple[int, int]] = []

    def randint(self, a: int, b: int) -> int:
        self.calls.append((a, b))
        return self.value


@pytest.mark.spec("Q-2")
@pytest.mark.parametrize("value, expected", [(0, 0), (3, 3), ("3", 3), (2.9, 2), (20, 20)])
def test_max_retries_strict_conversion(value: object, expected: int) -> None:
    assert check_max_retries(value) == expected


@pytest.mark.spec("Q-2")
@pytest.mark.parametrize("value", [-1, "x", None, "-3", "2.5", True, float("nan"), [], "", -0.5 - 1])
def test_max_retries_rejects(value: object) -> None:
    with pytest.raises(ValueError, match="^max_retries should be a valid non-negative integer$"):
        check_max_retries(value)


@pytest.mark.spec("Q-2")
def test_max_retries_validated_at_class_definition() -> None:
    with pytest.raises(ValueError, match="max_retries should be a valid non-negative integer"):
        class Bad(deferq.Task, registry=deferq.TaskRegistry()):
            max_retries = -1
    assert Plain.max_retries == 20

    class Text(deferq.Task, registry=deferq.TaskRegistry()):
        max_retries = "3"  # type: ignore[assignment]
    assert getattr(Text, "max_retries") == 3


@pytest.mark.spec("Q-4")
@pytest.mark.parametrize("attempt, low, high", [(0, 10, 10), (1, 11, 25), (2, 26, 54),
                                                (3, 91, 133), (4, 266, 322)])
def test_default_backoff_ranges(attempt: int, low: int, high: int) -> None:
    assert default_backoff(attempt, FixedRng(0)) == low
    assert default_backoff(attempt, FixedRng(14)) == high
    rng = random.Random(1)
    assert all(low <= default_backoff(attempt, rng) <= high for _ in range(200))


@pytest.mark.spec("Q-3")
def test_default_policy_gives_up_at_attempt_21() -> None:
    task = Plain()
    task.rng = FixedRng(0)
    for attempts in range(1, 21):
        assert next_retry_in(task, RuntimeError(), attempts) == attempts ** 4 + 10
    assert next_retry_in(task, RuntimeError(), 21) is None


@pytest.mark.spec("Q-3")
def test_max_retries_3_allows_4_executions() -> None:
    class Three(deferq.Task, registry=deferq.TaskRegistry()):
        max_retries = 3

    decisions = [next_retry_in(Three(), RuntimeError(), n) for n in (1, 2, 3, 4)]
    assert [d is not None for d in decisions] == [True, True, True, False]


class Scripted(deferq.Task, registry=LOCAL):
    answer: object = None

    def retry_interval(self, exception: BaseException, attempt: int) -> object:
        return self.answer


@pytest.mark.spec("Q-3", "Q-135")
@pytest.mark.parametrize("answer, expected", [(0, 0), (-5, -5), (2.5, 2.5), (7, 7),
                                              (None, None), (False, None)])
def test_retry_interval_values(answer: object, expected: object) -> None:
    task = Scripted()
    task.answer = answer
    assert next_retry_in(task, RuntimeError(), 1) == expected


@pytest.mark.spec("Q-3", "Q-136")
@pytest.mark.parametrize("answer", ["10", [1], True, float("nan")])
def test_retry_interval_non_number_warns_and_uses_default(
        answer: object, caplog: pytest.LogCaptureFixture) -> None:
    task = Scripted()
    task.answer = answer
    task.rng = FixedRng(1)
    with caplog.at_level(logging.WARNING, logger="deferq.queue"):
        assert next_retry_in(task, RuntimeError(), 2) == 2 ** 4 + 10 + 1 * 2
    assert "retry_interval returned" in caplog.text
    assert "falling back to default backoff" in caplog.text


@pytest.mark.spec("Q-3")
def test_retry_interval_gets_exception_and_attempt() -> None:
    seen: list[tuple[str, int]] = []

    class Spy(deferq.Task, registry=deferq.TaskRegistry()):
        def retry_interval(self, exception: BaseException, attempt: int) -> object:
            seen.append((str(exception), attempt))
            return 1

    next_retry_in(Spy(), ValueError("boom"), 4)
    assert seen == [("boom", 4)]


@pytest.mark.spec("Q-1")
def test_registry_names_and_collisions() -> None:
    registry = deferq.TaskRegistry()

    class A(deferq.Task, registry=registry):
        pass

    assert A.task_name == f"{__name__}.test_registry_names_and_collisions.<locals>.A"
    assert registry.get(A.task_name) is A

    class B(deferq.Task, name="shared", registry=registry):
        pass

    with pytest.raises(ValueError, match="already registered"):
        class C(deferq.Task, name="shared", registry=registry):
            pass
    assert registry.get("shared") is B
    assert registry.get("os.system") is None  # never resolved by import


@pytest.mark.spec("Q-1")
def test_task_decorator() -> None:
    registry = deferq.TaskRegistry()

    @deferq.task(name="fn.add", max_retries=2, registry=registry)
    def add(a: int, b: int) -> int:
        return a + b

    assert add(2, 3) == 5
    cls = add.task_class
    assert registry.get("fn.add") is cls and cls.max_retries == 2
    assert getattr(cls(), "perform")(1, 2) == 3

    @deferq.task(registry=registry)
    async def later() -> None:
        return None

    assert later.task_class.task_name.endswith("test_task_decorator.<locals>.later")
    with pytest.raises(ValueError, match="max_retries"):
        deferq.task(max_retries=-2, registry=registry)(lambda: None)


@pytest.mark.spec("Q-5")
def test_context_round_trip_is_one_line() -> None:
    context = Context("t", ("a\nb", 1, 2.5, None, True, [1, {"k": "é"}]), {"x": {"y": []}}, 3)
    data = encode_context(context)
    assert b"\n" not in data
    assert data.startswith(b'{"v":1,"task":"t","args":')
    assert decode_context(data) == context


@pytest.mark.spec("Q-6")
@pytest.mark.parametrize("bad", [(1, 2), {1, 2}, object(), float("nan"), float("inf"),
                                 {1: "int key"}, b"bytes", "\ud800"])
def test_arguments_that_do_not_round_trip_are_rejected(bad: object) -> None:
    with pytest.raises(deferq.SerializationError):
        encode_context(Context("t", (bad,), {}, 0))
    with pytest.raises(TypeError):  # SerializationError is a TypeError
        encode_context(Context("t", (), {"k": bad}, 0))


@pytest.mark.spec("Q-5")
@pytest.mark.parametrize("data, reason", [
    (b"not json", "not valid JSON"),
    (b"\xff\xfe", "not UTF-8"),
    (b"[1]", "not an object"),
    (b'{"v":2,"task":"t","args":[],"kwargs":{},"attempts":0}', "version"),
    (b'{"v":1,"args":[],"kwargs":{},"attempts":0}', "no task name"),
    (b'{"v":1,"task":"t","args":{},"kwargs":{},"attempts":0}', "'args'"),
    (b'{"v":1,"task":"t","args":[],"kwargs":[],"attempts":0}', "'kwargs'"),
    (b'{"v":1,"task":"t","args":[],"kwargs":{},"attempts":-1}', "'attempts'"),
    (b'{"v":1,"task":"t","args":[],"kwargs":{},"attempts":0,"x":1}', "unknown field"),
    (b"[" * 100000, "nested too deeply"),
])
def test_decode_reasons(data: bytes, reason: str) -> None:
    with pytest.raises(ContextError, match=reason):
        decode_context(data)
