"""The worker's processing slots are never leaked, whatever interrupts a wait for one (no services)."""

from __future__ import annotations

import asyncio

from worker.config import Settings
from worker.runner import Worker


def worker_with(concurrency: int) -> Worker:
    return Worker(Settings(concurrency=concurrency))


async def test_a_cancelled_wait_gives_its_slot_back() -> None:
    worker = worker_with(1)
    assert await worker._take_slot()  # the only slot is busy
    waiters = [asyncio.create_task(worker._take_slot()) for _ in range(5)]
    await asyncio.sleep(0.01)
    for waiter in waiters:
        waiter.cancel()
    worker._slots.release()  # the busy event finishes while the waiters are being cancelled
    await asyncio.gather(*waiters, return_exceptions=True)
    assert not worker._slots.locked(), "a cancelled waiter kept a slot"
    assert await asyncio.wait_for(worker._take_slot(), timeout=1)


async def test_waiters_lose_to_a_stop_and_keep_no_slot() -> None:
    worker = worker_with(2)
    assert await worker._take_slot()
    assert await worker._take_slot()
    waiters = [asyncio.create_task(worker._take_slot()) for _ in range(3)]
    await asyncio.sleep(0.01)
    worker._stopping.set()
    worker._slots.release()
    assert await asyncio.gather(*waiters) == [False, False, False]
    worker._slots.release()
    assert worker._slots._value == 2  # both slots free again


async def test_a_free_slot_is_taken_at_once_and_none_after_a_stop() -> None:
    worker = worker_with(3)
    assert await worker._take_slot()
    worker._stopping.set()
    assert await worker._take_slot() is False
