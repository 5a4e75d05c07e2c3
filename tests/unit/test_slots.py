"""The worker's processing slots are never leaked, whatever interrupts a wait for one (no services)."""

from __future__ import annotations

import asyncio

from worker.runtime.slots import Slots


def slots_of(concurrency: int) -> tuple[Slots, asyncio.Event]:
    stopping = asyncio.Event()
    return Slots(concurrency, stopping), stopping


async def test_a_cancelled_wait_gives_its_slot_back() -> None:
    slots, _ = slots_of(1)
    assert await slots.take()  # the only slot is busy
    waiters = [asyncio.create_task(slots.take()) for _ in range(5)]
    await asyncio.sleep(0.01)
    for waiter in waiters:
        waiter.cancel()
    slots.release()  # the busy event finishes while the waiters are being cancelled
    await asyncio.gather(*waiters, return_exceptions=True)
    assert not slots.all_taken, "a cancelled waiter kept a slot"
    assert await asyncio.wait_for(slots.take(), timeout=1)


async def test_waiters_lose_to_a_stop_and_keep_no_slot() -> None:
    slots, stopping = slots_of(2)
    assert await slots.take("a")
    assert await slots.take("b")
    waiters = [asyncio.create_task(slots.take(key)) for key in "abc"]
    await asyncio.sleep(0.01)
    stopping.set()
    slots.release("a")
    assert await asyncio.gather(*waiters) == [False, False, False]
    slots.release("b")
    # both slots free again: two takes succeed at once once the stop is lifted, a third waits
    stopping.clear()
    assert await asyncio.wait_for(slots.take("a"), timeout=1)
    assert await asyncio.wait_for(slots.take("b"), timeout=1)
    assert slots.all_taken


async def test_a_free_slot_is_taken_at_once_and_none_after_a_stop() -> None:
    slots, stopping = slots_of(3)
    assert await slots.take()
    stopping.set()
    assert await slots.take() is False


async def test_the_shards_are_served_in_turn_whatever_one_of_them_holds() -> None:
    """One event per shard per turn: shard b's single event starts before any more of shard a's."""
    slots, _ = slots_of(3)
    assert await slots.take("a")
    assert await slots.take("a")
    assert await slots.take("c")  # all taken
    order: list[str] = []

    async def wait(key: str) -> None:
        assert await slots.take(key)
        order.append(key)

    waiters = [asyncio.create_task(wait("a")) for _ in range(10)]
    await asyncio.sleep(0.01)
    waiters.append(asyncio.create_task(wait("b")))
    await asyncio.sleep(0.01)
    for _ in range(3):
        slots.release("a")
        await asyncio.sleep(0)
    await asyncio.sleep(0.01)
    assert order[:2] == ["b", "a"], "b waited behind a's events"
    for task in waiters:
        task.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)


async def test_the_last_free_slot_is_kept_for_a_shard_that_holds_none() -> None:
    """A shard alone takes all but one slot; the next shard's first event starts at once."""
    slots, _ = slots_of(3)
    assert await slots.take("loud")
    assert await slots.take("loud")
    third = asyncio.create_task(slots.take("loud"))
    await asyncio.sleep(0.01)
    assert not third.done(), "the loud shard took the last slot"
    assert await asyncio.wait_for(slots.take("quiet"), timeout=1), "the quiet shard waited"
    slots.release("quiet")
    await asyncio.sleep(0.01)
    assert not third.done()
    slots.release("loud")  # now the loud shard holds one, and two are free
    assert await asyncio.wait_for(third, timeout=1)


async def test_two_levels_the_shards_in_turn_and_inside_a_shard_its_guilds_in_turn() -> None:
    """Keys (shard, guild), grouped by shard: a freed slot goes to the next shard, and inside it to the next
    guild; a shard's many guilds together take one shard's turns."""
    stopping = asyncio.Event()
    slots = Slots(1, stopping, group_of=lambda key: key[0])
    assert await slots.take(("x", "busy"))
    order: list[tuple[str, str]] = []

    async def wait(key: tuple[str, str]) -> None:
        assert await slots.take(key)
        order.append(key)
        slots.release(key)

    keys = [("a", "loud")] * 3 + [("a", "g1"), ("a", "g2"), ("b", "quiet")]
    waiters = []
    for key in keys:
        waiters.append(asyncio.create_task(wait(key)))
        await asyncio.sleep(0)
    slots.release(("x", "busy"))
    await asyncio.wait_for(asyncio.gather(*waiters), timeout=5)
    assert order == [
        ("a", "loud"),
        ("b", "quiet"),  # shard b's turn comes after one event of shard a, whatever a's guilds hold
        ("a", "g1"),
        ("a", "g2"),
        ("a", "loud"),
        ("a", "loud"),
    ]
