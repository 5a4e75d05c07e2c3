"""What one worker process runs on: :class:`Services`, every long-lived part, ready (built by
:func:`worker.bootstrap.open_services`, the composition root), and the wiring of one connection's
:class:`~worker.runtime.handler.EventHandler` (:meth:`Services.handler_for`), the same for the consumer and
for the tests that build one.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import asyncpg
from aio_pika.abc import AbstractChannel

from worker.broker.publisher import Publisher
from worker.broker.topology import Declared
from worker.broker.urls import Nodes
from worker.config import Settings
from worker.invalidation.outbox import InvalidationOutbox
from worker.observability.metrics import Metrics
from worker.observability.probes import Readiness
from worker.observability.telemetry import EventTelemetry
from worker.observability.tracing import EventTracer
from worker.runtime.handler import EventHandler
from worker.service.batcher import Batcher
from worker.service.identity import IdentityRule
from worker.service.policy import RetryPolicy

__all__ = ["Services"]


@dataclass(frozen=True, slots=True)
class Services:
    """Everything one worker process uses for its whole life, every part ready."""

    settings: Settings
    policy: RetryPolicy
    metrics: Metrics
    tracer: EventTracer
    readiness: Readiness
    pool: asyncpg.Pool
    batcher: Batcher
    outbox: InvalidationOutbox
    #: the RabbitMQ nodes of LTM_RABBITMQ_URL; each reconnect starts with the node after the last one used
    nodes: Nodes

    def handler_for(
        self, publish_channel: AbstractChannel, declared: Declared, stopping: asyncio.Event
    ) -> EventHandler:
        """The handler of one connection: it publishes on ``publish_channel`` (confirm mode) to the exchanges
        ``declared`` on it; each delivery is settled through its own channel's acks."""
        return EventHandler(
            processor=self.batcher,
            publisher=Publisher.for_topology(publish_channel, declared),
            invalidations=self.outbox,
            telemetry=EventTelemetry(self.metrics, self.tracer, self.settings.topology),
            policy=self.policy,
            identity=IdentityRule.of(self.settings),
            topology=self.settings.topology,
            stopping=stopping,
        )
