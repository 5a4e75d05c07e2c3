"""The composition root without services: a stop before Postgres and Redis answer ends start-up with
``Stopped`` (``worker run`` then exits 0), and an adapter the caller hands in is the caller's to close."""

from __future__ import annotations

import asyncio

import pytest

from worker.bootstrap import Stopped, open_services
from worker.config import Settings
from worker.invalidation.redis import InvalidationPublisher
from worker.runner import Worker

#: nothing listens there: nothing may be connected to before the stop is seen
NOWHERE = Settings(
    postgres_dsn="postgresql://nobody@127.0.0.1:9/none",
    rabbitmq_url="amqp://nobody:x@127.0.0.1:9/",
    redis_url="redis://127.0.0.1:9/0",
    http_port=0,
)


class RecordedCache(InvalidationPublisher):
    """A real publisher (never connected here) that records whether it was closed."""

    closed = False

    async def close(self) -> None:
        self.closed = True
        await super().close()


async def test_a_stop_before_the_dependencies_answer_raises_stopped() -> None:
    stopping = asyncio.Event()
    stopping.set()
    with pytest.raises(Stopped):
        async with open_services(NOWHERE, stopping):
            pytest.fail("no services without Postgres and Redis")


async def test_a_given_cache_is_left_open_and_a_built_one_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    stopping = asyncio.Event()
    stopping.set()
    given = RecordedCache(NOWHERE.redis_url, "test")
    with pytest.raises(Stopped):
        async with open_services(NOWHERE, stopping, cache=given):
            pass
    assert not given.closed
    await given.close()

    built: list[RecordedCache] = []

    def build(url: str, channel: str) -> RecordedCache:
        built.append(RecordedCache(url, channel))
        return built[-1]

    monkeypatch.setattr("worker.bootstrap.InvalidationPublisher", build)
    with pytest.raises(Stopped):
        async with open_services(NOWHERE, stopping):
            pass
    assert [cache.closed for cache in built] == [True]


async def test_a_worker_stopped_before_it_started_exits_0() -> None:
    worker = Worker(NOWHERE)
    worker.stop()
    assert await asyncio.wait_for(worker.run(signals=False), 10) == 0
