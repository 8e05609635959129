"""OpenTelemetry spans of a queue's executions, from its lifecycle hooks (spec/queue.md Q-108, Q-109).

Rules:
- Imported only when used: ``import deferq`` never imports ``opentelemetry``; importing this
  module without ``opentelemetry-api`` raises ``ImportError`` naming the extra (Q-108).
- At enqueue (``enqueue_meta``, in the enqueuing thread) the current context's W3C trace
  context is written into the task's metadata (``traceparent``, and ``tracestate`` when
  there is one); a task that already has a ``traceparent`` keeps its own (Q-103). Stored
  with the task, it survives retries and restarts (Q-66).
- Each execution is one span, ``run TASK_NAME`` (kind CONSUMER), started at ``on_started``
  and ended at its one ending event (Q-102): a child of the stored traceparent, or, with
  ``link=True``, a root span linked to it (Q-109). A failed execution records its exception
  and ends with status ERROR; a success ends with status OK.
"""

from __future__ import annotations

from typing import Final

from deferq import (
    Hooks,
    TaskCancelled,
    TaskDeadLettered,
    TaskInterrupted,
    TaskRetryScheduled,
    TaskStarted,
    TaskSucceeded,
)
from deferq._version import __version__

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as missing:
    raise ImportError("deferq.integrations.otel needs opentelemetry-api: "
                      "pip install 'deferq[otel]'") from missing

TRACEPARENT: Final = "traceparent"
_PROPAGATOR: Final = TraceContextTextMapPropagator()


class OtelHooks(Hooks):
    """Hooks that carry the enqueuer's trace to a span per execution.

    ``Queue(disk, hooks=[OtelHooks()])``: the enqueue side and the execution side in one.
    """

    def __init__(self, tracer_provider: trace.TracerProvider | None = None, *,
                 link: bool = False) -> None:
        self._tracer = trace.get_tracer("deferq", __version__, tracer_provider=tracer_provider)
        self._link = link
        self._spans: dict[str, trace.Span] = {}  # running executions, by task id

    def enqueue_meta(self, task_name: str) -> dict[str, str] | None:
        """Implements Q-109: the current trace context, as W3C headers."""
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier)
        return carrier or None

    def on_started(self, event: TaskStarted) -> None:
        stored = _PROPAGATOR.extract(dict(event.meta))
        parent = trace.get_current_span(stored).get_span_context()
        attributes: dict[str, str | int] = {
            "messaging.system": "deferq", "deferq.task.id": event.task_id,
            "deferq.task.name": event.task_name, "deferq.task.attempt": event.attempt}
        if self._link:
            links = [trace.Link(parent)] if parent.is_valid else []
            span = self._tracer.start_span(f"run {event.task_name}", otel_context.Context(),
                                           kind=trace.SpanKind.CONSUMER, links=links,
                                           attributes=attributes)
        else:
            span = self._tracer.start_span(f"run {event.task_name}", stored,
                                           kind=trace.SpanKind.CONSUMER, attributes=attributes)
        self._spans[event.task_id] = span

    def on_succeeded(self, event: TaskSucceeded) -> None:
        span = self._spans.pop(event.task_id, None)
        if span is not None:
            span.set_status(trace.StatusCode.OK)
            span.end()

    def on_retry_scheduled(self, event: TaskRetryScheduled) -> None:
        self._failed(event.task_id, event.exception, "retry_scheduled", event.delay_s)

    def on_dead_lettered(self, event: TaskDeadLettered) -> None:
        self._failed(event.task_id, event.exception, "dead_lettered", None)

    def on_cancelled(self, event: TaskCancelled) -> None:
        self._close(event.task_id, "cancelled")

    def on_interrupted(self, event: TaskInterrupted) -> None:
        self._close(event.task_id, "interrupted")

    def _failed(self, task_id: str, exc: BaseException, outcome: str,
                delay_s: int | None) -> None:
        span = self._spans.pop(task_id, None)
        if span is None:
            return  # a task that could not be loaded: no execution, no span
        span.record_exception(exc)
        span.set_attribute("deferq.outcome", outcome)
        if delay_s is not None:
            span.set_attribute("deferq.retry.delay_s", delay_s)
        span.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        span.end()

    def _close(self, task_id: str, outcome: str) -> None:
        span = self._spans.pop(task_id, None)
        if span is not None:
            span.set_attribute("deferq.outcome", outcome)
            span.end()
