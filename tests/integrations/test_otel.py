"""OpenTelemetry spans linked through the stored traceparent (spec/queue.md Q-109, Q-111).

Goal: a task enqueued inside a span carries that span's W3C trace context in its metadata,
through retries and a restart, and each execution is one span that is a child of it (or
linked to it), ended at the execution's ending event with the right status. Method: the real
OpenTelemetry SDK (``TracerProvider`` with the in-memory span exporter, one per test, never
set globally) and real queues over ``Memory`` and a real ``Disk``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import deferq
from deferq._runtime.serialize import decode_context
from deferq.backends import Disk
from deferq.integrations.otel import OtelHooks
from deferq.testing import ManualClock, Memory
from tests.queue.helpers import run, settle

REG = deferq.TaskRegistry()


class Ok(deferq.Task, name="ot.Ok", registry=REG, inline=True):
    def perform(self) -> None:
        pass


class Flaky(deferq.Task, name="ot.Flaky", registry=REG, inline=True):
    max_retries = 1

    def perform(self) -> None:
        raise ConnectionError("refused")

    def retry_interval(self, exception: BaseException, attempt: int) -> object:
        return 5


class Hangs(deferq.Task, name="ot.Hangs", registry=REG):
    async def perform(self) -> None:
        await asyncio.Event().wait()


def tracing() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def runs(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith("run ")]


@pytest.mark.spec("Q-109", "Q-111", "Q-224")
def test_each_execution_is_a_child_of_the_enqueuing_span_through_a_retry() -> None:
    provider, exporter = tracing()
    tracer = provider.get_tracer("app")

    async def main() -> tuple[trace.SpanContext, dict[str, str] | None]:
        clock = ManualClock()
        memory = Memory(now=clock.time)
        queue = deferq.Queue(memory, clock=clock, registry=REG,
                             hooks=[OtelHooks(tracer_provider=provider)])
        await queue.start()
        with tracer.start_as_current_span("POST /orders") as request:
            queue.defer(Flaky)
        meta = decode_context(memory.pending_tasks()[0].context).meta
        await queue.wait_idle()
        await clock.advance(5)
        await queue.wait_idle()
        await settle()
        await queue.stop()
        return request.get_span_context(), meta

    parent, meta = run(main())
    assert meta is not None
    assert meta["traceparent"] == (
        f"00-{parent.trace_id:032x}-{parent.span_id:016x}-{int(parent.trace_flags):02x}")
    spans = runs(exporter)
    assert [s.name for s in spans] == ["run ot.Flaky", "run ot.Flaky"]
    for attempt, span in enumerate(spans, start=1):
        assert span.parent is not None and span.parent.span_id == parent.span_id
        assert span.context is not None and span.context.trace_id == parent.trace_id
        assert span.kind is trace.SpanKind.CONSUMER
        assert span.attributes is not None
        assert span.attributes["deferq.task.name"] == "ot.Flaky"
        assert span.attributes["deferq.task.attempt"] == attempt
        assert span.status.status_code is trace.StatusCode.ERROR
        assert [e.name for e in span.events] == ["exception"]
    outcomes = [s.attributes["deferq.outcome"] for s in spans if s.attributes is not None]
    assert outcomes == ["retry_scheduled", "dead_lettered"]
    assert spans[0].attributes is not None and spans[0].attributes["deferq.retry.delay_s"] == 5


@pytest.mark.spec("Q-109", "Q-111", "Q-224")
def test_the_traceparent_survives_a_restart_and_link_mode_links_instead(storage: Path) -> None:
    provider, exporter = tracing()
    tracer = provider.get_tracer("app")

    async def main() -> trace.SpanContext:
        with Disk(path=storage) as disk:
            queue = deferq.Queue(disk, registry=REG, hooks=[OtelHooks(tracer_provider=provider)])
            with tracer.start_as_current_span("enqueue before start") as request:
                queue.defer(Ok)  # only persisted: the next start runs it
        with Disk(path=storage) as disk:
            queue = deferq.Queue(disk, registry=REG,
                                 hooks=[OtelHooks(tracer_provider=provider, link=True)])
            await queue.start()
            await queue.wait_idle()
            await queue.stop()
        return request.get_span_context()

    parent = run(main())
    span, = runs(exporter)
    assert span.parent is None  # a root span of its own trace...
    assert span.context is not None and span.context.trace_id != parent.trace_id
    assert [(link.context.trace_id, link.context.span_id) for link in span.links] == [
        (parent.trace_id, parent.span_id)]  # ...linked to the enqueuer's span
    assert span.status.status_code is trace.StatusCode.OK


@pytest.mark.spec("Q-109", "Q-111", "Q-224")
def test_without_a_current_span_nothing_is_stored_and_spans_end_on_every_outcome() -> None:
    provider, exporter = tracing()

    async def main() -> Memory:
        memory = Memory()
        queue = deferq.Queue(memory, registry=REG, hooks=[OtelHooks(tracer_provider=provider)])
        await queue.start()
        queue.defer(Ok)
        running = queue.defer(Hangs)
        await settle()
        assert await queue.cancel(running)
        queue.defer(Hangs)
        await settle()
        await queue.stop(timeout=0)  # interrupts the second one
        return memory

    memory = run(main())
    assert [decode_context(p.context).meta for p in memory.pending_tasks()] == [None]
    spans = runs(exporter)
    assert all(s.parent is None for s in spans)
    outcomes = sorted(str(s.attributes.get("deferq.outcome")) for s in spans
                      if s.attributes is not None)
    assert outcomes == ["None", "cancelled", "interrupted"]  # the success has no outcome attr
    assert len(spans) == 3  # every started execution's span ended
