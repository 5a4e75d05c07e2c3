"""The per-delivery handler in process, with fakes for the broker, Postgres and Redis: which deliveries are
acked, retried, dead-lettered or handed back, and what the shard is told. Crashes and outages stay e2e."""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
from structlog.testing import capture_logs

from contracts.models import SAVED_MESSAGE, DeadLetterKind, Status, ToolResult
from tests.factories import event_body
from tests.fakes import FakeMessage, FakeProcessor, FakePublisher
from worker.broker.acks import Acks
from worker.broker.headers import Sender
from worker.config import Topology
from worker.faults import TransientError
from worker.observability.metrics import Metrics
from worker.observability.telemetry import EventTelemetry
from worker.observability.tracing import UntracedEvents
from worker.pipeline import outcome
from worker.runtime.handler import EventHandler
from worker.service.identity import IdentityRule
from worker.service.policy import RetryPolicy
from worker.service.process import Conflict, ProcessedEvent

POLICY = RetryPolicy(max_attempts=3, base_delay_ms=100, max_delay_ms=400, draw=lambda low, high: high)


@dataclass
class FakeInvalidations:
    published: list[dict[str, Any]] = field(default_factory=list)

    async def publish(self, event_id: uuid.UUID, invalidation: dict[str, Any]) -> None:
        self.published.append(invalidation)


def saved(event_id: str) -> ProcessedEvent:
    result = ToolResult(
        event_id=uuid.UUID(event_id),
        tool_call_id="call_1",
        tool_name="create_long_term_memory",
        success=True,
        status=Status.SAVED,
        message=SAVED_MESSAGE,
        error=None,
        data={"memory_id": 7},
        processed_at=datetime.now(UTC),
    )
    invalidation = {"schema_version": 1, "event_id": event_id, "kind": "user", "user_disc_id": "1" * 18}
    return ProcessedEvent(Status.SAVED, 7, result, {"notice": 1}, invalidation, replayed=False)


class ChannelHandler:
    """The handler serving the deliveries of one channel (settled through that channel's acks)."""

    def __init__(self, handler: EventHandler, acks: Acks) -> None:
        self.handler = handler
        self.acks = acks

    async def handle(self, message: FakeMessage) -> None:
        await self.handler.handle(message, self.acks)  # type: ignore[arg-type]


def handler_with(
    processor: FakeProcessor,
    publisher: FakePublisher,
    message: FakeMessage,
    metrics: Metrics | None = None,
    identity: IdentityRule | None = None,
) -> tuple[ChannelHandler, FakeInvalidations]:
    """A handler for the deliveries of ``message``'s channel (counting into ``metrics`` when given)."""
    sink = FakeInvalidations()
    handler = EventHandler(
        processor=processor,
        publisher=publisher,
        invalidations=sink,
        telemetry=EventTelemetry(metrics or Metrics(), UntracedEvents(), Topology()),
        policy=POLICY,
        identity=identity or IdentityRule(),
        topology=Topology(),
        stopping=asyncio.Event(),
    )
    return ChannelHandler(handler, Acks(message.channel)), sink


def delivery(body: dict[str, Any] | bytes, attempts: int | None = None) -> FakeMessage:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    if attempts:  # a retry copy, back from a retry queue
        return FakeMessage(
            raw, headers={"x-ltm-attempts": attempts}, exchange="", routing_key="ltm.create_memory"
        )
    return FakeMessage(raw)


EVENT = event_body({"memory_content": "x", "memory_scope": "server_wide"}, persona_id=1)


async def test_a_processed_event_is_published_then_acked() -> None:
    publisher = FakePublisher()
    message = delivery(EVENT)
    handler, sink = handler_with(FakeProcessor(saved(EVENT["event_id"])), publisher, message)
    await handler.handle(message)
    assert message.settled == "ack"
    assert [event_id for event_id, _ in publisher.outputs] == [EVENT["event_id"]]
    assert sink.published[0]["event_id"] == EVENT["event_id"]


async def test_a_transient_fault_goes_to_the_retry_queue_of_its_tier_and_is_acked() -> None:
    publisher = FakePublisher()
    message = delivery(EVENT, attempts=1)  # the second attempt fails
    handler, _ = handler_with(FakeProcessor(TransientError("db down")), publisher, message)
    await handler.handle(message)
    assert publisher.retries == [("ltm.create_memory.retry.200", 2, 200)]
    assert message.settled == "ack"
    assert publisher.outputs == []


async def test_the_last_attempt_is_dead_lettered_with_a_db_error_result() -> None:
    publisher = FakePublisher()
    message = delivery(EVENT, attempts=2)
    handler, _ = handler_with(FakeProcessor(TransientError("db down")), publisher, message)
    await handler.handle(message)
    assert publisher.dead_letters == [(DeadLetterKind.TRANSIENT_EXHAUSTED, 3)]
    [(_, result)] = publisher.outputs
    assert result["status"] == Status.DB_ERROR
    assert message.settled == "ack"


async def test_a_bug_is_dead_lettered_with_an_internal_error_result() -> None:
    publisher = FakePublisher()
    message = delivery(EVENT)
    handler, _ = handler_with(FakeProcessor(ZeroDivisionError("oops")), publisher, message)
    await handler.handle(message)
    assert publisher.dead_letters == [(DeadLetterKind.INTERNAL, 1)]
    [(_, result)] = publisher.outputs
    assert result["status"] == Status.INTERNAL_ERROR
    assert message.settled == "ack"


@pytest.mark.parametrize(
    ("body", "kind", "answered"),
    [
        (b"not json", DeadLetterKind.MALFORMED, False),
        (
            {"schema_version": 1, "event_id": str(uuid.uuid4()), "tool_call_id": "c", "shard_id": 77},
            DeadLetterKind.SCHEMA,
            True,
        ),
    ],
)
async def test_an_unreadable_body_is_dead_lettered_at_once(
    body: dict[str, Any] | bytes, kind: str, answered: bool
) -> None:
    publisher = FakePublisher()
    message = delivery(body)
    handler, _ = handler_with(FakeProcessor(AssertionError("never processed")), publisher, message)
    await handler.handle(message)
    assert publisher.dead_letters == [(kind, 1)]
    assert bool(publisher.outputs) is answered
    assert message.settled == "ack"


async def test_an_unroutable_failure_result_still_acks_once_the_dead_letter_is_confirmed() -> None:
    publisher = FakePublisher(fail={"outputs": TransientError("NO_ROUTE")})
    body = {"schema_version": 1, "event_id": str(uuid.uuid4()), "tool_call_id": "c", "shard_id": 77}
    message = delivery(body)
    handler, _ = handler_with(FakeProcessor(AssertionError("never processed")), publisher, message)
    await handler.handle(message)
    assert publisher.dead_letters == [(DeadLetterKind.SCHEMA, 1)]
    assert message.settled == "ack"


@pytest.mark.parametrize("operation", ["dead_letter", "retry"])
async def test_a_refused_copy_hands_the_delivery_back_once(
    operation: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("worker.runtime.delivery.UNSETTLED_REQUEUE_SECONDS", 0.01)
    publisher = FakePublisher(fail={operation: TransientError("refused")})
    answer = TransientError("db down") if operation == "retry" else ZeroDivisionError("bug")
    message = delivery(EVENT)
    handler, _ = handler_with(FakeProcessor(answer), publisher, message)
    await handler.handle(message)
    assert message.settled == "nack"
    assert message.channel.requeued[message.delivery_tag] is True


async def test_a_lost_channel_leaves_the_delivery_to_the_broker() -> None:
    publisher = FakePublisher()
    message = delivery(EVENT)
    handler, _ = handler_with(FakeProcessor(TransientError("connection reset")), publisher, message)
    message.channel.is_closed = True
    await handler.handle(message)
    assert message.settled is None
    assert publisher.retries == publisher.dead_letters == []


async def test_a_failed_ack_after_publishing_does_not_route_the_event_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the delivery is handed back after the pause: a short one here (1 s in the worker)
    monkeypatch.setattr("worker.runtime.delivery.UNSETTLED_REQUEUE_SECONDS", 0.01)
    publisher = FakePublisher()
    message = delivery(EVENT)
    handler, _ = handler_with(FakeProcessor(saved(EVENT["event_id"])), publisher, message)
    message.channel.ack_fails = True
    await handler.handle(message)
    assert publisher.retries == publisher.dead_letters == []
    assert len(publisher.outputs) == 1


async def test_an_event_id_conflict_is_dead_lettered_and_answered_with_the_refusal_only() -> None:
    publisher = FakePublisher()
    message = delivery(EVENT)
    refusal = saved(EVENT["event_id"]).result.model_copy(update={"status": Status.INTERNAL_ERROR})
    conflict = ProcessedEvent(Status.INTERNAL_ERROR, None, refusal, None, None, False, Conflict(9))
    handler, sink = handler_with(FakeProcessor(conflict), publisher, message)
    with capture_logs() as logs:
        await handler.handle(message)
    assert publisher.dead_letters == [(DeadLetterKind.EVENT_CONFLICT, 1)]
    [(_, result)] = publisher.outputs
    assert result["data"]["reason"] == outcome.EVENT_CONFLICT_REASON  # the settle policy's refusal
    assert sink.published == []
    assert message.settled == "ack"
    assert {"event": "event id conflict", "stored_shard_id": 9, "log_level": "warning"} in logs


def sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


async def test_an_answered_event_is_counted_timed_and_logged_once() -> None:
    metrics = Metrics()
    message = delivery(EVENT)
    handler, _ = handler_with(FakeProcessor(saved(EVENT["event_id"])), FakePublisher(), message, metrics)
    with capture_logs() as logs:
        await handler.handle(message)
    assert sample(metrics, "ltm_events_total", status=Status.SAVED) == 1
    assert sample(metrics, "ltm_event_duration_seconds_count") == 1
    assert sample(metrics, "ltm_event_age_seconds_count") == 1
    assert sample(metrics, "ltm_events_in_flight") == 0
    [line] = [line for line in logs if line["event"] == "event processed"]
    assert {key: line[key] for key in ("status", "memory_id", "replayed", "log_level")} == {
        "status": Status.SAVED,
        "memory_id": 7,
        "replayed": False,
        "log_level": "info",
    }
    assert isinstance(line["duration_ms"], float)


async def test_a_retry_and_a_dead_letter_are_counted_and_logged() -> None:
    metrics = Metrics()
    retried = delivery(EVENT)
    handler, _ = handler_with(FakeProcessor(TransientError("db down")), FakePublisher(), retried, metrics)
    with capture_logs() as logs:
        await handler.handle(retried)
    assert sample(metrics, "ltm_retries_total") == 1
    assert [(line["event"], line["retry_in_ms"]) for line in logs if "retry_in_ms" in line] == [
        ("transient fault; retrying later", 100)
    ]
    failed = delivery(EVENT)
    handler, _ = handler_with(FakeProcessor(ZeroDivisionError("oops")), FakePublisher(), failed, metrics)
    with capture_logs() as logs:
        await handler.handle(failed)
    assert sample(metrics, "ltm_dead_letters_total", kind="internal") == 1
    assert [line["event"] for line in logs] == ["internal error; dead-lettered"]
    assert sample(metrics, "ltm_events_total", status=Status.SAVED) is None  # neither was answered


async def test_an_unreadable_body_is_counted_as_its_kind_and_logged() -> None:
    metrics = Metrics()
    message = delivery(b"not json")
    handler, _ = handler_with(
        FakeProcessor(AssertionError("never processed")), FakePublisher(), message, metrics
    )
    with capture_logs() as logs:
        await handler.handle(message)
    assert sample(metrics, "ltm_dead_letters_total", kind="malformed") == 1
    assert sample(metrics, "ltm_event_age_seconds_count") == 0  # no event, no age
    assert [(line["event"], line["kind"]) for line in logs] == [
        ("dead-lettered unreadable event", "malformed")
    ]


async def turn_away(
    handler: ChannelHandler, message: FakeMessage, *, sender: Sender, letter: int | None
) -> None:
    await handler.handler.turn_away(message, handler.acks, "full", sender=sender, letter=letter)  # type: ignore[arg-type]


async def test_an_event_turned_away_without_a_letter_is_answered_then_acked() -> None:
    """A shard over its bound keeps one dead letter a minute: the others are answered and acked, unkept."""
    publisher = FakePublisher()
    message = delivery(EVENT)
    handler, _ = handler_with(FakeProcessor(saved(EVENT["event_id"])), publisher, message)
    sender = Sender(None)
    await turn_away(handler, message, sender=sender, letter=None)
    assert message.settled == "ack"
    assert publisher.dead_letters == []
    [(_, result)] = publisher.outputs
    assert result["status"] == Status.INTERNAL_ERROR


async def test_an_event_turned_away_keeps_its_letter_with_the_count_or_when_it_cannot_be_answered() -> None:
    publisher = FakePublisher()
    message = delivery(EVENT)
    handler, _ = handler_with(FakeProcessor(saved(EVENT["event_id"])), publisher, message)
    await turn_away(handler, message, sender=Sender(None), letter=41)
    assert publisher.dead_letters == [(DeadLetterKind.SHARD_BACKLOG_FULL, 1)]
    assert publisher.letter_headers == [{"x-ltm-turned-away": 41}]
    assert message.settled == "ack"

    unanswerable = FakePublisher(fail={"outputs": TransientError("no route")})
    message = delivery(EVENT)
    handler, _ = handler_with(FakeProcessor(saved(EVENT["event_id"])), unanswerable, message)
    await turn_away(handler, message, sender=Sender(None), letter=None)
    assert unanswerable.dead_letters == [(DeadLetterKind.SHARD_BACKLOG_FULL, 1)], (
        "no answer: a letter keeps it"
    )
    assert message.settled == "ack"
