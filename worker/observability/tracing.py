"""OpenTelemetry tracing: one CONSUMER span per event, continuing the event's W3C ``traceparent``.

Off by default (``LTM_TRACING=off``): then nothing here imports OpenTelemetry, each event costs one tiny
object, and outputs carry the incoming ``traceparent`` unchanged. With ``otlp`` or ``console`` (and the
``tracing`` extra installed) each event gets a span ``<queue> process`` whose parent is the shard's span,
and the outputs carry the same trace id with the new span's id (CONTRACT.md "Details fixed here").

Inside the event's span, :meth:`EventSpan.step` opens child spans for where the time goes: the event's
trip through Postgres (its wait for the batch and the batch's statements), the publish of result and
notice, and the Redis invalidation. They are made here by hand rather than by the OpenTelemetry
instrumentations for asyncpg, aio-pika and redis: a Postgres batch and a Redis pipeline serve several
events at once from a task of their own, so an instrumentation would hang their statements under whichever
event started that task; the aio-pika one would add a second CONSUMER span per event and inject its own
``traceparent`` into the outputs, whose header the contract fixes.

While the span is open, the event's log lines carry its ``trace_id`` and ``span_id`` (structlog context
variables), so logs and traces join on them.

The event path sees only :class:`EventTracer` and :class:`EventSpan`; the SDK stays in this module.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Awaitable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Literal, Protocol, TypeVar

import structlog

from contracts.names import TRACEPARENT_HEADER, WORK_QUEUE
from worker.redact import describe

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

log = structlog.get_logger("worker.tracing")

OFF = "off"
OTLP = "otlp"
CONSOLE = "console"
SERVICE_NAME = "tomoribot-ltm-worker"
INSTALL_HINT = "pip install -e '/path/to/checkout[tracing]' (the tracing extra, from the worker's checkout)"
#: how long the worker's exit waits for the last spans to be exported
SHUTDOWN_SECONDS = 5.0

_TRACEPARENT = TRACEPARENT_HEADER
_missing_reported = False

#: what an attribute may be; ``None`` means "not known" and is left off the span
Attribute = str | int | float | bool | None
#: the span kinds a step may have (OpenTelemetry's SpanKind, by name)
StepKind = Literal["internal", "client", "producer"]
T = TypeVar("T")


class EventSpan(Protocol):
    """The span of one event, as the event path sees it."""

    @property
    def traceparent(self) -> str | None:
        """The ``traceparent`` to put on everything published for this event."""

    def set(self, attributes: Mapping[str, Attribute]) -> None:
        """Add what became known while handling the event (status, memory id)."""

    def fail(self, exc: BaseException) -> None:
        """Record an exception the worker handled itself and mark the span as failed."""

    def step(
        self, name: str, attributes: Mapping[str, Attribute], *, kind: StepKind = "internal"
    ) -> AbstractContextManager[None]:
        """A child span around one part of the event's handling; an exception marks it failed."""


async def in_step(
    span: EventSpan, name: str, attributes: Mapping[str, Attribute], work: Awaitable[T], *, kind: StepKind
) -> T:
    """Await ``work`` inside a child span of ``span`` (for work run side by side with ``gather``)."""
    with span.step(name, attributes, kind=kind):
        return await work


class EventTracer(Protocol):
    """Opens the span of each event; :func:`create_tracer` picks the implementation."""

    def event_span(
        self, traceparent: str | None, attributes: Mapping[str, Attribute]
    ) -> AbstractContextManager[EventSpan]:
        """A span around the handling of one event, continuing ``traceparent`` (the event's header)."""

    def shutdown(self) -> None:
        """Export what is still buffered (bounded wait) and stop; called once, at the worker's exit."""


class _Untraced:
    """Tracing off: the event's own ``traceparent`` goes out unchanged and nothing is recorded."""

    __slots__ = ("traceparent",)

    def __init__(self, traceparent: str | None) -> None:
        self.traceparent = traceparent

    def __enter__(self) -> _Untraced:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def set(self, attributes: Mapping[str, Attribute]) -> None:
        return None

    def fail(self, exc: BaseException) -> None:
        return None

    def step(
        self, name: str, attributes: Mapping[str, Attribute], *, kind: StepKind = "internal"
    ) -> AbstractContextManager[None]:
        return nullcontext()


class UntracedEvents:
    """The tracer when tracing is off (or OpenTelemetry is not installed)."""

    def event_span(
        self, traceparent: str | None, attributes: Mapping[str, Attribute]
    ) -> AbstractContextManager[EventSpan]:
        return _Untraced(traceparent)

    def shutdown(self) -> None:
        return None


class _RecordedSpan:
    __slots__ = ("_span", "_tracer", "traceparent")

    def __init__(self, span: Span, traceparent: str | None, tracer: Tracer) -> None:
        self._span = span
        self._tracer = tracer
        self.traceparent = traceparent

    def set(self, attributes: Mapping[str, Attribute]) -> None:
        self._span.set_attributes({k: v for k, v in attributes.items() if v is not None})

    def fail(self, exc: BaseException) -> None:
        from opentelemetry.trace import Status, StatusCode

        self._span.record_exception(exc)
        self._span.set_status(Status(StatusCode.ERROR, describe(exc)))

    @contextmanager
    def step(
        self, name: str, attributes: Mapping[str, Attribute], *, kind: StepKind = "internal"
    ) -> Iterator[None]:
        from opentelemetry.trace import SpanKind, set_span_in_context

        # the event's span is the parent explicitly: a step may run in a task of its own
        with self._tracer.start_as_current_span(
            name,
            context=set_span_in_context(self._span),
            kind=SpanKind[kind.upper()],
            attributes={k: v for k, v in attributes.items() if v is not None},
        ):
            yield


class TracedEvents:
    """One CONSUMER span per event on ``provider``, parented by the event's ``traceparent``."""

    def __init__(self, provider: TracerProvider, destination: str = WORK_QUEUE) -> None:
        from opentelemetry.context import Context
        from opentelemetry.trace import SpanKind
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._provider = provider
        self._tracer = provider.get_tracer("worker")
        # the contract carries W3C traceparent only, whatever OTEL_PROPAGATORS says
        self._propagator = TraceContextTextMapPropagator()
        self._empty = Context
        self._kind = SpanKind.CONSUMER
        self._name = f"{destination} process"
        self._static: dict[str, Attribute] = {
            "messaging.system": "rabbitmq",
            "messaging.destination.name": destination,
            "messaging.operation.type": "process",
        }

    @contextmanager
    def event_span(self, traceparent: str | None, attributes: Mapping[str, Attribute]) -> Iterator[EventSpan]:
        # no (or an unreadable) traceparent: a new trace, never the ambient context's
        parent = self._propagator.extract({_TRACEPARENT: traceparent}) if traceparent else self._empty()
        with self._tracer.start_as_current_span(
            self._name,
            context=parent,
            kind=self._kind,
            attributes={k: v for k, v in {**self._static, **attributes}.items() if v is not None},
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            carrier: dict[str, str] = {}
            self._propagator.inject(carrier)  # the current context: this span
            handle = _RecordedSpan(span, carrier.get(_TRACEPARENT, traceparent), self._tracer)
            ids = span.get_span_context()
            # every log line of the event from here on names its trace and span
            with structlog.contextvars.bound_contextvars(
                trace_id=format(ids.trace_id, "032x"), span_id=format(ids.span_id, "016x")
            ):
                try:
                    yield handle
                except BaseException as exc:  # cancelled (connection lost, stop) or a bug: the span says so
                    handle.fail(exc)
                    raise

    def shutdown(self) -> None:
        # a collector that does not answer must not hold the exit: wait a bounded time, then leave the
        # exporter's daemon threads behind
        done = threading.Thread(target=self._provider.shutdown, name="tracing-shutdown", daemon=True)
        done.start()
        done.join(SHUTDOWN_SECONDS)
        if done.is_alive():
            log.warning("spans not exported before exit", waited_s=SHUTDOWN_SECONDS)


def create_tracer(mode: str, destination: str = WORK_QUEUE) -> EventTracer:
    """The tracer for ``LTM_TRACING=mode``: ``off``, ``otlp`` (OTLP/HTTP, configured by the standard
    ``OTEL_EXPORTER_OTLP_*`` variables) or ``console`` (spans as JSON lines on stdout).

    Without the ``tracing`` extra installed, any mode but ``off`` warns and runs untraced.
    """
    if mode not in (OTLP, CONSOLE):
        return UntracedEvents()
    try:
        from opentelemetry.sdk.resources import OTELResourceDetector, Resource
        from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

        exporter: SpanExporter
        if mode == OTLP:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter()
        else:

            def one_line(span: ReadableSpan) -> str:
                return str(span.to_json(indent=None)) + "\n"

            exporter = ConsoleSpanExporter(out=sys.stdout, formatter=one_line)
    except ImportError as exc:
        global _missing_reported
        if not _missing_reported:
            _missing_reported = True
            log.warning(
                "tracing is not installed; running without it",
                tracing=mode,
                missing=exc.name,
                install=INSTALL_HINT,
            )
        return UntracedEvents()
    # ours unless OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES name the service
    resource = Resource.create({"service.name": SERVICE_NAME}).merge(OTELResourceDetector().detect())
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    log.info("tracing on", tracing=mode, service=resource.attributes.get("service.name"))
    return TracedEvents(provider, destination)
