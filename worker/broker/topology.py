"""The RabbitMQ topology of CONTRACT.md, declared idempotently at start-up.

Work queue ``ltm.create_memory``: a quorum queue whose own dead-lettering (a message redelivered more
than ``delivery_limit`` times, i.e. one that keeps killing workers) goes to ``tomori.dead_letter`` with
RabbitMQ's at-least-once strategy, so the broker never drops it on the way to the DLQ.

Retry queues ``ltm.create_memory.retry.<ms>``: one per backoff tier; a message waits there for its
per-message expiration, then the broker dead-letters it back to the work queue through the default
exchange. Per-message TTL only expires at the head of a queue, hence one queue per tier.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractExchange, AbstractQueue

from contracts.names import retry_queue, shard_tool_routing_key, shard_work_queue
from worker.config import Topology

#: a delivery redelivered this many times (consumer crashes, channel losses) goes to the DLQ
DEFAULT_DELIVERY_LIMIT = 20
#: the DLQ's own limit: in effect none. RabbitMQ 4.x gives quorum queues a default of 20, and the DLQ has
#: no dead-letter exchange, so over a limit a dead letter would be dropped; `worker dlq list` puts back
#: what it reads, and a few hundred inspections must never cost a dead letter
DEAD_LETTER_QUEUE_DELIVERY_LIMIT = 1_000_000


def work_queue_arguments(topology: Topology, delivery_limit: int = DEFAULT_DELIVERY_LIMIT) -> dict[str, Any]:
    """Arguments of ``ltm.create_memory``; the definitions file under deploy/ must carry the same."""
    return {
        "x-queue-type": "quorum",
        "x-delivery-limit": delivery_limit,
        "x-dead-letter-exchange": topology.dead_letter_exchange,
        "x-dead-letter-strategy": "at-least-once",
        # at-least-once dead-lettering requires reject-publish (drop-head silently falls back)
        "x-overflow": "reject-publish",
    }


def dead_letter_queue_arguments() -> dict[str, Any]:
    """Arguments of ``ltm.create_memory.dlq``; the definitions file under deploy/ must carry the same."""
    return {"x-queue-type": "quorum", "x-delivery-limit": DEAD_LETTER_QUEUE_DELIVERY_LIMIT}


def retry_queue_arguments(topology: Topology) -> dict[str, Any]:
    """A retry tier: quorum, dead-lettering expired messages back to the work queue, at least once."""
    return {
        "x-queue-type": "quorum",
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": topology.work_queue,
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
    }


def retry_queue_name(topology: Topology, delay_ms: int) -> str:
    return retry_queue(delay_ms, topology.retry_queue_prefix)


def shard_queue_name(topology: Topology, shard_id: int) -> str:
    """``ltm.create_memory.shard.<N>``: shard N's own queue."""
    return shard_work_queue(shard_id, topology.shard_queue_prefix)


def shard_routing_keys(topology: Topology, shard_id: int) -> list[str]:
    """The routing keys a shard may publish its own events with (``tool.<name>.shard.<N>``, an optional
    addition within contract version 1): the broker routes them straight into the shard's own queue."""
    return [shard_tool_routing_key(key, shard_id) for key in topology.routing_keys]


def shard_queue_arguments(topology: Topology, delivery_limit: int = DEFAULT_DELIVERY_LIMIT) -> dict[str, Any]:
    """A shard's own queue: the work queue's arguments (quorum, dead-lettering at least once), so an event
    fares the same in either. Its bound is a policy (deploy/rabbitmq/definitions.json), which an operator
    can change without deleting the queue; ``reject-publish`` refuses the shard's publishes past it."""
    return work_queue_arguments(topology, delivery_limit)


async def declare_shard_queue(
    channel: AbstractChannel,
    topology: Topology,
    shard_id: int,
    delivery_limit: int = DEFAULT_DELIVERY_LIMIT,
) -> AbstractQueue:
    """Declare shard ``shard_id``'s own queue and bind it with the shard's routing keys (idempotent)."""
    queue = await channel.declare_queue(
        shard_queue_name(topology, shard_id),
        durable=True,
        arguments=shard_queue_arguments(topology, delivery_limit),
    )
    for key in shard_routing_keys(topology, shard_id):
        await queue.bind(topology.tool_calls_exchange, routing_key=key)
    return queue


@dataclass(frozen=True, slots=True)
class Declared:
    """Handles on the declared topology for one channel."""

    work_queue: AbstractQueue
    results: AbstractExchange
    notifications: AbstractExchange
    dead_letter: AbstractExchange
    tool_calls: AbstractExchange


async def declare_topology(
    channel: AbstractChannel,
    topology: Topology,
    delays_ms: list[int],
    delivery_limit: int = DEFAULT_DELIVERY_LIMIT,
) -> Declared:
    """Declare every exchange and queue the worker uses (idempotent; fails if one exists with other args)."""
    topic = aio_pika.ExchangeType.TOPIC
    tool_calls = await channel.declare_exchange(topology.tool_calls_exchange, topic, durable=True)
    results = await channel.declare_exchange(topology.results_exchange, topic, durable=True)
    notifications = await channel.declare_exchange(topology.notifications_exchange, topic, durable=True)
    dead_letter = await channel.declare_exchange(topology.dead_letter_exchange, topic, durable=True)

    dlq = await channel.declare_queue(
        topology.dead_letter_queue, durable=True, arguments=dead_letter_queue_arguments()
    )
    await dlq.bind(dead_letter, routing_key="#")
    # the same letters again, for the workers to keep in Postgres (worker/runtime/keeper.py); the DLQ stays
    # what RabbitMQ's own tools and a replay read
    copies = await channel.declare_queue(
        topology.dead_letter_copies_queue, durable=True, arguments=dead_letter_queue_arguments()
    )
    await copies.bind(dead_letter, routing_key="#")

    work = await channel.declare_queue(
        topology.work_queue, durable=True, arguments=work_queue_arguments(topology, delivery_limit)
    )
    for key in topology.routing_keys:
        await work.bind(tool_calls, routing_key=key)

    for delay in delays_ms:
        await channel.declare_queue(
            retry_queue_name(topology, delay),
            durable=True,
            arguments=retry_queue_arguments(topology),
        )
    return Declared(work, results, notifications, dead_letter, tool_calls)
