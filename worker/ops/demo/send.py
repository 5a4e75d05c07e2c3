"""``worker demo send``: the example event published as a shard does, then its result and notice printed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import aio_pika
import aiormq

from contracts.models import ShardQueueKind, Status, shard_queue
from contracts.names import shard_routing_key, tool_routing_key
from worker.broker.events import tool_call_message
from worker.broker.urls import connect_any
from worker.config import Settings
from worker.faults import explain
from worker.ops.demo.example import (
    DEFAULT_SHARD,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_UNREACHABLE,
    cannot_reach,
    example_event,
    fail,
    say,
)
from worker.redact import redact_setting


async def _wait_for_worker(
    connection: aio_pika.abc.AbstractConnection, settings: Settings, deadline: float
) -> bool:
    """True once the tool-call exchange exists and the work queue has a consumer; False at ``deadline``."""
    topology = settings.topology
    said = False
    while True:
        channel = await connection.channel()
        try:
            await channel.get_exchange(topology.tool_calls_exchange, ensure=True)
            queue = await channel.declare_queue(topology.work_queue, passive=True)
            consumers = queue.declaration_result.consumer_count
        except aiormq.exceptions.ChannelNotFoundEntity:
            consumers = 0  # not declared yet: no worker has started on this vhost
        finally:
            with contextlib.suppress(Exception):
                await channel.close()
        if consumers:
            return True
        if time.monotonic() >= deadline:
            return False
        if not said:
            say(f"waiting for a worker to consume {topology.work_queue} (start `worker run`) ...")
            said = True
        await asyncio.sleep(0.25)


def user_of(url: str) -> str | None:
    """The user a connection to the AMQP ``url`` logs in as (``guest`` when it names none), for the
    ``user_id`` property; None for a login by TLS certificate (``auth_mechanism=external``), whose user
    the broker takes from the certificate."""
    parts = urlsplit(url)
    mechanisms = parse_qs(parts.query).get("auth_mechanism", [""])
    if mechanisms[-1].lower() == "external":
        return None
    return unquote(parts.username) if parts.username else "guest"


async def send(
    settings: Settings, *, scope: str, content: str | None, timeout: float, shard: int = DEFAULT_SHARD
) -> int:
    """Publish the example event as shard ``shard`` would, and print its result and notice. The event's
    ``user_id`` is the connection's user: RabbitMQ refuses any other, and a worker that checks shard
    identity takes shard N's events from user ``shard-N`` (CONTRACT.md)."""
    deadline = time.monotonic() + timeout
    try:
        connection, node = await connect_any(settings.rabbitmq_url)
    except Exception as exc:  # refused, unresolvable, access refused, no such vhost
        cannot_reach("RabbitMQ", settings.rabbitmq_url, exc)
        return EXIT_UNREACHABLE
    topology = settings.topology
    try:
        if not await _wait_for_worker(connection, settings, deadline):
            fail(f"no worker consumes {topology.work_queue} on {redact_setting(node)} after {timeout:g} s")
            return EXIT_UNREACHABLE
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        queues: dict[str, aio_pika.abc.AbstractQueue] = {}
        kinds: tuple[tuple[ShardQueueKind, str], ...] = (
            ("results", topology.results_exchange),
            ("notifications", topology.notifications_exchange),
        )
        for kind, exchange_name in kinds:
            exchange = await channel.get_exchange(exchange_name, ensure=True)
            queue = await channel.declare_queue(shard_queue(shard, kind), durable=True)
            await queue.bind(exchange, shard_routing_key(shard))
            queues[kind] = queue
        event = example_event(scope, content, shard=shard)
        tool_calls = await channel.get_exchange(topology.tool_calls_exchange, ensure=True)
        await tool_calls.publish(
            tool_call_message(event, json.dumps(event).encode(), user_id=user_of(node)),
            routing_key=tool_routing_key(event["tool_name"]),
            mandatory=True,
        )
        say(
            f"sent event {event['event_id']} ({scope}: {event['arguments']['memory_content']!r}) as shard "
            f"{shard} to {redact_setting(node)}"
        )
        result = await _take(queues["results"], event["event_id"], deadline)
        if result is None:
            fail(f"no result for event {event['event_id']} within {timeout:g} s (is the worker running?)")
            return EXIT_UNREACHABLE
        say(f"result: {result.get('status')}")
        say(json.dumps(result, indent=2, ensure_ascii=False))
        if result.get("status") != Status.SAVED:
            if result.get("status") == Status.INTERNAL_ERROR:
                say("the worker's log says why: a WARNING `critical state missing` names the missing rows")
            return EXIT_FAILED
        notice = await _take(queues["notifications"], event["event_id"], deadline)
        if notice is None:
            fail(f"no notice for event {event['event_id']} within {timeout:g} s")
            return EXIT_UNREACHABLE
        say(f"notice: {notice['notice']['title']} - {notice['notice']['full_content']}")
        say(json.dumps(notice, indent=2, ensure_ascii=False))
        return EXIT_OK
    except Exception as exc:
        fail(f"RabbitMQ at {redact_setting(node)}: {explain(exc, node)}")
        return EXIT_UNREACHABLE
    finally:
        with contextlib.suppress(Exception):
            await connection.close()


async def _take(queue: aio_pika.abc.AbstractQueue, event_id: str, deadline: float) -> dict[str, Any] | None:
    """The body of the message for ``event_id`` from ``queue`` (acking whatever comes before it, as a
    shard acks what it has handled), or None at ``deadline``."""
    while time.monotonic() < deadline:
        message = await queue.get(no_ack=False, fail=False)
        if message is None:
            await asyncio.sleep(0.05)
            continue
        await message.ack()
        with contextlib.suppress(ValueError):
            body = json.loads(message.body)
            if isinstance(body, dict) and body.get("event_id") == event_id:
                return body
    return None
