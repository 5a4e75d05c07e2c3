"""side_by_side: two awaitables at once, both always awaited, the first failure raised."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from worker.aio import cancel_within, finish_within, side_by_side


async def test_both_run_at_the_same_time() -> None:
    ready = asyncio.Event()

    async def first() -> None:
        await ready.wait()  # only the second can set it: run one after the other, this never ends

    async def second() -> None:
        ready.set()

    await asyncio.wait_for(side_by_side(first(), second()), timeout=5)


async def test_a_failing_first_still_waits_for_the_second_and_raises_its_own_error() -> None:
    done: list[str] = []
    problems: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, context: problems.append(context))

    async def first() -> None:
        raise ValueError("first")

    async def second() -> None:
        await asyncio.sleep(0.01)
        done.append("second")
        raise KeyError("second")

    with pytest.raises(ValueError, match="first"):
        await side_by_side(first(), second())
    assert done == ["second"]
    await asyncio.sleep(0)
    assert problems == []  # the second's error was observed, not left for the loop to report


async def test_a_failing_second_is_raised_after_the_first_is_done() -> None:
    done: list[str] = []

    async def first() -> None:
        await asyncio.sleep(0.01)
        done.append("first")

    async def second() -> None:
        raise KeyError("second")

    with pytest.raises(KeyError):
        await side_by_side(first(), second())
    assert done == ["first"]


async def test_cancelling_the_caller_cancels_both() -> None:
    cancelled: list[str] = []

    async def waits(name: str) -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(name)
            raise

    task = asyncio.create_task(side_by_side(waits("first"), waits("second")))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sorted(cancelled) == ["first", "second"]


async def _ignores_one_cancel(released: asyncio.Event) -> None:
    """Like asyncpg's `async with pool.acquire()` around a query to a frozen Postgres: cancelled, it goes
    on waiting (to return the connection) until the connection is terminated (`released`)."""
    try:
        await asyncio.sleep(3600)
    finally:
        await released.wait()


async def test_cancel_within_gives_up_on_a_task_that_outlives_its_cancel() -> None:
    released = asyncio.Event()
    task = asyncio.ensure_future(_ignores_one_cancel(released))
    await asyncio.sleep(0)
    began = asyncio.get_running_loop().time()
    assert not await cancel_within(task, 0.2)
    assert asyncio.get_running_loop().time() - began < 2
    assert not task.done()
    released.set()  # the pool is terminated: the task ends
    await asyncio.wait({task}, timeout=5)
    assert task.cancelled()


async def test_cancel_within_waits_for_a_task_that_ends_on_its_cancel() -> None:
    task = asyncio.ensure_future(asyncio.sleep(3600))
    await asyncio.sleep(0)
    assert await cancel_within(task, 5)
    assert task.cancelled()


async def test_finish_within_lets_work_end_or_cancels_it_without_waiting() -> None:
    async def fails() -> None:
        raise RuntimeError("postgres said no")

    assert await finish_within(asyncio.sleep(0.01), 5)
    assert await finish_within(fails(), 5)  # finished; its failure is not raised
    released = asyncio.Event()
    began = asyncio.get_running_loop().time()
    assert not await finish_within(_ignores_one_cancel(released), 0.2)
    assert asyncio.get_running_loop().time() - began < 2
    released.set()
