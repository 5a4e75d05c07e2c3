"""What ``worker dlq`` does to the queue: browse (leave it as it was), replay and purge."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

import aio_pika
import aiormq.exceptions
from aio_pika.abc import AbstractExchange, AbstractIncomingMessage

from worker.broker.headers import copy_message, frame_max_of
from worker.dlq.letters import DeadLetter, Selection, replay_headers
from worker.dlq.sweep import DEFAULT_BATCH, DeadLetterQueue, Found, Sweep, close_quietly, error_text

PUBLISH_TIMEOUT = 30.0


@dataclass(slots=True)
class Totals:
    """What a pass did."""

    #: messages in the queue when the pass started
    expected: int = 0
    scanned: int = 0
    selected: int = 0
    removed: int = 0
    #: (event id, why) for each selected dead letter that could not be republished
    failures: list[tuple[str | None, str]] = field(default_factory=list)

    @property
    def kept(self) -> int:
        """Dead letters of the ones present at the start that are still in the queue."""
        return max(self.expected, self.scanned) - self.removed

    @classmethod
    def of(cls, sweep: Sweep) -> Totals:
        return cls(sweep.expected, sweep.scanned, sweep.selected, sweep.removed)


ProgressFn = Callable[[Sweep], None]


async def browse(
    dlq: DeadLetterQueue,
    selection: Selection,
    on_found: Callable[[Found, datetime], None],
    *,
    batch: int = DEFAULT_BATCH,
    limit: int | None = None,
) -> Totals:
    """Call ``on_found`` for every selected dead letter; the queue is left as it was."""
    async with await dlq.sweep(selection, batch=batch, limit=limit) as sweep:
        while (found := await sweep.next_batch()) is not None:
            for item in found:
                on_found(item, sweep.now)
        return Totals.of(sweep)


async def replay(
    dlq: DeadLetterQueue,
    selection: Selection = Selection(),
    *,
    batch: int = DEFAULT_BATCH,
    limit: int | None = None,
    dry_run: bool = False,
    on_found: Callable[[Found, datetime], None] | None = None,
    progress: ProgressFn | None = None,
) -> Totals:
    """Republish the selected dead letters to the work exchange; ack each DLQ copy once confirmed.

    Each goes back to ``tomori.tool_calls`` with its original routing key, body and properties (confirms +
    mandatory); a crash between the confirm and the ack leaves the event in both queues, which the worker's
    idempotency makes harmless."""
    publish_channel = None if dry_run else await dlq.work_exchange()
    try:
        exchange = (
            None
            if publish_channel is None
            else await publish_channel.get_exchange(dlq.topology.tool_calls_exchange, ensure=False)
        )
        failures: list[tuple[str | None, str]] = []
        async with await dlq.sweep(selection, batch=batch, limit=limit) as sweep:
            while (found := await sweep.next_batch()) is not None:
                if on_found is not None:
                    for item in found:
                        on_found(item, sweep.now)
                if exchange is not None and found:
                    assert publish_channel is not None
                    frame_max = frame_max_of(await publish_channel.get_underlay_channel())
                    confirmed = await _republish(exchange, found, failures, frame_max)
                    await sweep.remove(confirmed)
                    if publish_channel is not None and publish_channel.is_closed:
                        failures.append((None, "the publishing channel closed; replay stopped"))
                        break
                if progress is not None:
                    progress(sweep)
            return replace(Totals.of(sweep), failures=failures)
    finally:
        if publish_channel is not None:
            await close_quietly(publish_channel)


async def _republish(
    exchange: AbstractExchange,
    found: Sequence[Found],
    failures: list[tuple[str | None, str]],
    frame_max: int,
) -> list[Found]:
    """Publish every one at once and wait for the confirms; the ones the broker confirmed."""
    now = datetime.now(UTC)
    results = await asyncio.gather(
        *(
            exchange.publish(
                replay_message(item.message, now, frame_max),
                item.letter.routing_key,
                mandatory=True,
                timeout=PUBLISH_TIMEOUT,
            )
            for item in found
        ),
        return_exceptions=True,
    )
    confirmed: list[Found] = []
    for item, result in zip(found, results, strict=True):
        if isinstance(result, BaseException):
            if not isinstance(result, Exception):  # CancelledError, KeyboardInterrupt: not ours to eat
                raise result
            failures.append((item.letter.event_id, _publish_failure(result, item.letter)))
        else:
            confirmed.append(item)
    return confirmed


def _publish_failure(exc: Exception, letter: DeadLetter) -> str:
    if isinstance(exc, aiormq.exceptions.PublishError):
        return f"routing key {letter.routing_key!r} is not bound to any queue (returned unroutable)"
    if isinstance(exc, aiormq.exceptions.DeliveryError):
        return "the broker refused the message (nack)"
    if isinstance(exc, TimeoutError):
        return f"no confirm within {PUBLISH_TIMEOUT:g}s"
    return error_text(exc)


def replay_message(message: AbstractIncomingMessage, now: datetime, frame_max: int) -> aio_pika.Message:
    """The original body and properties with the replay headers, within the frame."""
    return copy_message(message, replay_headers(dict(message.headers or {}), now), frame_max=frame_max)


async def purge(
    dlq: DeadLetterQueue,
    selection: Selection = Selection(),
    *,
    batch: int = DEFAULT_BATCH,
    confirm: Callable[[int], Awaitable[bool]] | None = None,
    progress: ProgressFn | None = None,
) -> Totals:
    """Delete the selected dead letters.

    Without ``confirm`` they are acked batch by batch. With it, the whole queue is scanned first and the
    selected ones stay held (invisible to anyone else) while ``confirm(count)`` decides: exactly the
    dead letters counted are the ones deleted.
    """
    async with await dlq.sweep(selection, batch=batch) as sweep:
        chosen: list[int] = []
        while (found := await sweep.next_batch()) is not None:
            if confirm is None:
                await sweep.remove(found)
            else:  # hold the selection by delivery tag: the bodies can go
                chosen.extend(item.message.delivery_tag for item in found if item.message.delivery_tag)
            if progress is not None:
                progress(sweep)
        if confirm is not None and chosen and await confirm(len(chosen)):
            await sweep.remove_tags(chosen)
        return Totals.of(sweep)
