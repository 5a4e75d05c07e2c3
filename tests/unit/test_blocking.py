"""A publish's deadline while RabbitMQ blocks the connection (worker/broker/blocking.py): the timeout does not
run while blocked, runs again from the unblock, and the block's own cap still ends it."""

from __future__ import annotations

import asyncio

import pytest

from worker.broker import blocking
from worker.broker.blocking import BrokerBlock


async def test_a_held_publish_outlives_its_timeout_while_blocked_and_times_out_after() -> None:
    changes: list[str | None] = []
    block = BrokerBlock(changes.append)
    never = asyncio.get_running_loop().create_future()

    async def publish() -> None:
        async with block.deadline(0.2):
            await never

    block.start("low on memory")
    task = asyncio.create_task(publish())
    # blocked for five times the timeout: still waiting
    done, _ = await asyncio.wait({task}, timeout=1.0)
    assert not done
    block.end()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(task, timeout=30)
    assert changes == ["low on memory", None]


async def test_a_block_that_starts_mid_publish_stops_its_clock() -> None:
    block = BrokerBlock()
    answer = asyncio.get_running_loop().create_future()

    async def publish() -> str:
        async with block.deadline(0.3):
            return str(await answer)

    task = asyncio.create_task(publish())
    await asyncio.sleep(0)
    block.start("low on memory")
    done, _ = await asyncio.wait({task}, timeout=1.0)
    assert not done
    answer.set_result("confirmed")  # the confirm comes while still blocked
    assert await asyncio.wait_for(task, timeout=30) == "confirmed"
    block.end()


async def test_the_block_cap_ends_a_publish_that_waits_too_long(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(blocking, "BLOCKED_PUBLISH_DEADLINE", 0.5)
    block = BrokerBlock()
    block.start("disk")
    never = asyncio.get_running_loop().create_future()
    with pytest.raises(TimeoutError):
        async with block.deadline(0.1):
            await asyncio.wait_for(never, timeout=30)
    assert block.blocked
    block.end()
    assert not block.blocked


async def test_unwatched_connections_keep_the_plain_timeout() -> None:
    with pytest.raises(TimeoutError):
        async with blocking.publish_deadline(object(), 0.05):  # type: ignore[arg-type]
            await asyncio.sleep(30)
