"""Prometheus metrics from a queue's hooks (spec/queue.md Q-107, Q-110).

Goal: the counters, the duration histogram and the gauges a scrape shows are the queue's
real numbers. Method: a real ``prometheus_client`` registry (one per test) scraped with
``generate_latest``, the exposition text parsed with the library's own parser; a real queue
over the ``Memory`` backend (it keeps dead tasks) and a ``ManualClock``.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import deferq
from deferq._runtime.serialize import Context, encode_context
from deferq.backends import Disk
from deferq.integrations.prometheus import PrometheusMetrics
from deferq.testing import ManualClock, Memory
from tests.queue.helpers import run, settle

REG = deferq.TaskRegistry()


class Ok(deferq.Task, name="pm.Ok", registry=REG, inline=True):
    def perform(self) -> None:
        pass


class Bad(deferq.Task, name="pm.Bad", registry=REG, inline=True):
    max_retries = 1

    def perform(self) -> None:
        raise RuntimeError("no")

    def retry_interval(self, exception: BaseException, attempt: int) -> object:
        return 10


class Hangs(deferq.Task, name="pm.Hangs", registry=REG):
    async def perform(self) -> None:
        await asyncio.Event().wait()


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a real scrape: (name, sorted labels) -> value."""
    return samples_from(generate_latest(registry).decode())


def samples_from(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


@pytest.mark.spec("Q-107", "Q-110", "Q-223")
def test_a_scrape_shows_the_queues_counts_durations_and_gauges() -> None:
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry, dead_refresh_s=0)

    async def main() -> tuple[dict[tuple[str, tuple[tuple[str, str], ...]], float], str]:
        clock = ManualClock()
        memory = Memory(now=clock.time)
        memory.add_task(encode_context(Context("pm.Ok", (), {}, 0)))  # replayed at start
        queue = deferq.Queue(memory, clock=clock, registry=REG, hooks=[metrics])
        metrics.observe(queue, "web")
        await queue.start()
        queue.defer(Ok)
        queue.defer(Bad)
        queue.defer(Ok.options(delay=3600))
        queue.defer(Hangs)
        await settle()
        mid = samples(registry)
        await clock.advance(10)
        await settle()
        await queue.stop(timeout=0)
        return mid, generate_latest(registry).decode()

    mid, text = run(main())
    # While the queue ran: one execution hanging, one delayed task, one retry waiting.
    assert mid[("deferq_queue_running", (("queue", "web"),))] == 1
    assert mid[("deferq_queue_delayed", (("queue", "web"),))] == 2  # the delayed Ok, Bad's retry
    assert mid[("deferq_queue_backlog", (("queue", "web"),))] == 0
    assert mid[("deferq_dead_tasks", (("queue", "web"),))] == 0
    after = samples_from(text)
    assert after[("deferq_tasks_enqueued_total", (("task", "pm.Ok"),))] == 2
    assert after[("deferq_tasks_enqueued_total", (("task", "pm.Bad"),))] == 1
    assert after[("deferq_tasks_replayed_total", (("source", "start"), ("task", "pm.Ok")))] == 1
    outcome = "deferq_task_outcomes_total"
    assert after[(outcome, (("outcome", "succeeded"), ("task", "pm.Ok")))] == 2
    assert after[(outcome, (("outcome", "retried"), ("task", "pm.Bad")))] == 1
    assert after[(outcome, (("outcome", "dead_lettered"), ("task", "pm.Bad")))] == 1
    assert after[(outcome, (("outcome", "interrupted"), ("task", "pm.Hangs")))] == 1
    count = "deferq_task_duration_seconds_count"
    assert after[(count, (("outcome", "succeeded"), ("task", "pm.Ok")))] == 2
    assert after[(count, (("outcome", "dead_lettered"), ("task", "pm.Bad")))] == 1
    assert after[("deferq_task_duration_seconds_sum",
                  (("outcome", "succeeded"), ("task", "pm.Ok")))] >= 0
    assert after[("deferq_dead_tasks", (("queue", "web"),))] == 1
    # The exposition text itself, as a Prometheus server reads it.
    lines = text.splitlines()
    assert 'deferq_task_outcomes_total{outcome="succeeded",task="pm.Ok"} 2.0' in lines
    assert 'deferq_queue_running{queue="web"} 0.0' in lines  # the hanging one was cancelled


@pytest.mark.spec("Q-107", "Q-223")
def test_a_cancel_is_counted_without_a_duration() -> None:
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry)

    async def main() -> None:
        queue = deferq.Queue(Memory(), registry=REG, hooks=[metrics])
        await queue.start()
        assert await queue.cancel(queue.defer(Ok.options(delay=60)))
        await queue.stop()

    run(main())
    after = samples(registry)
    assert after[("deferq_task_outcomes_total", (("outcome", "cancelled"), ("task", "pm.Ok")))] == 1
    assert ("deferq_task_duration_seconds_count",
            (("outcome", "cancelled"), ("task", "pm.Ok"))) not in after


@pytest.mark.spec("Q-110")
def test_the_dead_task_count_is_read_at_most_once_per_refresh() -> None:
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry, dead_refresh_s=3600)
    memory = Memory()
    queue = deferq.Queue(memory, registry=REG, hooks=[metrics])
    metrics.observe(queue)
    assert samples(registry)[("deferq_dead_tasks", (("queue", "default"),))] == 0
    memory.add_dead_task("t1", b"{}", RuntimeError("x"), task_class="pm.Bad", attempts=1)
    assert samples(registry)[("deferq_dead_tasks", (("queue", "default"),))] == 0  # cached
    fresh = CollectorRegistry()
    fresh_metrics = PrometheusMetrics(fresh, dead_refresh_s=0)
    fresh_metrics.observe(queue)
    assert samples(fresh)[("deferq_dead_tasks", (("queue", "default"),))] == 1


@pytest.mark.spec("Q-110", "Q-225")
def test_a_closed_backend_leaves_out_the_dead_sample_without_failing_the_scrape(
        storage: Path, caplog: pytest.LogCaptureFixture) -> None:
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry, dead_refresh_s=0)
    with Disk(path=storage) as disk:
        metrics.observe(deferq.Queue(disk, registry=REG, hooks=[metrics]), "closed")
    with caplog.at_level(logging.WARNING, logger="deferq.hooks"):
        after = samples(registry)
    assert after[("deferq_queue_running", (("queue", "closed"),))] == 0
    assert ("deferq_dead_tasks", (("queue", "closed"),)) not in after
    assert any("cannot count the dead tasks of queue 'closed' (StorageClosedError"
               in r.getMessage() for r in caplog.records)
