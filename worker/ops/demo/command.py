"""``worker demo <step>`` run, and ``clean``: the rows, then the demo's queues (with ``--topology`` the
worker's too), each only when empty and unused."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Callable

import aiormq

from contracts.models import shard_queue
from worker.broker.topology import retry_queue_name, shard_queue_name
from worker.broker.urls import connect_any
from worker.config import Settings
from worker.ops.demo.example import DEFAULT_SHARD, EXIT_UNREACHABLE, cannot_reach, say
from worker.ops.demo.rows import clean_rows, recorded_shards, seed
from worker.ops.demo.send import send
from worker.redact import redact_setting
from worker.service.policy import RetryPolicy


def run_demo(args: argparse.Namespace, settings: Settings) -> int:
    """Run ``worker demo <step>``; the exit code."""
    if args.demo_command == "seed":
        return asyncio.run(seed(settings.postgres_dsn, out=say))
    if args.demo_command == "send":
        return asyncio.run(
            send(settings, scope=args.scope, content=args.content, timeout=args.timeout, shard=args.shard)
        )
    return asyncio.run(clean(settings, topology=args.topology, shard=args.shard, out=say))


async def clean(
    settings: Settings, *, topology: bool, shard: int = DEFAULT_SHARD, out: Callable[[str], None] = say
) -> int:
    """Delete the demo's rows, then its queues (and, with ``topology``, the worker's) when empty and
    unused."""
    code = await clean_rows(settings.postgres_dsn, out)
    try:
        connection, node = await connect_any(settings.rabbitmq_url)
    except Exception as exc:
        cannot_reach("RabbitMQ", settings.rabbitmq_url, exc)
        return EXIT_UNREACHABLE
    names = [shard_queue(shard, "results"), shard_queue(shard, "notifications")]
    exchanges: list[str] = []
    if topology:
        t = settings.topology
        delays = RetryPolicy.of(settings).tiers()
        names += [
            t.work_queue,
            *(retry_queue_name(t, d) for d in delays),
            t.dead_letter_queue,
            t.dead_letter_copies_queue,
        ]
        # the shards' own queues the worker declared (docs/fair-shares.md): the demo's shard's, and any other
        # recorded in Postgres; each only when empty and unused, like the rest
        own = sorted({shard, *await recorded_shards(settings.postgres_dsn)})
        names += [shard_queue_name(t, n) for n in own]
        exchanges = [
            t.tool_calls_exchange,
            t.results_exchange,
            t.notifications_exchange,
            t.dead_letter_exchange,
        ]
    deleted: list[str] = []
    kept: list[str] = []
    try:
        for name in names:
            channel = await connection.channel()
            try:
                queue = await channel.declare_queue(name, passive=True)
                found = queue.declaration_result
                # quorum queues take neither if-unused nor if-empty: the passive declare's counts decide
                if found.message_count or found.consumer_count:
                    kept.append(
                        f"queue {name} ({found.message_count} messages, {found.consumer_count} consumers)"
                    )
                else:
                    await queue.delete(if_unused=False, if_empty=False)
                    deleted.append(f"queue {name}")
            except aiormq.exceptions.ChannelNotFoundEntity:
                pass  # not there
            finally:
                with contextlib.suppress(Exception):
                    await channel.close()
        for name in exchanges:
            channel = await connection.channel()
            try:
                exchange = await channel.get_exchange(name, ensure=True)
                await exchange.delete(if_unused=True)
                deleted.append(f"exchange {name}")
            except aiormq.exceptions.ChannelNotFoundEntity:
                pass
            except aiormq.exceptions.ChannelPreconditionFailed:
                kept.append(f"exchange {name} (queues still bound)")
            finally:
                with contextlib.suppress(Exception):
                    await channel.close()
    finally:
        with contextlib.suppress(Exception):
            await connection.close()
    out(f"rabbitmq {redact_setting(node)}: deleted {', '.join(deleted) if deleted else 'nothing'}")
    if kept:
        out(f"rabbitmq: kept {', '.join(kept)}")
    return code
