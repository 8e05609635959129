"""Prometheus metrics of a queue, from its lifecycle hooks (spec/queue.md Q-107, Q-108, Q-110).

Rules:
- Imported only when used: ``import deferq`` never imports ``prometheus_client``; importing
  this module without it raises ``ImportError`` naming the extra to install (Q-108).
- Counters and the duration histogram are fed by hooks (``Queue(..., hooks=[metrics])``);
  the gauges are read from the queues given to ``observe`` when the registry is scraped,
  so a gauge is never stale and costs nothing between scrapes (Q-110). The dead-task count
  reads the dead-task store (a stepped read, Q-90), at most once per ``dead_refresh_s``;
  when it cannot (a closed backend) the sample is left out and a warning logged.

Metric names (with the default ``namespace="deferq"``), labels in braces:

- ``deferq_tasks_enqueued_total{task}``, ``deferq_tasks_replayed_total{task,source}``
- ``deferq_task_outcomes_total{task,outcome}``: outcome ``succeeded``, ``retried``,
  ``dead_lettered``, ``cancelled`` or ``interrupted``
- ``deferq_task_duration_seconds{task,outcome}``: a histogram of executions by outcome
- ``deferq_queue_backlog{queue}``, ``deferq_queue_running{queue}``,
  ``deferq_queue_delayed{queue}``, ``deferq_dead_tasks{queue}``: gauges
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Final

from deferq import (
    Hooks,
    Queue,
    TaskCancelled,
    TaskDeadLettered,
    TaskEnqueued,
    TaskInterrupted,
    TaskReplayed,
    TaskRetryScheduled,
    TaskSucceeded,
)

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
    from prometheus_client.core import GaugeMetricFamily, Metric
    from prometheus_client.registry import Collector
except ImportError as missing:
    raise ImportError("deferq.integrations.prometheus needs prometheus-client: "
                      "pip install 'deferq[prometheus]'") from missing

# Executions of background tasks: from a millisecond to ten minutes.
DEFAULT_BUCKETS: Final = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                          30.0, 60.0, 120.0, 300.0, 600.0)
DEFAULT_DEAD_REFRESH_S: Final = 60.0

log = logging.getLogger("deferq.hooks")


class PrometheusMetrics(Hooks):
    """Hooks that count a queue's tasks and time its executions, and a collector of gauges.

    ``metrics = PrometheusMetrics(); queue = Queue(disk, hooks=[metrics]);
    metrics.observe(queue)``. One instance may serve several queues (``observe`` each with
    its own ``name``).
    """

    def __init__(self, registry: CollectorRegistry | None = None, *, namespace: str = "deferq",
                 buckets: Sequence[float] = DEFAULT_BUCKETS,
                 dead_refresh_s: float = DEFAULT_DEAD_REFRESH_S) -> None:
        reg = REGISTRY if registry is None else registry
        self.enqueued = Counter("tasks_enqueued", "Tasks stored by enqueue or defer.",
                                ["task"], namespace=namespace, registry=reg)
        self.replayed = Counter("tasks_replayed", "Stored tasks taken up at start, adopted "
                                "or claimed.", ["task", "source"], namespace=namespace,
                                registry=reg)
        self.outcomes = Counter("task_outcomes", "How executions (and tasks that could not "
                                "be loaded) ended.", ["task", "outcome"], namespace=namespace,
                                registry=reg)
        self.duration = Histogram("task_duration_seconds", "Seconds from the start of perform "
                                  "to its end.", ["task", "outcome"], namespace=namespace,
                                  buckets=tuple(buckets), registry=reg)
        self._gauges = _QueueGauges(namespace, dead_refresh_s)
        reg.register(self._gauges)

    def observe(self, queue: Queue, name: str = "default") -> None:
        """Report ``queue``'s backlog, running, delayed and dead-task counts under
        ``queue=name`` at every scrape (Q-110)."""
        self._gauges.add(name, queue)

    def on_enqueued(self, event: TaskEnqueued) -> None:
        self.enqueued.labels(event.task_name).inc()

    def on_replayed(self, event: TaskReplayed) -> None:
        self.replayed.labels(event.task_name, event.source.value).inc()

    def on_succeeded(self, event: TaskSucceeded) -> None:
        self._ended(event.task_name, "succeeded", event.duration_s)

    def on_retry_scheduled(self, event: TaskRetryScheduled) -> None:
        self._ended(event.task_name, "retried", event.duration_s)

    def on_dead_lettered(self, event: TaskDeadLettered) -> None:
        self._ended(event.task_name, "dead_lettered", event.duration_s)

    def on_cancelled(self, event: TaskCancelled) -> None:
        self._ended(event.task_name, "cancelled", None)

    def on_interrupted(self, event: TaskInterrupted) -> None:
        self._ended(event.task_name, "interrupted", event.duration_s)

    def _ended(self, task: str, outcome: str, duration_s: float | None) -> None:
        self.outcomes.labels(task, outcome).inc()
        if duration_s is not None:
            self.duration.labels(task, outcome).observe(duration_s)


class _QueueGauges(Collector):
    """The gauges of the observed queues, read at scrape time."""

    def __init__(self, namespace: str, dead_refresh_s: float) -> None:
        self._prefix = f"{namespace}_" if namespace else ""
        self._queues: dict[str, Queue] = {}
        self._dead_refresh_s = dead_refresh_s
        self._dead: dict[str, tuple[float, int]] = {}  # name -> (read at, count)
        self._lock = threading.Lock()  # scrapes may come from several threads

    def add(self, name: str, queue: Queue) -> None:
        with self._lock:
            self._queues[name] = queue

    def collect(self) -> Iterator[Metric]:
        p = self._prefix
        families = {
            "backlog": GaugeMetricFamily(f"{p}queue_backlog", "Immediate tasks scheduled and "
                                         "not begun (waiting for a slot included).",
                                         labels=["queue"]),
            "running": GaugeMetricFamily(f"{p}queue_running", "Executions in progress.",
                                         labels=["queue"]),
            "delayed": GaugeMetricFamily(f"{p}queue_delayed", "Tasks waiting for their time "
                                         "in this process.", labels=["queue"]),
            "dead": GaugeMetricFamily(f"{p}dead_tasks", "Tasks in the dead-task store.",
                                      labels=["queue"]),
        }
        with self._lock:
            queues = list(self._queues.items())
        for name, queue in queues:
            families["backlog"].add_metric([name], queue.backlog_size)
            families["running"].add_metric([name], queue.running)
            families["delayed"].add_metric([name], queue.delayed)
            dead = self._dead_count(name, queue)
            if dead is not None:
                families["dead"].add_metric([name], dead)
        yield from families.values()

    def _dead_count(self, name: str, queue: Queue) -> int | None:
        """The number of dead tasks, or None (logged) when the store cannot be read: a
        scrape never fails for it (Q-110)."""
        now = time.monotonic()
        with self._lock:
            cached = self._dead.get(name)
        if cached is not None and now - cached[0] < self._dead_refresh_s:
            return cached[1]
        try:
            count = queue.operator.dead_stats()["dead_tasks"]
        except Exception as error:  # noqa: BLE001 - a closed or broken backend
            log.warning("prometheus: cannot count the dead tasks of queue %r (%s: %s); the "
                        "sample is left out", name, type(error).__name__, error)
            return None
        assert isinstance(count, int)
        with self._lock:
            self._dead[name] = (now, count)
        return count
