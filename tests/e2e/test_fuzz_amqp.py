"""A fuzzer for the layer below the JSON body: generated AMQP properties, header tables (every field type the
broker accepts, nesting, keys and strings that are not UTF-8, timestamps of any 64-bit value, sizes up to the
frame) and bodies (sizes, depths, encodings), sent byte by byte and interleaved with ordinary events.

What must hold, whatever was sent: the worker never loses its connection; every ordinary event is answered
once; every generated message is answered or dead-lettered, never both twice; the work queue drains; and
``worker dlq list`` works afterwards. CI runs a small budget; ``LTM_FUZZ_AMQP_EXAMPLES=200`` a longer one.
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

import aio_pika
import aiormq
import pytest
from hypothesis import HealthCheck, Phase, given, note, settings
from hypothesis import strategies as st

from contracts.models import Status
from sim import amqp_raw as raw
from sim.shard import TOOL_ROUTING_KEY
from tests.e2e.stack import Stack
from tests.factories import event_body
from tests.support.harness import Shard, queue_depth
from worker.broker import content_header
from worker.broker.content_header import UNDECODABLE

pytestmark = pytest.mark.e2e

UNSETTLED = "delivery not settled; handing it back to the queue"
EXAMPLES = int(os.environ.get("LTM_FUZZ_AMQP_EXAMPLES", "4"))
FRAME_MAX = 131_072
#: what a content header frame carries besides the properties (frame header and end, class, weight, size)
OVERHEAD = 20

# -- values of a field table (the RabbitMQ errata's types; the broker refuses unknown ones at publish) -----

_scalars = st.one_of(
    st.builds(lambda v: b"t" + bytes([v]), st.integers(0, 255)),
    st.builds(lambda v: b"b" + struct.pack(">b", v), st.integers(-128, 127)),
    st.builds(lambda v: b"B" + bytes([v]), st.integers(0, 255)),
    st.builds(lambda v: b"s" + struct.pack(">h", v), st.integers(-(2**15), 2**15 - 1)),
    st.builds(lambda v: b"u" + struct.pack(">H", v), st.integers(0, 2**16 - 1)),
    st.builds(lambda v: b"I" + struct.pack(">i", v), st.integers(-(2**31), 2**31 - 1)),
    st.builds(lambda v: b"i" + struct.pack(">I", v), st.integers(0, 2**32 - 1)),
    st.builds(raw.long_long, st.integers(-(2**63), 2**63 - 1)),
    st.builds(lambda v: b"f" + struct.pack(">f", v), st.floats(width=32, allow_nan=True)),
    st.builds(lambda v: b"d" + struct.pack(">d", v), st.floats(allow_nan=True)),
    st.builds(lambda e, v: b"D" + bytes([e]) + struct.pack(">i", v), st.integers(0, 255), st.integers(-5, 5)),
    st.builds(raw.longstr, st.binary(max_size=64)),
    st.builds(raw.timestamp, st.integers(0, 2**64 - 1)),
    st.just(b"V"),
    st.builds(lambda v: b"x" + struct.pack(">I", len(v)) + v, st.binary(max_size=32)),
)
_keys = st.binary(max_size=12) | st.text(max_size=12).map(str.encode).filter(lambda k: len(k) < 256)
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.builds(lambda pairs: raw.nested(raw.entries(pairs)), st.lists(st.tuples(_keys, inner), max_size=4))
        | st.builds(raw.array, st.lists(inner, max_size=4))
    ),
    max_leaves=16,
)


@dataclass(frozen=True)
class Generated:
    body: bytes
    headers: bytes | None  # a table's payload
    message_id: bytes | None
    timestamp: int | None
    content_type: bytes | None
    message_type: bytes | None
    depth: int  # a deeply nested table appended to the headers (0: none)
    fill: float  # share of the frame a filler header takes (0: none)

    def properties(self) -> raw.RawProperties:
        headers = self.headers
        if self.depth:
            headers = (headers or b"") + raw.shortstr(b"deep") + raw.nested(raw.deep_table(self.depth))
        props = raw.properties(
            content_type=self.content_type,
            headers=headers,
            message_id=self.message_id,
            timestamp_seconds=self.timestamp,
            message_type=self.message_type,
        )
        if self.fill:
            room = FRAME_MAX - OVERHEAD - len(props.marshal()) - len(raw.shortstr(b"filler")) - 5 - 4
            filler = raw.shortstr(b"filler") + raw.longstr(b"f" * max(0, int(room * self.fill)))
            props = raw.properties(
                content_type=self.content_type,
                headers=(headers or b"") + filler,
                message_id=self.message_id,
                timestamp_seconds=self.timestamp,
                message_type=self.message_type,
            )
        return props


def _bodies(persona_id: int) -> st.SearchStrategy[bytes]:
    def valid(text: str) -> bytes:
        arguments = {"memory_content": text or "x", "memory_scope": "server_wide"}
        return json.dumps(event_body(arguments, persona_id=persona_id)).encode()

    def deep(depth: int) -> bytes:
        body = event_body({"memory_content": "x", "memory_scope": "server_wide"}, persona_id=persona_id)
        text = json.dumps(body)
        return text.replace('"x"', "[" * depth + "1" + "]" * depth, 1).encode()

    return st.one_of(
        st.builds(valid, st.text(max_size=80)),
        st.builds(deep, st.integers(1, 20_000)),
        st.binary(max_size=200),
        st.builds(lambda n: b'{"pad": "' + b"p" * n + b'"}', st.integers(0, 262_144 - 12)),
        st.builds(lambda text: text.encode("utf-16"), st.text(max_size=40)),
    )


def generated(persona_id: int) -> st.SearchStrategy[Generated]:
    return st.builds(
        Generated,
        body=_bodies(persona_id),
        headers=st.none() | st.lists(st.tuples(_keys, _values), max_size=6).map(raw.entries),
        message_id=st.none() | st.binary(max_size=40),
        timestamp=st.none() | st.integers(0, 2**64 - 1),
        content_type=st.none() | st.binary(max_size=20),
        message_type=st.none() | st.binary(max_size=20),
        depth=st.sampled_from([0, 0, 0, 40, 200, 3_000]),
        fill=st.sampled_from([0.0, 0.0, 0.0, 0.5, 0.99, 1.0]),
    )


def event_id_of(body: bytes) -> str | None:
    try:
        parsed: Any = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if isinstance(parsed, dict) and isinstance(parsed.get("event_id"), str):
        return str(parsed["event_id"])
    return None


async def drain_dead_letters(url: str, wanted: set[bytes], deadline: float) -> Counter[bytes]:
    """Take every dead letter until each ``wanted`` body was seen or the deadline; counts by body."""
    seen: Counter[bytes] = Counter()
    content_header.install()  # read what the broker hands out as the worker does, and say what it was
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel()
        dlq = await channel.declare_queue("ltm.create_memory.dlq", passive=True)
        while time.monotonic() < deadline and not wanted <= set(seen):
            message = await dlq.get(fail=False, no_ack=True)
            if message is None:
                await asyncio.sleep(0.1)
                continue
            seen[message.body] += 1
            # every dead letter here must be the worker's own copy: one without its x-ltm-error-kind came
            # from the broker (a delivery the worker never settled, dead-lettered at the delivery limit)
            headers = message.headers or {}
            assert "x-ltm-error-kind" in headers, (headers.get("x-death"), headers.get(UNDECODABLE))
        # a short quiet period: anything dead-lettered twice would show up now
        quiet = time.monotonic() + 1.0
        while time.monotonic() < quiet:
            message = await dlq.get(fail=False, no_ack=True)
            if message is None:
                await asyncio.sleep(0.1)
            else:
                seen[message.body] += 1
    finally:
        await connection.close()
    return seen


# no shrinking: each example costs seconds of a real broker and worker; a failure prints its batch instead
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
@given(data=st.data())
async def test_generated_properties_headers_and_bodies_never_stop_the_worker(
    stack: Stack, data: st.DataObject
) -> None:
    if not stack.workers:
        world = await stack.rows.world()
        stack.persona_id = world.persona_id  # type: ignore[attr-defined]
        stack.worker()
        await stack.workers_ready()
    persona_id: int = stack.persona_id  # type: ignore[attr-defined]
    batch = data.draw(st.lists(generated(persona_id), min_size=5, max_size=12))
    worker = stack.workers[0]
    unsettled_before = worker.count(UNSETTLED)

    sent: list[bytes] = []
    good: list[str] = []
    async with Shard(stack.rabbitmq_url) as shard:
        connection = await aiormq.connect(stack.rabbitmq_url)
        try:
            channel = await connection.channel()
            for n, message in enumerate(batch):
                # every body is unique, so its dead letter can be told apart: an event has a fresh event_id,
                # anything else gets a nonce
                body = message.body
                if event_id_of(body) is None:
                    body += f" #{uuid.uuid4().hex}-{n}".encode()
                try:
                    await channel.basic_publish(
                        body,
                        exchange="tomori.tool_calls",
                        routing_key=TOOL_ROUTING_KEY,
                        properties=message.properties(),
                    )
                    sent.append(body)
                except aiormq.exceptions.AMQPError:
                    # the broker refused it (it checks header tables too): nothing reached a worker
                    if connection.is_closed:
                        connection = await aiormq.connect(stack.rabbitmq_url)
                    channel = await connection.channel()
                arguments = {"memory_content": f"ordinary {n}", "memory_scope": "server_wide"}
                ordinary = event_body(arguments, persona_id=persona_id)
                await shard.publish(ordinary)
                good.append(ordinary["event_id"])
        finally:
            await connection.close()

        await shard.wait_for_results(good, timeout=120)
        answerable = {body: event_id for body in sent if (event_id := event_id_of(body)) is not None}
        deadline = time.monotonic() + 60
        letters = await drain_dead_letters(
            stack.rabbitmq_url, {b for b in sent if b not in answerable}, deadline
        )
        # the answered ones: a result, with or without a dead letter
        while time.monotonic() < deadline:
            missing = [
                b for b, e in answerable.items() if e not in shard.received.results and b not in letters
            ]
            if not missing:
                break
            await asyncio.sleep(0.2)
            letters += await drain_dead_letters(stack.rabbitmq_url, set(), time.monotonic())

    note(f"worker log tail: {worker.tail()[-3000:]}")
    # every message the worker could not settle would loop until the broker's delivery limit
    assert worker.count(UNSETTLED) == unsettled_before
    for event_id in good:
        [result] = shard.received.results[event_id]
        # a long run fills the server's memory limit: then the ordinary events are answered with it
        assert result["status"] in {Status.SAVED, Status.LIMIT_EXCEEDED}, result
    for body in sent:
        assert letters[body] <= 1, "dead-lettered twice"
        answered = body in answerable and answerable[body] in shard.received.results
        assert answered or letters[body] == 1, f"neither answered nor dead-lettered: {body[:120]!r}"
        if body in answerable:
            assert len(shard.received.results.get(answerable[body], [])) <= 1
    assert worker.count("rabbitmq connection lost; reconnecting") == 0
    assert worker.proc is not None
    assert worker.proc.poll() is None, "the worker died"
    assert await queue_depth(stack.rabbitmq_url, "ltm.create_memory") == 0
    listed = await asyncio.to_thread(stack.cli, "dlq", "list")
    assert listed.returncode == 0, listed.stderr
