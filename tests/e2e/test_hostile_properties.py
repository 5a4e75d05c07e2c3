"""Properties and headers no client library would send (security review 3, section 2) never cost the worker
its connection: it answers the event, its copies fit the frame, and ``worker dlq`` reads such letters.

Each message goes on the wire byte by byte (:mod:`tests.amqp_raw`), interleaved with ordinary events."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import aiormq
import pytest

from contracts.models import DeadLetterKind
from sim import amqp_raw as raw
from sim.shard import TOOL_ROUTING_KEY
from tests.e2e.stack import Stack
from tests.factories import event_body
from tests.support.harness import Shard, take_dead_letters

pytestmark = pytest.mark.e2e

LOST = "rabbitmq connection lost; reconnecting"
LEFT_OUT = "message properties could not be decoded; left out"
#: RabbitMQ's default frame_max, and what a content header frame may carry within it
FRAME_MAX = 131_072


def hostile_cases(event_id: str) -> dict[str, raw.RawProperties]:
    """Review 3, section 2: each one killed the worker's connection on every delivery."""
    mid = event_id.encode()
    microseconds = int(time.time() * 1_000_000)
    return {
        "a microsecond timestamp": raw.properties(message_id=mid, timestamp_seconds=microseconds),
        "timestamp 2^64-1": raw.properties(message_id=mid, timestamp_seconds=2**64 - 1),
        "a T header out of range": raw.properties(
            message_id=mid, headers=raw.entries([(b"sent-at", raw.timestamp(microseconds))])
        ),
        "a message_id that is not UTF-8": raw.properties(message_id=b"\xff\xfe" + mid[2:]),
        "a header key that is not UTF-8": raw.properties(
            message_id=mid, headers=raw.entries([(b"\xc3(", raw.long_long(1))])
        ),
        "a table nested 5,000 deep": raw.properties(message_id=mid, headers=raw.deep_table(5_000)),
    }


CASE_NAMES = list(hostile_cases(str(uuid.uuid4())))


async def publish_raw(url: str, body: bytes, properties: raw.RawProperties, **where: str) -> None:
    connection = await aiormq.connect(url)
    try:
        channel = await connection.channel()
        await channel.basic_publish(body, properties=properties, **where)
    finally:
        await connection.close()


async def publish_each_case(
    url: str,
    make_event: Callable[[int], dict[str, Any]],
    exchange: str,
    after_each: Callable[[int], Awaitable[None]] | None = None,
) -> dict[str, dict[str, Any]]:
    """One event per hostile case, its properties naming its own event id, sent to ``exchange`` (and
    ``after_each`` awaited after each); the events by case."""
    sent: dict[str, dict[str, Any]] = {}
    for n, name in enumerate(CASE_NAMES):
        event = make_event(n)
        properties = hostile_cases(event["event_id"])[name]
        await publish_raw(
            url, json.dumps(event).encode(), properties, exchange=exchange, routing_key=TOOL_ROUTING_KEY
        )
        sent[name] = event
        if after_each is not None:
            await after_each(n)
    return sent


async def test_undecodable_properties_are_answered_and_never_cost_the_connection(stack: Stack) -> None:
    world = await stack.rows.world()
    worker = stack.worker()
    await stack.workers_ready()

    def body(text: str) -> dict[str, Any]:
        return event_body(
            {"memory_content": text, "memory_scope": "server_wide"}, persona_id=world.persona_id
        )

    good: list[dict[str, Any]] = []
    async with Shard(stack.rabbitmq_url) as shard:

        async def three_ordinary(n: int) -> None:
            for m in range(3):
                good.append(body(f"good {n}.{m}"))
                await shard.publish(good[-1])

        hostile = await publish_each_case(
            stack.rabbitmq_url, lambda n: body(f"hostile {n}"), "tomori.tool_calls", three_ordinary
        )
        ids = [e["event_id"] for e in [*hostile.values(), *good]]
        await shard.wait_for_results(ids, timeout=60)

    for event_id in ids:
        [result] = shard.received.results[event_id]
        assert result["success"] is True, result
    assert worker.count(LOST) == 0
    left_out = [line for line in worker.lines() if line.get("event") == LEFT_OUT]
    assert len(left_out) == len(hostile)
    notes = " | ".join(" ".join(line["fields"]) for line in left_out)
    for needle in (
        "timestamp: ",
        "is out of range",
        "message_id: not UTF-8",
        "key is not UTF-8",
        "nested deeper",
    ):
        assert needle in notes
    assert worker.proc is not None
    assert worker.proc.poll() is None


async def test_a_header_table_just_under_the_frame_still_dead_letters(stack: Stack) -> None:
    """The dead-letter copy adds the x-ltm-* headers to a table that already fills the frame: the largest
    original entries make room, named in x-ltm-dropped, and the connection stays up."""
    await stack.rows.world()
    worker = stack.worker()
    await stack.workers_ready()
    # a malformed body with headers that fill the incoming frame to within 40 bytes
    message_id = str(uuid.uuid4()).encode()

    def filled(size: int) -> raw.RawProperties:
        filler = raw.entries([(b"filler", raw.longstr(b"f" * size)), (b"case", raw.longstr(b"frame"))])
        return raw.properties(message_id=message_id, headers=filler)

    properties = filled(130_000)
    properties = filled(130_000 + FRAME_MAX - 40 - (20 + len(properties.marshal())))
    assert 20 + len(properties.marshal()) == FRAME_MAX - 40
    await publish_raw(
        stack.rabbitmq_url,
        b"\xff not json",
        properties,
        exchange="tomori.tool_calls",
        routing_key=TOOL_ROUTING_KEY,
    )
    [letter] = await take_dead_letters(stack.rabbitmq_url, 1, timeout=60)
    assert letter.headers["x-ltm-error-kind"] == DeadLetterKind.MALFORMED
    assert letter.headers["case"] == "frame"
    assert "filler" not in letter.headers
    [note] = letter.headers["x-ltm-dropped"]
    assert note.startswith("headers.filler: ")
    assert letter.routing_key == TOOL_ROUTING_KEY
    assert worker.count(LOST) == 0


async def test_the_dlq_commands_read_letters_with_undecodable_properties(stack: Stack) -> None:
    """Letters a broker dead-lettered with their properties as sent (before this worker version, or by the
    work queue's delivery limit): list, show, replay and purge all work on them."""
    world = await stack.rows.world()
    stack.worker()
    await stack.workers_ready()

    def replayable(n: int) -> dict[str, Any]:
        arguments = {"memory_content": f"replayed {n}", "memory_scope": "server_wide"}
        return event_body(arguments, persona_id=world.persona_id)

    async with Shard(stack.rabbitmq_url) as shard:
        sent = await publish_each_case(stack.rabbitmq_url, replayable, "tomori.dead_letter")
        events = {event["event_id"]: name for name, event in sent.items()}

        listed = await asyncio.to_thread(stack.cli, "dlq", "list")
        assert listed.returncode == 0, listed.stderr
        for event_id in events:
            assert event_id in listed.stdout
        as_json = await asyncio.to_thread(stack.cli, "dlq", "list", "--json")
        assert as_json.returncode == 0, as_json.stderr
        assert {json.loads(line)["event_id"] for line in as_json.stdout.splitlines()} == set(events)
        some_id = next(iter(events))
        shown = await asyncio.to_thread(stack.cli, "dlq", "show", some_id)
        assert shown.returncode == 0, shown.stderr
        assert "x-ltm-undecodable" in shown.stdout
        dry = await asyncio.to_thread(stack.cli, "dlq", "replay", "--dry-run")
        assert dry.returncode == 0, dry.stderr

        replayed = await asyncio.to_thread(stack.cli, "dlq", "replay", "--event-id", some_id)
        assert replayed.returncode == 0, replayed.stderr
        await shard.wait_for_results([some_id], timeout=60)
        assert shard.received.results[some_id][0]["success"] is True

        purged = await asyncio.to_thread(stack.cli, "dlq", "purge", "--yes")
        assert purged.returncode == 0, purged.stderr
        again = await asyncio.to_thread(stack.cli, "dlq", "list", "--json")
        assert again.returncode == 0, again.stderr
        assert again.stdout.strip() == ""
