"""The Python shard kit (``contracts.shard``) across a broker restart, as the TypeScript kit's
broker-restart test: calls whose events the broker confirmed (held in flight at Postgres) and calls made while
the broker is away (published once it is back) are all answered, each once, and nothing is saved twice.

A private RabbitMQ node (tests/e2e/cluster.py) is stopped and started; the worker is a ``worker run``
process. Waits are on what arrives, never on time alone."""

from __future__ import annotations

import asyncio
import secrets

import pytest

from contracts.models import Status, ToolResult
from contracts.shard import LtmClient
from tests.e2e.cluster import RabbitCluster, rabbitmq_stopped
from tests.e2e.stack import Stack
from tests.factories import BOT, CHANNEL, GUILD, TRIGGER

pytestmark = pytest.mark.e2e

WAIT = 120.0
LOCK = 4343


def context(persona_id: int) -> dict[str, object]:
    return {
        "guild_disc_id": GUILD,
        "channel_disc_id": CHANNEL,
        "triggering_user_disc_id": TRIGGER,
        "bot_user_disc_id": BOT,
        "persona_id": persona_id,
    }


async def waiting_at_postgres(stack: Stack) -> int:
    return int(
        await stack.rows.conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        )
    )


async def test_calls_across_a_broker_restart_are_answered_once(
    private_broker: RabbitCluster, private_broker_stack: Stack
) -> None:
    stack = private_broker_stack
    world = await stack.rows.world()
    conn = stack.rows.conn
    # every memory insert waits for an advisory lock the test holds: the first events stay in flight
    await conn.execute(f"""
        CREATE FUNCTION held_insert() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN PERFORM pg_advisory_xact_lock({LOCK}); RETURN NEW; END $$;
        CREATE TRIGGER held_insert BEFORE INSERT ON server_memories
            FOR EACH ROW EXECUTE FUNCTION held_insert();
    """)
    await conn.execute(f"SELECT pg_advisory_lock({LOCK})")
    worker = stack.worker()
    await worker.wait_for_log("consuming")
    client = await LtmClient.connect(stack.rabbitmq_url, 3, timeout=WAIT)

    def call(n: int) -> asyncio.Task[ToolResult]:
        return asyncio.create_task(
            client.create_memory(
                tool_call_id=f"call_restart_{n}_{secrets.token_hex(3)}",
                arguments={"memory_content": f"{{user}} likes restarts {n}", "memory_scope": "server_wide"},
                context=context(world.persona_id),
            )
        )

    try:
        held = [call(n) for n in range(3)]
        deadline = asyncio.get_running_loop().time() + WAIT
        while await waiting_at_postgres(stack) < 1:
            assert asyncio.get_running_loop().time() < deadline, "no event reached Postgres"
            await asyncio.sleep(0.05)
        async with rabbitmq_stopped(private_broker):
            await worker.wait_for_log("rabbitmq connection lost; reconnecting", timeout=60)
            # made while the broker is away: published once it is back
            away = [call(n) for n in range(3, 6)]
            await asyncio.sleep(0.5)
            assert not any(task.done() for task in away)
        await conn.execute(f"SELECT pg_advisory_unlock({LOCK})")
        results = await asyncio.wait_for(asyncio.gather(*held, *away), WAIT)
    finally:
        await client.close()

    assert [result.status for result in results] == [Status.SAVED] * 6
    assert len({str(result.event_id) for result in results}) == 6
    saved = await conn.fetchval(
        "SELECT count(*) FROM server_memories WHERE content LIKE '{user} likes restarts %'"
    )
    assert saved == 6, "an event was saved twice (or not at all)"
