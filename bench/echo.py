"""``python -m bench.echo``: the consumer of the RabbitMQ ceiling (started by ``python -m bench``).

It does the broker work of the worker and nothing else, with the worker's own AMQP paths: consume with
the same prefetch, publish a result of the worker's average size to the shard (confirmed, mandatory,
``worker.broker.publisher.publish_confirmed`` on aiormq's channel), plus a notice of the average notice
size when the event carries the bench's ``x-bench-notice`` header (the events the worker saved), then ack
(``worker.broker.acks.Acks``: acks of one turn leave together). The body is read only for ``event_id`` and
``shard_id``. The AMQP URL comes from ``LTM_RABBITMQ_URL`` (never the command line, where ``ps`` would show
its password).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any, cast

import aio_pika
import aiormq
import orjson
from aio_pika.abc import AbstractIncomingMessage

from contracts.names import shard_routing_key
from worker.broker.acks import Acks
from worker.broker.publisher import json_properties, publish_confirmed
from worker.config import variable_of
from worker.runtime import heap

NOTICE_HEADER = "x-bench-notice"


def padded(body: dict[str, Any], size: int) -> bytes:
    """``body`` as JSON, grown to about ``size`` bytes with a filler field."""
    raw = orjson.dumps(body)
    missing = size - len(raw) - len(',"filler":""')
    if missing <= 0:
        return raw
    return orjson.dumps({**body, "filler": "x" * missing})


async def serve(
    url: str,
    queue_name: str,
    results_exchange: str,
    notifications_exchange: str,
    prefetch: int,
    result_bytes: int,
    notice_bytes: int,
) -> None:
    connection = await aio_pika.connect(url, timeout=10)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        publish = await connection.channel(publisher_confirms=True, on_return_raises=True)
        channel = cast(aiormq.Channel, await publish.get_underlay_channel())
        consume = await connection.channel(publisher_confirms=False)
        await consume.set_qos(prefetch_count=prefetch)
        acks = Acks(await consume.get_underlay_channel())
        queue = await consume.get_queue(queue_name, ensure=False)

        async def on_message(message: AbstractIncomingMessage) -> None:
            body = orjson.loads(message.body)
            event_id, key = body["event_id"], shard_routing_key(int(body["shard_id"]))
            answer = {"schema_version": 1, "event_id": event_id, "status": "echo", "success": True}
            result = json_properties(f"result:{event_id}", message.correlation_id, "r", None)
            sent = publish_confirmed(channel, results_exchange, key, padded(answer, result_bytes), result)
            if (message.headers or {}).get(NOTICE_HEADER):
                notice = padded({"schema_version": 1, "event_id": event_id}, notice_bytes)
                properties = json_properties(f"notice:{event_id}", message.correlation_id, "n", None)
                await asyncio.gather(
                    sent, publish_confirmed(channel, notifications_exchange, key, notice, properties)
                )
            else:
                await sent
            await acks.ack(message)

        heap.freeze_startup()  # the worker's collector settings (runtime/heap.py): the same on both sides
        await queue.consume(on_message, no_ack=False)
        await stop.wait()
    finally:
        await connection.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.echo", description=__doc__)
    parser.add_argument("--queue", required=True)
    parser.add_argument("--results-exchange", required=True)
    parser.add_argument("--notifications-exchange", required=True)
    parser.add_argument("--prefetch", type=int, required=True)
    parser.add_argument("--result-bytes", type=int, required=True)
    parser.add_argument("--notice-bytes", type=int, required=True)
    args = parser.parse_args(argv)
    asyncio.run(
        serve(
            os.environ[variable_of("rabbitmq_url")],
            args.queue,
            args.results_exchange,
            args.notifications_exchange,
            args.prefetch,
            args.result_bytes,
            args.notice_bytes,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
