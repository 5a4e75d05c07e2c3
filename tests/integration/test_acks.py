"""Acks on a real RabbitMQ channel: the acks of one turn leave as fewer frames, a delivery still in flight
is not covered by them (it comes back when the channel closes), and none is settled twice (the broker would
close the channel: PRECONDITION_FAILED, unknown delivery tag)."""

from __future__ import annotations

import asyncio

import aio_pika
from aio_pika.abc import AbstractIncomingMessage

from worker.broker.acks import Acks

COUNT = 8
HELD = {3, 6}  # still "in flight" when the others are acked


async def deliveries(
    channel: aio_pika.abc.AbstractChannel, queue_name: str, count: int
) -> list[AbstractIncomingMessage]:
    queue = await channel.get_queue(queue_name)
    got: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()
    await queue.consume(got.put)
    return [await asyncio.wait_for(got.get(), 10) for _ in range(count)]


async def test_acks_of_a_turn_leave_together_and_never_cover_a_delivery_in_flight(rabbitmq_url: str) -> None:
    connection = await aio_pika.connect(rabbitmq_url)
    async with connection:
        setup = await connection.channel(publisher_confirms=True)
        queue = await setup.declare_queue("acks-test", durable=False)
        for n in range(1, COUNT + 1):
            await setup.default_exchange.publish(aio_pika.Message(str(n).encode()), queue.name)

        consuming = await connection.channel()
        await consuming.set_qos(prefetch_count=COUNT)
        acks = Acks(await consuming.get_underlay_channel())
        first = await deliveries(consuming, queue.name, COUNT)
        done = [m for m in first if int(m.body) not in HELD]
        await asyncio.gather(*(acks.ack(message) for message in done))
        assert acks.acked == COUNT - len(HELD)
        assert acks.ack_frames < acks.acked  # 1-2 in one frame, then single acks past the gap at 3
        await asyncio.sleep(0.2)
        assert not consuming.is_closed  # no unknown or twice-settled tag
        await consuming.close()  # the held deliveries go back to the queue; the acked ones do not

        again = await connection.channel()
        back = await deliveries(again, queue.name, len(HELD))
        assert sorted(int(m.body) for m in back) == sorted(HELD)
        await asyncio.sleep(0.2)
        state = await setup.declare_queue(queue.name, passive=True)
        assert state.declaration_result.message_count == 0  # nothing else came back
