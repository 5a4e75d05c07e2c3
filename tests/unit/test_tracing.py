"""The per-event span: continues the event's traceparent, hands the outputs a new one (no services)."""

from __future__ import annotations

import asyncio
import contextvars
import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from contracts.models import Status
from tests.support.harness import REPO
from worker.config import load_settings
from worker.observability import tracing
from worker.observability.tracing import TracedEvents, UntracedEvents, create_tracer, in_step

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
EVENT_ATTRIBUTES: dict[str, tracing.Attribute] = {
    "messaging.message.id": "6f1c1a9e-3b0e-4a53-9a55-6a4f0f0b9a11",
    "ltm.tool_call_id": "call_8731",
    "ltm.shard_id": 3,
    "ltm.attempts": 1,
}


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def traced(exporter: InMemorySpanExporter) -> TracedEvents:
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return TracedEvents(provider)


def parse(traceparent: str | None) -> tuple[str, str, str]:
    assert traceparent is not None
    version, trace_id, span_id, flags = traceparent.split("-")
    assert version == "00"
    assert len(trace_id) == 32
    assert len(span_id) == 16
    assert len(flags) == 2
    return trace_id, span_id, flags


def only_span(exporter: InMemorySpanExporter) -> ReadableSpan:
    [span] = exporter.get_finished_spans()
    return span


def test_the_span_continues_the_event_trace_and_the_outputs_carry_it(
    traced: TracedEvents, exporter: InMemorySpanExporter
) -> None:
    with traced.event_span(TRACEPARENT, EVENT_ATTRIBUTES) as span:
        outgoing = span.traceparent
    recorded = only_span(exporter)
    assert recorded.name == "ltm.create_memory process"
    assert recorded.kind is SpanKind.CONSUMER
    assert f"{recorded.context.trace_id:032x}" == TRACE_ID
    assert recorded.parent is not None
    assert recorded.parent.is_remote
    assert f"{recorded.parent.span_id:016x}" == PARENT_ID
    trace_id, span_id, flags = parse(outgoing)
    assert trace_id == TRACE_ID
    assert span_id == f"{recorded.context.span_id:016x}" != PARENT_ID
    assert flags == "01"


def test_without_a_traceparent_the_span_starts_a_new_trace(
    traced: TracedEvents, exporter: InMemorySpanExporter
) -> None:
    with traced.event_span(None, EVENT_ATTRIBUTES) as span:
        outgoing = span.traceparent
    recorded = only_span(exporter)
    assert recorded.parent is None
    trace_id, span_id, _ = parse(outgoing)
    assert trace_id == f"{recorded.context.trace_id:032x}" != TRACE_ID
    assert span_id == f"{recorded.context.span_id:016x}"


def test_an_unreadable_traceparent_starts_a_new_trace(
    traced: TracedEvents, exporter: InMemorySpanExporter
) -> None:
    with traced.event_span("not-a-traceparent", EVENT_ATTRIBUTES) as span:
        outgoing = span.traceparent
    recorded = only_span(exporter)
    assert recorded.parent is None
    assert parse(outgoing)[0] == f"{recorded.context.trace_id:032x}"


def test_an_unsampled_parent_still_gets_its_trace_id_on_the_outputs(
    traced: TracedEvents, exporter: InMemorySpanExporter
) -> None:
    with traced.event_span(f"00-{TRACE_ID}-{PARENT_ID}-00", EVENT_ATTRIBUTES) as span:
        outgoing = span.traceparent
    assert exporter.get_finished_spans() == ()  # not sampled: nothing exported
    trace_id, span_id, flags = parse(outgoing)
    assert (trace_id, flags) == (TRACE_ID, "00")
    assert span_id != PARENT_ID


def test_spans_of_concurrent_events_do_not_nest(traced: TracedEvents, exporter: InMemorySpanExporter) -> None:
    with traced.event_span(TRACEPARENT, EVENT_ATTRIBUTES), traced.event_span(None, EVENT_ATTRIBUTES):
        pass
    inner, outer = exporter.get_finished_spans()
    assert inner.parent is None
    assert outer.parent is not None
    assert f"{outer.parent.span_id:016x}" == PARENT_ID


def test_attributes_known_up_front_and_later(traced: TracedEvents, exporter: InMemorySpanExporter) -> None:
    with traced.event_span(TRACEPARENT, EVENT_ATTRIBUTES) as span:
        span.set({"ltm.status": Status.SAVED, "ltm.memory_id": 123, "ltm.replayed": False})
    attributes = dict(only_span(exporter).attributes or {})
    assert attributes == {
        "messaging.system": "rabbitmq",
        "messaging.destination.name": "ltm.create_memory",
        "messaging.operation.type": "process",
        "messaging.message.id": "6f1c1a9e-3b0e-4a53-9a55-6a4f0f0b9a11",
        "ltm.tool_call_id": "call_8731",
        "ltm.shard_id": 3,
        "ltm.attempts": 1,
        "ltm.status": Status.SAVED,
        "ltm.memory_id": 123,
        "ltm.replayed": False,
    }
    assert only_span(exporter).status.status_code is StatusCode.UNSET


def test_unknown_attributes_are_left_off(traced: TracedEvents, exporter: InMemorySpanExporter) -> None:
    with traced.event_span(TRACEPARENT, EVENT_ATTRIBUTES) as span:
        span.set({"ltm.status": Status.DISABLED, "ltm.memory_id": None})
    attributes = only_span(exporter).attributes or {}
    assert attributes["ltm.status"] == Status.DISABLED
    assert "ltm.memory_id" not in attributes


def test_an_exception_escaping_the_span_is_recorded_and_raised(
    traced: TracedEvents, exporter: InMemorySpanExporter
) -> None:
    with pytest.raises(RuntimeError, match="boom"), traced.event_span(TRACEPARENT, EVENT_ATTRIBUTES):
        raise RuntimeError("boom")
    recorded = only_span(exporter)
    assert recorded.status.status_code is StatusCode.ERROR
    assert recorded.status.description == "RuntimeError: boom"
    [event] = recorded.events
    assert event.name == "exception"
    assert (event.attributes or {})["exception.type"] == "RuntimeError"


def test_a_failure_the_runner_handles_marks_the_span(
    traced: TracedEvents, exporter: InMemorySpanExporter
) -> None:
    with traced.event_span(TRACEPARENT, EVENT_ATTRIBUTES) as span:
        try:
            raise ConnectionError("postgres went away")
        except ConnectionError as exc:
            span.fail(exc)
        span.set({"ltm.status": Status.DB_ERROR})
    recorded = only_span(exporter)
    assert recorded.status.status_code is StatusCode.ERROR
    assert recorded.status.description == "ConnectionError: postgres went away"
    assert [event.name for event in recorded.events] == ["exception"]
    assert (recorded.attributes or {})["ltm.status"] == Status.DB_ERROR


async def test_steps_are_children_of_the_event_span_even_in_a_task_of_their_own(
    traced: TracedEvents, exporter: InMemorySpanExporter
) -> None:
    async def publish() -> str:
        await asyncio.sleep(0)
        return "confirmed"

    with traced.event_span(TRACEPARENT, EVENT_ATTRIBUTES) as span:
        with span.step("postgres ltm_save_events", {"db.system.name": "postgresql"}, kind="client"):
            await asyncio.sleep(0)
        # a task started with no context at all (like a shared batch) still hangs the step under the event
        elsewhere = asyncio.create_task(
            in_step(span, "tomori.tool_results publish", {"ltm.notice": True}, publish(), kind="producer"),
            context=contextvars.Context(),
        )
        assert await elsewhere == "confirmed"
    spans = {recorded.name: recorded for recorded in exporter.get_finished_spans()}
    event = spans.pop("ltm.create_memory process")
    assert [(s.name, s.kind) for s in spans.values()] == [
        ("postgres ltm_save_events", SpanKind.CLIENT),
        ("tomori.tool_results publish", SpanKind.PRODUCER),
    ]
    for step in spans.values():
        assert step.parent is not None
        assert step.parent.span_id == event.context.span_id
        assert step.context.trace_id == event.context.trace_id
    assert (spans["tomori.tool_results publish"].attributes or {})["ltm.notice"] is True


def test_a_failing_step_is_marked_and_the_error_goes_on(
    traced: TracedEvents, exporter: InMemorySpanExporter
) -> None:
    with (
        traced.event_span(TRACEPARENT, EVENT_ATTRIBUTES) as span,
        pytest.raises(ConnectionError),
        span.step("tomori:cache-invalidation publish", {}, kind="producer"),
    ):
        raise ConnectionError("redis went away")
    step = next(s for s in exporter.get_finished_spans() if s.name == "tomori:cache-invalidation publish")
    assert step.status.status_code is StatusCode.ERROR
    assert [event.name for event in step.events] == ["exception"]


def test_log_lines_inside_the_span_carry_its_trace_and_span_ids(traced: TracedEvents) -> None:
    with traced.event_span(TRACEPARENT, EVENT_ATTRIBUTES) as span:
        bound = structlog.contextvars.get_contextvars()
        trace_id, span_id, _ = parse(span.traceparent)
    assert (bound["trace_id"], bound["span_id"]) == (trace_id, span_id)
    assert trace_id == TRACE_ID
    assert "trace_id" not in structlog.contextvars.get_contextvars()
    with UntracedEvents().event_span(TRACEPARENT, EVENT_ATTRIBUTES) as untraced:
        assert "trace_id" not in structlog.contextvars.get_contextvars()
        with untraced.step("postgres ltm_save_events", {}, kind="client"):
            pass


@pytest.mark.parametrize("traceparent", [TRACEPARENT, None, "garbage"])
def test_off_hands_back_the_incoming_traceparent_untouched(traceparent: str | None) -> None:
    tracer = create_tracer("off")
    assert isinstance(tracer, UntracedEvents)
    with tracer.event_span(traceparent, EVENT_ATTRIBUTES) as span:
        span.set({"ltm.status": Status.SAVED})
        span.fail(RuntimeError("ignored"))
        assert span.traceparent == traceparent
    tracer.shutdown()


def test_off_never_loads_the_sdk() -> None:
    """The default path costs nothing: with tracing off the worker does not even load the tracing SDK.

    (redis-py imports parts of OpenTelemetry for its own metrics when they are installed; not the tracer.)
    """
    script = (
        "import sys\n"
        "from worker.observability.tracing import create_tracer\n"
        "with create_tracer('off').event_span('tp', {}) as span:\n"
        "    assert span.traceparent == 'tp'\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('opentelemetry'))\n"
        "assert not loaded, loaded\n"
        "from worker.config import Settings\n"
        "import worker.runner, worker.bootstrap, worker.runtime.consumer, worker.runtime.handler\n"
        "tracer = create_tracer(Settings().tracing)\n"
        "with tracer.event_span('tp', {}) as span:\n"
        "    assert span.traceparent == 'tp'\n"
        "tracer.shutdown()\n"
        "tracer = [m for m in ('opentelemetry.sdk.trace', 'opentelemetry.propagate') if m in sys.modules]\n"
        "assert not tracer, tracer\n"
    )
    subprocess.run([sys.executable, "-c", script], cwd=REPO, check=True, timeout=60)


class RecordingLog:
    def __init__(self) -> None:
        self.warnings: list[tuple[str, dict[str, Any]]] = []

    def warning(self, event: str, **fields: Any) -> None:
        self.warnings.append((event, fields))

    def info(self, event: str, **fields: Any) -> None:
        pass


def test_without_the_packages_it_warns_once_and_runs_untraced(monkeypatch: pytest.MonkeyPatch) -> None:
    recording = RecordingLog()
    monkeypatch.setattr(tracing, "log", recording)
    monkeypatch.setattr(tracing, "_missing_reported", False)
    for name in ("opentelemetry.sdk.resources", "opentelemetry.sdk.trace", "opentelemetry.sdk.trace.export"):
        monkeypatch.setitem(sys.modules, name, None)  # as if the extra were not installed
    for mode in ("otlp", "console", "otlp"):
        tracer = create_tracer(mode)
        assert isinstance(tracer, UntracedEvents)
        with tracer.event_span(TRACEPARENT, EVENT_ATTRIBUTES) as span:
            assert span.traceparent == TRACEPARENT
    [(event, fields)] = recording.warnings
    assert "not installed" in event
    assert fields["install"] == (
        "pip install -e '/path/to/checkout[tracing]' (the tracing extra, from the worker's checkout)"
    )
    assert fields["tracing"] == "otlp"


def test_console_prints_one_json_line_per_span_and_flushes_on_shutdown(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    tracer = create_tracer("console", "ltm.create_memory")
    assert isinstance(tracer, TracedEvents)
    with tracer.event_span(TRACEPARENT, EVENT_ATTRIBUTES) as span:
        outgoing = span.traceparent
    tracer.shutdown()  # the batch processor has not exported yet: the exit must flush it
    spans = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    [printed] = spans
    assert printed["name"] == "ltm.create_memory process"
    assert printed["context"]["trace_id"] == f"0x{TRACE_ID}"
    assert printed["context"]["span_id"] == f"0x{parse(outgoing)[1]}"
    assert printed["parent_id"] == f"0x{PARENT_ID}"
    assert printed["resource"]["attributes"]["service.name"] == "tomoribot-ltm-worker"


def test_otel_service_name_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SERVICE_NAME", "ltm-canary")
    tracer = create_tracer("console")
    assert isinstance(tracer, TracedEvents)
    assert tracer._provider.resource.attributes["service.name"] == "ltm-canary"
    tracer.shutdown()


@pytest.fixture
def collector() -> Iterator[tuple[str, list[ExportTraceServiceRequest]]]:
    """A tiny OTLP/HTTP collector: records every POST to /v1/traces."""
    received: list[ExportTraceServiceRequest] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.path == "/v1/traces":
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                received.append(request)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()


def test_otlp_exports_to_the_configured_endpoint(
    collector: tuple[str, list[ExportTraceServiceRequest]], monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint, received = collector
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    tracer = create_tracer("otlp")
    with tracer.event_span(TRACEPARENT, EVENT_ATTRIBUTES) as span:
        span.set({"ltm.status": Status.SAVED})
    tracer.shutdown()
    [request] = received
    [resource_spans] = request.resource_spans
    service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}["service.name"]
    assert service == "tomoribot-ltm-worker"
    [exported] = [s for scope in resource_spans.scope_spans for s in scope.spans]
    assert exported.name == "ltm.create_memory process"
    assert exported.trace_id.hex() == TRACE_ID
    assert exported.parent_span_id.hex() == PARENT_ID


@pytest.mark.parametrize(
    ("raw", "mode", "fell_back"),
    [(None, "off", False), ("otlp", "otlp", False), (" Console ", "console", False), ("jaeger", "off", True)],
)
def test_ltm_tracing_setting(raw: str | None, mode: str, fell_back: bool) -> None:
    settings = load_settings({} if raw is None else {"LTM_TRACING": raw})
    assert settings.tracing == mode
    assert (("LTM_TRACING", raw, "off") in settings.fallbacks) is fell_back
