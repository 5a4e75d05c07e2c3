"""Arbitrary bodies and arbitrary arguments: the worker never dies, every message ends as a result or a
dead letter, and the queue drains."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.e2e.stack import Stack
from tests.factories import event_body, member, participant
from tests.support.harness import Shard, queue_depth, take_dead_letters

pytestmark = pytest.mark.e2e

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False)
    | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
argument_values = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {
            "memory_content": st.one_of(st.text(max_size=60), json_values),
            "memory_scope": st.sampled_from(["server_wide", "target_user", "Server_Wide", ""]) | json_values,
        },
        optional={
            "target_user": st.text(max_size=20) | json_values,
            "target_user_nickname": json_values,
            "target_user_discord_id": json_values,
        },
    ),
)


def envelope_mutations(base: dict[str, Any]) -> st.SearchStrategy[Any]:
    """A valid envelope with one top-level or context field replaced by an arbitrary JSON value."""
    keys = st.sampled_from([*base, "unknown_key"])
    context_keys = st.sampled_from([*base["context"], "extra"])

    def top(pair: tuple[str, Any]) -> dict[str, Any]:
        return {**base, "event_id": str(uuid.uuid4()), pair[0]: pair[1]}

    def inner(pair: tuple[str, Any]) -> dict[str, Any]:
        return {**base, "event_id": str(uuid.uuid4()), "context": {**base["context"], pair[0]: pair[1]}}

    return st.tuples(keys, json_values).map(top) | st.tuples(context_keys, json_values).map(inner)


def bodies(persona_id: int) -> st.SearchStrategy[bytes]:
    members = [member("1150000000000000201", "sparrow", "Sparrow")]
    parts = [participant("@alice:matrix.org", "Alice", ["Alice"], is_bridge=True)]
    valid = st.builds(
        lambda args: event_body(args, persona_id=persona_id, members=members, participants=parts),
        argument_values,
    )
    base = event_body({"memory_content": "x", "memory_scope": "server_wide"}, persona_id=persona_id)
    as_json = (valid | envelope_mutations(base) | json_values).map(lambda v: json.dumps(v).encode())
    return as_json | st.binary(max_size=64)


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
async def test_arbitrary_messages_end_as_results_or_dead_letters(stack: Stack, data: st.DataObject) -> None:
    if not stack.workers:
        world = await stack.rows.world()
        await stack.rows.user("1150000000000000201")
        stack.persona_id = world.persona_id  # type: ignore[attr-defined]
        stack.worker()
        await stack.workers_ready()
    batch = data.draw(st.lists(bodies(stack.persona_id), min_size=20, max_size=40))  # type: ignore[attr-defined]

    async with Shard(stack.rabbitmq_url) as shard:
        tags = []
        for n, body in enumerate(batch):
            tag = f"fuzz-{uuid.uuid4().hex[:8]}-{n}"
            tags.append(tag)
            await shard.publish(body, headers={"fuzz-tag": tag})
        answered = await wait_until_settled(stack, shard, batch, tags)

    assert answered == set(tags)
    assert stack.workers[0].proc is not None
    assert stack.workers[0].proc.poll() is None, "the worker died"
    assert await queue_depth(stack.rabbitmq_url, "ltm.create_memory") == 0


async def wait_until_settled(stack: Stack, shard: Shard, batch: list[bytes], tags: list[str]) -> set[str]:
    """Tags of the messages that ended as a result (by event id) or as a dead letter (by header)."""
    expected_results = {}
    for tag, body in zip(tags, batch, strict=True):
        try:
            parsed = json.loads(body)
        except ValueError:
            continue
        if isinstance(parsed, dict) and isinstance(parsed.get("event_id"), str):
            expected_results[parsed["event_id"]] = tag
    answered: set[str] = set()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while loop.time() < deadline:
        answered |= {tag for event_id, tag in expected_results.items() if event_id in shard.received.results}
        missing = len(tags) - len(answered)
        if missing == 0:
            break
        try:
            letters = await take_dead_letters(stack.rabbitmq_url, 1, timeout=0.5)
        except AssertionError:
            continue
        answered |= {str(letter.headers.get("fuzz-tag")) for letter in letters}
    return answered
