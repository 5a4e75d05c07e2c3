"""The one set of fakes for the broker, the publisher and Postgres, for tests that run the worker's parts in
process (the real ones are in tests/integration). Each fake records what the worker did to it."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from contracts.models import ToolResult
from tests.factories import published
from worker.service.process import ProcessedEvent


@dataclass
class FakeChannel:
    """aiormq's channel as :class:`worker.broker.acks.Acks` uses it, with the broker's bookkeeping of one
    channel: the outstanding deliveries and how each was settled. A frame for a tag that is not outstanding
    (never delivered, or settled already) is what closes a real channel (PRECONDITION_FAILED, unknown
    delivery tag): here it fails the test. ``is_closed`` makes every frame fail as on a lost channel,
    ``ack_fails`` only the acks."""

    outstanding: set[int] = field(default_factory=set)
    #: tag -> "ack" or "nack"
    settled: dict[int, str] = field(default_factory=dict)
    #: every frame sent: (kind, delivery tag, multiple)
    frames: list[tuple[str, int, bool]] = field(default_factory=list)
    #: tag -> the requeue flag of the nack that settled it
    requeued: dict[int, bool] = field(default_factory=dict)
    is_closed: bool = False
    ack_fails: bool = False

    def deliver(self, count: int) -> list[int]:
        """``count`` new deliveries on this channel; their tags."""
        first = max([*self.outstanding, *self.settled], default=0) + 1
        tags = list(range(first, first + count))
        self.outstanding.update(tags)
        return tags

    async def basic_ack(self, delivery_tag: int, multiple: bool = False, wait: bool = True) -> None:
        if self.is_closed or self.ack_fails:
            raise ConnectionError("channel closed")
        self._settle("ack", delivery_tag, multiple)

    async def basic_nack(
        self, delivery_tag: int, multiple: bool = False, requeue: bool = True, wait: bool = True
    ) -> None:
        if self.is_closed:
            raise ConnectionError("channel closed")
        for tag in self._settle("nack", delivery_tag, multiple):
            self.requeued[tag] = requeue

    def _settle(self, kind: str, tag: int, multiple: bool) -> list[int]:
        self.frames.append((kind, tag, multiple))
        assert tag in self.outstanding, f"{kind} of unknown delivery tag {tag}"
        covered = [t for t in sorted(self.outstanding) if t == tag or (multiple and t < tag)]
        for t in covered:
            self.outstanding.discard(t)
            self.settled[t] = kind
        return covered


@dataclass
class FakeMessage:
    """What the handler uses of an aio-pika delivery, delivered on ``channel`` (a new one unless given):
    ``settled`` says how the broker saw it settled."""

    body: bytes
    headers: dict[str, Any] = field(default_factory=dict)
    message_id: str | None = None
    timestamp: datetime | None = None  # the AMQP property (ltm_queue_wait_seconds reads it)
    redelivered: bool = False
    channel: FakeChannel = field(default_factory=FakeChannel)
    #: a shard's event comes through the tool-calls exchange; the worker's retry copy through the default one
    exchange: str = "tomori.tool_calls"
    routing_key: str = "tool.create_long_term_memory"
    #: the AMQP user_id the shard set (RabbitMQ checked it against the publishing connection)
    user_id: str | None = None
    delivery_tag: int = field(init=False)

    def __post_init__(self) -> None:
        [self.delivery_tag] = self.channel.deliver(1)

    @property
    def settled(self) -> str | None:
        """ "ack", "nack" or None (still outstanding)."""
        return self.channel.settled.get(self.delivery_tag)


@dataclass
class FakePublisher:
    """Records what :class:`worker.broker.publisher.Publisher` was asked to publish."""

    outputs: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    dead_letters: list[tuple[str, int]] = field(default_factory=list)
    #: the worker's extra headers on each dead letter
    letter_headers: list[dict[str, Any]] = field(default_factory=list)
    retries: list[tuple[str, int, int]] = field(default_factory=list)
    #: exceptions to raise, by operation ("outputs", "dead_letter", "retry")
    fail: dict[str, Exception] = field(default_factory=dict)
    #: the sender recorded on each copy (x-ltm-user-id; "" for none), in order
    senders: list[str] = field(default_factory=list)

    async def publish_outputs(self, *, result: ToolResult, **kwargs: Any) -> None:
        if "outputs" in self.fail:
            raise self.fail["outputs"]
        self.outputs.append((str(kwargs["event_id"]), published(result)))

    async def dead_letter(
        self, message: Any, *, kind: str, error: str, attempts: int, sender: Any, headers: Any = None
    ) -> None:
        if "dead_letter" in self.fail:
            raise self.fail["dead_letter"]
        self.dead_letters.append((kind, attempts))
        self.letter_headers.append(dict(headers or {}))
        self.senders.append(sender.recorded())

    async def retry_later(
        self, message: Any, *, queue: str, attempts: int, delay_ms: int, sender: Any, error: str = ""
    ) -> None:
        if "retry" in self.fail:
            raise self.fail["retry"]
        self.retries.append((queue, attempts, delay_ms))
        self.senders.append(sender.recorded())


@dataclass
class FakeProcessor:
    """Postgres (the batcher) answering every event with ``answer``, or raising it."""

    answer: ProcessedEvent | Exception
    processed: int = 0

    async def process(self, event: Any, attempts: int = 1) -> ProcessedEvent:
        self.processed += 1
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer
