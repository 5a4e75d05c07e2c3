"""The keeper: every worker drains ``ltm.create_memory.dlq.copies`` into ``ltm_dead_letters``, so the dead
letters can be listed, grouped, searched and shown from Postgres without taking them from the DLQ.

The broker routes each dead letter to the DLQ and to the copies queue alike (both bound to
``tomori.dead_letter`` with ``#``). The keeper takes copies in batches (at most :data:`BATCH`, or what came
within :data:`GATHER_SECONDS` of the first), writes a batch in one statement and acks it after the commit. So:

- nothing is lost: a copy is acked only once its row is committed; a worker killed between the two leaves it
  unacked and the broker gives it to another keeper, whose write of the same key changes nothing;
- Postgres being down stops nothing else: the keeper holds its batch and tries again with a growing pause
  (:data:`RETRY_SECONDS`), the copies wait in their queue, the DLQ and the workers' events go on;
- nothing is read twice into two rows: the key is a digest of what both queues got alike
  (:func:`~worker.broker.dead_letters.letter_key`).
"""

from __future__ import annotations

import asyncio
import contextlib

import asyncpg
import structlog
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage

from worker.broker.dead_letters import (
    as_dead_lettered,
    json_safe,
    letter_key,
    message_properties,
    read_dead_letter,
)
from worker.config import Topology
from worker.store.dead_letters import KeptLetter, keep

log = structlog.get_logger("worker.keeper")

#: the most copies written in one statement, and the consumer's prefetch
BATCH = 200
#: how long a batch waits for more copies after its first, and how often it looks
GATHER_SECONDS = 0.05
GATHER_POLL = 0.005
#: the pauses between attempts to write a batch while Postgres fails, the last one repeated
RETRY_SECONDS = (0.5, 1.0, 2.0, 5.0, 10.0)
#: how long a stop waits for the batch being written
STOP_SECONDS = 5.0
#: what Postgres being down or cut off raises: a warning; anything else is a bug, logged as an error
_OUTAGES = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError)
#: the most body bytes a row keeps: the contract's bound on an event (a longer body is dead-lettered unread)
MAX_KEPT_BODY = 256 * 1024


def kept_letter(message: AbstractIncomingMessage, topology: Topology, trusted: frozenset[str]) -> KeptLetter:
    """The row of a copy: its description, its headers and properties as JSON, its body."""
    headers = dict(message.headers or {})
    letter = read_dead_letter(message, topology, trusted)
    return KeptLetter(
        letter_key=letter_key(message.body, headers, message.message_id),
        event_id=letter.event_id,
        kind=letter.kind,
        error=letter.error,
        first_error=letter.first_error,
        attempts=letter.attempts,
        failed_at=letter.failed_at,
        shard_id=letter.shard_id,
        guild_id=letter.guild_id,
        routing_key=letter.routing_key,
        message_id=message.message_id,
        replay_count=letter.replay_count,
        headers=json_safe(as_dead_lettered(headers)),
        properties={name: json_safe(value) for name, value in message_properties(message)},
        body=message.body[:MAX_KEPT_BODY],
        body_size=len(message.body),
        exchange=message.exchange or "",
        delivery_routing_key=message.routing_key or "",
    )


class Keeper:
    """Consumes the copies queue on one channel of the worker's connection and writes what it takes."""

    def __init__(
        self,
        channel: AbstractChannel,
        pool: asyncpg.Pool,
        topology: Topology,
        trusted: frozenset[str] = frozenset(),
    ) -> None:
        self._channel = channel
        self._pool = pool
        self._topology = topology
        self._trusted = trusted
        self._inbox: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()
        self._consumer_tag: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._writing: asyncio.Future[None] | None = None
        #: rows written (a copy written before counts too), for the tests and the log
        self.kept = 0

    async def start(self) -> None:
        await self._channel.set_qos(prefetch_count=BATCH)
        queue = await self._channel.get_queue(self._topology.dead_letter_copies_queue, ensure=False)
        self._consumer_tag = await queue.consume(self._inbox.put, no_ack=False)
        self._task = asyncio.create_task(self._drain(), name="keeper")

    async def stop(self) -> None:
        """Take no more copies; write what was taken, for at most :data:`STOP_SECONDS` (what is left then goes
        back to the queue with the channel, for another worker)."""
        if self._consumer_tag is not None:
            with contextlib.suppress(Exception):
                queue = await self._channel.get_queue(self._topology.dead_letter_copies_queue, ensure=False)
                await queue.cancel(self._consumer_tag)
            self._consumer_tag = None
        deadline = asyncio.get_running_loop().time() + STOP_SECONDS
        while not self._inbox.empty() or (self._writing is not None and not self._writing.done()):
            if asyncio.get_running_loop().time() > deadline or self._task is None or self._task.done():
                break
            await asyncio.sleep(GATHER_POLL)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _drain(self) -> None:
        while True:
            batch = [await self._inbox.get()]
            # more of what has arrived, for at most GATHER_SECONDS; never a get cancelled by a timeout (on
            # Python 3.11 wait_for can drop the item such a get had just taken)
            deadline = asyncio.get_running_loop().time() + GATHER_SECONDS
            while len(batch) < BATCH:
                if self._inbox.empty():
                    if asyncio.get_running_loop().time() >= deadline:
                        break
                    await asyncio.sleep(GATHER_POLL)
                    continue
                batch.append(self._inbox.get_nowait())
            # a stop waits for this batch: its copies are written and acked, or go back with the channel
            self._writing = asyncio.ensure_future(self._write(batch))
            await asyncio.shield(self._writing)

    async def _write(self, batch: list[AbstractIncomingMessage]) -> None:
        attempt = 0
        while True:
            try:
                rows = [kept_letter(message, self._topology, self._trusted) for message in batch]
                await keep(self._pool, rows)
                break
            except Exception as exc:  # Postgres down, or a bug: either way the copies stay unacked, not lost
                if self._channel.is_closed:
                    return  # the copies went back to the queue with the channel
                pause = RETRY_SECONDS[min(attempt, len(RETRY_SECONDS) - 1)]
                attempt += 1
                expected = isinstance(
                    exc, OSError | asyncpg.PostgresError | asyncpg.InterfaceError | TimeoutError
                )
                report = log.warning if expected else log.error
                report(
                    "could not keep dead letters in postgres; they wait in their queue",
                    letters=len(batch),
                    queue=self._topology.dead_letter_copies_queue,
                    error=f"{type(exc).__name__}: {exc}",
                    retry_in_s=pause,
                    exc_info=not expected,
                )
                await asyncio.sleep(pause)
        with contextlib.suppress(Exception):  # a closed channel: the broker redelivers, the key dedups
            await batch[-1].ack(multiple=True)
        self.kept += len(batch)
