"""Invalidations reach Redis subscribers, batched under concurrency, and fail loudly when Redis is gone."""

from __future__ import annotations

import asyncio
import socket
import uuid

import orjson
import pytest
import redis.asyncio as aioredis
import redis.exceptions

from worker.invalidation.redis import InvalidationPublisher

pytestmark = pytest.mark.integration


async def test_concurrent_invalidations_all_arrive(redis_url: str) -> None:
    channel = f"ltm-test-{uuid.uuid4().hex}"
    subscriber = aioredis.Redis.from_url(redis_url)
    pubsub = subscriber.pubsub()
    await pubsub.subscribe(channel)
    publisher = InvalidationPublisher(redis_url, channel)
    try:
        sent = [{"event_id": str(uuid.uuid4()), "kind": "user", "user_disc_id": str(n)} for n in range(200)]
        await asyncio.gather(*(publisher.publish(body) for body in sent))
        received = []
        deadline = asyncio.get_running_loop().time() + 10
        while len(received) < len(sent):
            assert asyncio.get_running_loop().time() < deadline, (
                f"only {len(received)} of {len(sent)} arrived"
            )
            # None also stands for a subscribe confirmation that was read and ignored
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1)
            if message is not None:
                received.append(message["data"])
        assert sorted(received) == sorted(orjson.dumps(body) for body in sent)
    finally:
        await publisher.close()
        await pubsub.aclose()
        await subscriber.aclose()


async def test_every_waiting_publish_fails_when_redis_is_unreachable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    publisher = InvalidationPublisher(f"redis://127.0.0.1:{port}/0", "ltm-test", tries=2, pause=0.01)
    try:
        results = await asyncio.gather(
            *(publisher.publish({"n": n}) for n in range(5)), return_exceptions=True
        )
        assert all(isinstance(r, redis.exceptions.ConnectionError) for r in results), results
    finally:
        await publisher.close()
