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
    assert await slots.take()
    assert await slots.take()
    waiters = [asyncio.create_task(slots.take()) for _ in range(3)]
    await asyncio.sleep(0.01)
    stopping.set()
    slots.release()
    assert await asyncio.gather(*waiters) == [False, False, False]
    slots.release()
    # both slots free again: two takes succeed at once once the stop is lifted, a third waits
    stopping.clear()
    assert await asyncio.wait_for(slots.take(), timeout=1)
    assert await asyncio.wait_for(slots.take(), timeout=1)
    assert slots.all_taken


async def test_a_free_slot_is_taken_at_once_and_none_after_a_stop() -> None:
    slots, stopping = slots_of(3)
    assert await slots.take()
    stopping.set()
    assert await slots.take() is False
