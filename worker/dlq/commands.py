"""``worker dlq``: list, show, replay and purge the dead letters in ``ltm.create_memory.dlq``.

How the queue is read (the same for every command): one channel takes messages with ``basic.get``
(manual ack) and holds each one unacked until the end of the pass, so every dead letter is seen exactly
once wherever the broker puts a requeued message (a RabbitMQ 3.x quorum queue without a delivery limit
appends it to the back; with one, and on 4.x, it is served again first). The pass stops after the number
of messages the queue held when it started, so dead letters that arrive meanwhile (a replayed event
failing again) are left for the next run. Selected messages are settled batch by batch (``--batch``: how
many bodies are in memory and how many republishes await their confirms at once); every other message is
kept as a delivery tag only and, at the end, released with ``basic.nack(requeue=True)`` one by one in the
order it was taken, so the queue keeps its order. A nack, unlike a reject, does not count as a failed
delivery on RabbitMQ 4.3+. If the tool dies, the broker requeues whatever it still held: nothing is lost.

Replay publishes each selected message back to ``tomori.tool_calls`` with its original routing key, body
and properties (confirms + mandatory) and acks the DLQ copy only once the broker confirmed the new one: a
crash in between leaves the event in both places, which the worker's idempotency makes harmless.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, TextIO
from urllib.parse import unquote, urlsplit

import aio_pika
import aiormq.exceptions
import orjson
from aio_pika.abc import (
    AbstractChannel,
    AbstractConnection,
    AbstractExchange,
    AbstractIncomingMessage,
    AbstractQueue,
)

from worker.broker.headers import (
    ATTEMPTS,
    DEAD_LETTER_HEADERS,
    ERROR,
    ERROR_KIND,
    FAILED_AT,
    ORIGINAL_ROUTING_KEY,
    REPLAY_COUNT,
    REPLAYED_AT,
    copy_message,
    header_text,
    rfc3339,
)
from worker.broker.urls import NoNodeAnswered, connect_any
from worker.config import Topology
from worker.config import redact_url as redact

EXIT_OK = 0  # also when nothing was selected: an empty list, or nothing to replay or purge, is an answer
EXIT_FAILED = 1  # show: not found; replay: some could not be republished; purge: declined
EXIT_USAGE = 2  # bad options; purge without --yes and without a terminal to ask on
EXIT_UNREACHABLE = 3  # RabbitMQ cannot be reached (or the connection died mid-way)
EXIT_MISSING = 4  # the DLQ (or, for replay, the work exchange) does not exist on the vhost
EXIT_INTERRUPTED = 130

EXIT_CODES_HELP = """
exit codes:
  0  done, also when nothing matched (list prints no lines; replay and purge move or delete 0)
  1  show: no such dead letter; replay: some dead letters could not be republished (they stay in the DLQ);
     purge: not confirmed
  2  bad options; purge without --yes when stdin is not a terminal
  3  RabbitMQ cannot be reached (or the connection was lost; nothing is lost with it)
  4  the DLQ (replay: or the work exchange) does not exist on the vhost
  130  interrupted (Ctrl-C); whatever was not settled stays in the DLQ
"""

DEFAULT_BATCH = 1000
CONNECT_TIMEOUT = 10.0
GET_TIMEOUT = 30.0
PUBLISH_TIMEOUT = 30.0
SETTLE_TIMEOUT = 3.0
SETTLE_GRACE = 0.5

#: broker-owned headers a replayed message must not carry back into the work queue
_BROKER_HEADERS = frozenset({"x-death", "x-delivery-count", "x-acquired-count"})
_BROKER_HEADER_PREFIXES = ("x-first-death-", "x-last-death-")

#: x-death reasons (the broker dead-lettered the message itself) and how they read
_BROKER_REASONS = {
    "delivery_limit": "redelivered more than the delivery limit",
    "rejected": "rejected by a consumer without requeue",
    "expired": "expired (message TTL)",
    "maxlen": "dropped by a queue length limit",
}


class DlqError(Exception):
    """A failure the operator must act on; ``exit_code`` is what the command exits with."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# --- reading a dead letter ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """What a dead letter says about itself, from the worker's ``x-ltm-*`` headers or the broker's x-death."""

    event_id: str | None
    kind: str
    error: str
    attempts: int | None
    failed_at: datetime | None
    shard_id: int | None
    #: the key the shard published with: replay sends the message back with it
    routing_key: str
    message_id: str | None = None
    replay_count: int = 0

    def age(self, now: datetime) -> timedelta | None:
        return None if self.failed_at is None else now - self.failed_at

    def as_json(self) -> dict[str, Any]:
        """The ``worker dlq list --json`` object: exactly the keys of CONTRACT.md."""
        return {
            "event_id": self.event_id,
            "kind": self.kind,
            "error": self.error,
            "attempts": self.attempts,
            "failed_at": None if self.failed_at is None else rfc3339(self.failed_at),
            "shard_id": self.shard_id,
            "routing_key": self.routing_key,
        }


def read_dead_letter(message: AbstractIncomingMessage, topology: Topology) -> DeadLetter:
    """Describe a message taken from the DLQ."""
    return describe_dead_letter(
        message.body,
        dict(message.headers or {}),
        message_id=message.message_id,
        routing_key=message.routing_key or "",
        topology=topology,
    )


def describe_dead_letter(
    body: bytes,
    headers: Mapping[str, Any],
    *,
    message_id: str | None,
    routing_key: str,
    topology: Topology,
) -> DeadLetter:
    """Describe a dead letter from its parts (pure: no broker needed)."""
    event_id, shard_id = _ids_from_body(body)
    if event_id is None:
        event_id = message_id or None
    replay_count = _integer(headers.get(REPLAY_COUNT)) or 0
    kept_key = header_text(headers.get(ORIGINAL_ROUTING_KEY))

    kind = header_text(headers.get(ERROR_KIND))
    if kind:  # the worker dead-lettered it: its headers say everything
        return DeadLetter(
            event_id=event_id,
            kind=kind,
            error=header_text(headers.get(ERROR)) or "",
            attempts=_integer(headers.get(ATTEMPTS)),
            failed_at=_timestamp(headers.get(FAILED_AT)),
            shard_id=shard_id,
            routing_key=kept_key or routing_key,
            message_id=message_id,
            replay_count=replay_count,
        )

    # the broker dead-lettered it (over the work queue's delivery limit, or a rejection / TTL / length limit)
    death = _death_entry(headers.get("x-death"), topology.work_queue)
    reason = header_text(death.get("reason")) or header_text(headers.get("x-last-death-reason"))
    reason = reason or header_text(headers.get("x-first-death-reason"))
    death_keys = death.get("routing-keys")
    death_key = header_text(death_keys[0]) if isinstance(death_keys, list) and death_keys else None
    if reason:
        error = _BROKER_REASONS.get(reason, f"dead-lettered by the broker ({reason})")
        queue = header_text(death.get("queue"))
        if queue and queue != topology.work_queue:
            error = f"{error} in {queue}"
    else:
        error = "no dead-letter headers (neither x-ltm-* nor x-death)"
    return DeadLetter(
        event_id=event_id,
        kind=reason or "unknown",
        error=error,
        # x-death's count is how often the broker dead-lettered it for this reason; the x-delivery-count
        # a DLQ delivery carries counts redeliveries from the DLQ itself, not attempts, so it is not used
        attempts=_integer(death.get("count")),
        failed_at=_timestamp(death.get("time")),
        shard_id=shard_id,
        routing_key=kept_key or death_key or routing_key,
        message_id=message_id,
        replay_count=replay_count,
    )


def _ids_from_body(body: bytes) -> tuple[str | None, int | None]:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None, None
    if not isinstance(data, dict):
        return None, None
    event_id = data.get("event_id")
    shard_id = data.get("shard_id")
    return (
        event_id if isinstance(event_id, str) and event_id else None,
        shard_id if isinstance(shard_id, int) and not isinstance(shard_id, bool) else None,
    )


def _death_entry(value: Any, work_queue: str) -> Mapping[str, Any]:
    """The x-death entry for the work queue, else the most recent one (the broker keeps newest first)."""
    if not isinstance(value, list):
        return {}
    entries = [entry for entry in value if isinstance(entry, Mapping)]
    for entry in entries:
        if header_text(entry.get("queue")) == work_queue:
            return entry
    return entries[0] if entries else {}


def _integer(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    text = header_text(value)
    if text is not None and text.strip().lstrip("-").isdigit():
        return int(text)
    return None


def _timestamp(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, int) and not isinstance(value, bool):
        return datetime.fromtimestamp(value, UTC)
    text = header_text(value)
    if not text:
        return None
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


# --- choosing dead letters ----------------------------------------------------------------------------

_DURATION_PART = re.compile(r"(\d+)([smhdw])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> timedelta:
    """``30s``, ``10m``, ``2h``, ``1d``, ``1w`` or a sum such as ``1h30m``; ValueError otherwise."""
    compact = text.strip().lower()
    parts = _DURATION_PART.findall(compact)
    if not parts or "".join(n + unit for n, unit in parts) != compact:
        raise ValueError(f"not a duration: {text!r} (use e.g. 30s, 10m, 2h, 1d or 1h30m)")
    return timedelta(seconds=sum(int(n) * _UNIT_SECONDS[unit] for n, unit in parts))


@dataclass(frozen=True, slots=True)
class Selection:
    """Which dead letters a command acts on; empty means all. Filters combine with AND, values with OR."""

    kinds: frozenset[str] = frozenset()
    event_ids: frozenset[str] = frozenset()
    #: only dead letters that failed at least this long ago (unknown failure time: never selected)
    older_than: timedelta | None = None

    def matches(self, letter: DeadLetter, now: datetime) -> bool:
        if self.kinds and letter.kind not in self.kinds:
            return False
        if self.event_ids and not ({letter.event_id, letter.message_id} & self.event_ids):
            return False
        if self.older_than is not None:
            age = letter.age(now)
            if age is None or age < self.older_than:
                return False
        return True


# --- the queue ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Found:
    """A dead letter taken from the queue and held (unacked) by a sweep."""

    message: AbstractIncomingMessage
    letter: DeadLetter


class DeadLetterQueue:
    """A connection to the broker on which the DLQ is known to exist."""

    def __init__(self, connection: AbstractConnection, url: str, topology: Topology, depth: int) -> None:
        self.connection = connection
        self.url = url
        self.topology = topology
        #: messages ready in the DLQ when it was opened
        self.depth = depth

    @property
    def name(self) -> str:
        return self.topology.dead_letter_queue

    async def sweep(
        self,
        selection: Selection = Selection(),
        *,
        batch: int = DEFAULT_BATCH,
        limit: int | None = None,
        now: datetime | None = None,
    ) -> Sweep:
        """Start one pass over the queue (use it as ``async with``)."""
        if batch < 1:
            raise ValueError("batch must be at least 1")
        channel = await self.connection.channel(publisher_confirms=False)
        expected = await _queue_depth(channel, self.name)
        return Sweep(
            channel,
            self.name,
            self.topology,
            selection,
            expected=expected,
            batch=batch,
            limit=limit,
            now=now or datetime.now(UTC),
        )

    async def work_exchange(self) -> AbstractChannel:
        """A confirm-mode channel for republishing, after checking the work exchange exists."""
        probe = await self.connection.channel(publisher_confirms=False)
        try:
            await probe.declare_exchange(self.topology.tool_calls_exchange, passive=True)
        except aiormq.exceptions.ChannelNotFoundEntity:
            raise DlqError(
                f"exchange {self.topology.tool_calls_exchange} does not exist on vhost "
                f"{vhost_of(self.url)!r}; has `worker run` ever started here?",
                EXIT_MISSING,
            ) from None
        finally:
            await _close_quietly(probe)
        return await self.connection.channel(publisher_confirms=True, on_return_raises=True)


@contextlib.asynccontextmanager
async def open_dead_letters(url: str, topology: Topology) -> AsyncIterator[DeadLetterQueue]:
    """Connect and check (passive declare on a throwaway channel) that the DLQ exists."""
    try:
        # several nodes listed: the first that answers serves the whole command
        connection, url = await connect_any(url, timeout=CONNECT_TIMEOUT)
    except NoNodeAnswered as exc:
        raise DlqError(f"cannot reach RabbitMQ: {exc}", EXIT_UNREACHABLE) from None
    except (OSError, TimeoutError, aiormq.exceptions.AMQPError) as exc:
        raise DlqError(
            f"cannot reach RabbitMQ at {redact(url)}: {_connect_reason(exc, url)}", EXIT_UNREACHABLE
        ) from None
    try:
        probe = await connection.channel(publisher_confirms=False)
        try:
            depth = await _queue_depth(probe, topology.dead_letter_queue)
        except aiormq.exceptions.ChannelNotFoundEntity:
            raise DlqError(
                f"queue {topology.dead_letter_queue} does not exist on vhost {vhost_of(url)!r}; "
                "has `worker run` ever started here?",
                EXIT_MISSING,
            ) from None
        finally:
            await _close_quietly(probe)
        yield DeadLetterQueue(connection, url, topology, depth)
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(connection.close(), timeout=5)


async def _queue_depth(channel: AbstractChannel, name: str) -> int:
    queue = await channel.declare_queue(name, passive=True)
    result = queue.declaration_result
    return int(result.message_count or 0)


class Sweep:
    """One pass over the DLQ on one channel: each message is taken once and held until settled.

    ``next_batch`` returns the selected dead letters of the next ``batch`` messages taken (possibly none),
    or None when the pass is over. The caller ``remove``s the ones it is done with; everything else is
    requeued, in the order it was taken, when the sweep closes.
    """

    def __init__(
        self,
        channel: AbstractChannel,
        queue_name: str,
        topology: Topology,
        selection: Selection,
        *,
        expected: int,
        batch: int,
        limit: int | None,
        now: datetime,
    ) -> None:
        self._channel = channel
        self._queue_name = queue_name
        self._topology = topology
        self._selection = selection
        self.expected = expected
        self._batch = batch
        self._limit = limit
        self.now = now
        self.scanned = 0
        self.selected = 0
        self.removed = 0
        #: delivery tags taken and not acked yet, in the order taken (dict: ordered, O(1) delete)
        self._held: dict[int, None] = {}
        self._exhausted = False
        self._queue: AbstractQueue | None = None
        self._last_ack: float | None = None

    async def __aenter__(self) -> Sweep:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def held(self) -> int:
        return len(self._held)

    def _done(self) -> bool:
        limit_reached = self._limit is not None and self.selected >= self._limit
        return self._exhausted or self.scanned >= self.expected or limit_reached

    async def next_batch(self) -> list[Found] | None:
        if self._done():
            return None
        if self._queue is None:
            self._queue = await self._channel.get_queue(self._queue_name, ensure=False)
        queue = self._queue
        found: list[Found] = []
        taken = 0
        while taken < self._batch and not self._done():
            message = await queue.get(no_ack=False, fail=False, timeout=GET_TIMEOUT)
            if message is None:
                self._exhausted = True
                break
            taken += 1
            self.scanned += 1
            if message.delivery_tag is not None:
                self._held[message.delivery_tag] = None
            letter = read_dead_letter(message, self._topology)
            if self._selection.matches(letter, self.now):
                self.selected += 1
                found.append(Found(message, letter))
        return found

    async def remove(self, found: Sequence[Found]) -> None:
        """Ack: these dead letters leave the queue for good."""
        await self.remove_tags([item.message.delivery_tag for item in found if item.message.delivery_tag])

    async def remove_tags(self, tags: Sequence[int]) -> None:
        """Ack by delivery tag (lets a caller hold a selection without keeping the bodies)."""
        underlay = await self._channel.get_underlay_channel()
        for tag in tags:
            if tag in self._held:
                await underlay.basic_ack(tag, multiple=False)
                del self._held[tag]
                self.removed += 1
                self._last_ack = time.monotonic()

    async def close(self) -> None:
        """Requeue everything still held, in the order taken, and close the channel."""
        try:
            if self._held and not self._channel.is_closed:
                ready_before = await _queue_depth(self._channel, self._queue_name)
                underlay = await self._channel.get_underlay_channel()
                for tag in self._held:
                    await underlay.basic_nack(tag, multiple=False, requeue=True)
                released = len(self._held)
                self._held.clear()
                await self._wait_until_ready(ready_before + released)
            if self._last_ack is not None and not self._channel.is_closed:
                # A quorum queue turns every ack of a basic.get delivery into its own command, and a
                # channel that sent more than a few dozen of them at once holds the rest back until the
                # first ones are applied; closing the channel then drops them and the broker requeues
                # messages that were acked (rabbitmq-server#10327). Nothing is lost that way (a replayed
                # dead letter would be in both queues), but give the acks time to go through.
                await asyncio.sleep(max(0.0, self._last_ack + SETTLE_GRACE - time.monotonic()))
        finally:
            # closing the channel requeues anything a failure above left unacked
            await _close_quietly(self._channel)

    async def _wait_until_ready(self, ready: int) -> None:
        """Wait (briefly) until the queue shows the released messages as ready again: a nack has no
        reply and the queue applies it a moment later; a command run right after this one must see them."""
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while await _queue_depth(self._channel, self._queue_name) < ready:
            if time.monotonic() > deadline:
                return
            await asyncio.sleep(0.01)


# --- operations ---------------------------------------------------------------------------------------


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
    """Republish the selected dead letters to the work exchange; ack each DLQ copy once confirmed."""
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
                    confirmed = await _republish(exchange, found, failures)
                    await sweep.remove(confirmed)
                    if publish_channel is not None and publish_channel.is_closed:
                        failures.append((None, "the publishing channel closed; replay stopped"))
                        break
                if progress is not None:
                    progress(sweep)
            return replace(Totals.of(sweep), failures=failures)
    finally:
        if publish_channel is not None:
            await _close_quietly(publish_channel)


async def _republish(
    exchange: AbstractExchange, found: Sequence[Found], failures: list[tuple[str | None, str]]
) -> list[Found]:
    """Publish every one at once and wait for the confirms; the ones the broker confirmed."""
    now = datetime.now(UTC)
    results = await asyncio.gather(
        *(
            exchange.publish(
                replay_message(item.message, now),
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
    return _describe(exc)


def replay_headers(headers: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """The headers a replayed message carries: dead-letter and broker bookkeeping gone, replay recorded."""
    kept = {
        key: value
        for key, value in headers.items()
        # the worker's dead-letter headers go too: the attempt count restarts on replay
        if key not in DEAD_LETTER_HEADERS
        and key not in _BROKER_HEADERS
        and not key.startswith(_BROKER_HEADER_PREFIXES)
    }
    kept[REPLAYED_AT] = rfc3339(now)
    kept[REPLAY_COUNT] = (_integer(headers.get(REPLAY_COUNT)) or 0) + 1
    return kept


def replay_message(message: AbstractIncomingMessage, now: datetime) -> aio_pika.Message:
    """The original body and properties with the replay headers."""
    return copy_message(message, replay_headers(dict(message.headers or {}), now))


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


# --- output -------------------------------------------------------------------------------------------

_COLUMNS = ("EVENT_ID", "KIND", "ATTEMPTS", "FAILED_AT", "SHARD", "AGE", "ERROR")
_WIDTHS = (36, 19, 8, 24, 5, 7)


def format_age(age: timedelta | None) -> str:
    """``45s``, ``12m``, ``3h12m``, ``2d4h``; ``-`` when unknown."""
    if age is None:
        return "-"
    seconds = max(0, int(age.total_seconds()))
    if seconds < 60:
        return f"{seconds}s"
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if hours == 0:
        return f"{minutes}m"
    if days == 0:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"


def list_header() -> str:
    return _row(_COLUMNS)


def list_line(letter: DeadLetter, now: datetime) -> str:
    """One human-readable line (the error last, in full, on one line)."""
    return _row(
        (
            letter.event_id or "-",
            letter.kind,
            "-" if letter.attempts is None else str(letter.attempts),
            "-" if letter.failed_at is None else rfc3339(letter.failed_at),
            "-" if letter.shard_id is None else str(letter.shard_id),
            format_age(letter.age(now)),
            " ".join(letter.error.split()),
        )
    )


def _row(cells: Sequence[str]) -> str:
    padded = [cell.ljust(width) for cell, width in zip(cells, _WIDTHS, strict=False)]
    return "  ".join([*padded, *cells[len(_WIDTHS) :]]).rstrip()


def json_line(letter: DeadLetter) -> str:
    return orjson.dumps(letter.as_json()).decode()


_PROPERTIES = (
    "content_type",
    "content_encoding",
    "delivery_mode",
    "priority",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "timestamp",
    "type",
    "user_id",
    "app_id",
)


def format_message(found: Found, now: datetime) -> str:
    """The whole message for ``worker dlq show``: summary, delivery, properties, headers, body."""
    message, letter = found.message, found.letter
    attempts = "?" if letter.attempts is None else letter.attempts
    failed_at = "?" if letter.failed_at is None else rfc3339(letter.failed_at)
    shard = "-" if letter.shard_id is None else letter.shard_id
    lines = [
        f"event {letter.event_id or '-'}: {letter.kind}, {attempts} attempt(s), failed at {failed_at}"
        f" ({format_age(letter.age(now))} ago), shard {shard}",
        f"error: {letter.error}",
        f"replays to: {letter.routing_key or '?'} (replayed {letter.replay_count} time(s) so far)",
        "delivery:",
        f"  exchange: {message.exchange!r}",
        f"  routing_key: {message.routing_key!r}",
        f"  redelivered: {str(bool(message.redelivered)).lower()}",
        "properties:",
    ]
    for name in _PROPERTIES:
        value = getattr(message, name, None)
        if value is not None:
            lines.append(f"  {name}: {_render(value)}")
    lines.append("headers:")
    for key, value in sorted((message.headers or {}).items()):
        lines.append(f"  {key}: {_render(value, indent=2)}")
    body = message.body
    try:
        parsed = json.loads(body)
    except (UnicodeDecodeError, ValueError):
        lines.append(f"body (not JSON, {len(body)} bytes):")
        lines.append(repr(body))
    else:
        lines.append(f"body (JSON, {len(body)} bytes):")
        lines.append(json.dumps(parsed, indent=2, ensure_ascii=False))
    return "\n".join(lines)


def _render(value: Any, indent: int = 0) -> str:
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    text = json.dumps(value, indent=2, ensure_ascii=False, default=_jsonable, sort_keys=True)
    return text.replace("\n", "\n" + " " * indent)


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return rfc3339(value)
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


class Progress:
    """``replay: 1200/3000 scanned, 1100 moved`` on stderr: rewritten in place on a terminal, one line
    per batch otherwise (only with --progress)."""

    def __init__(self, verb: str, stream: TextIO, *, live: bool) -> None:
        self._verb = verb
        self._stream = stream
        self._live = live
        self._last = 0.0
        self._width = 0

    def __call__(self, sweep: Sweep) -> None:
        text = f"{self._verb}: {sweep.scanned}/{sweep.expected} scanned, {sweep.removed} {_PAST[self._verb]}"
        if self._live:
            now = time.monotonic()
            if now - self._last < 0.1 and sweep.scanned < sweep.expected:
                return
            self._last = now
            self._width = max(self._width, len(text))
            self._stream.write("\r" + text.ljust(self._width))
        else:
            self._stream.write(text + "\n")
        self._stream.flush()

    def finish(self) -> None:
        if self._live and self._width:
            self._stream.write("\r" + " " * self._width + "\r")
            self._stream.flush()


_PAST = {"replay": "moved", "purge": "deleted"}


# --- commands (what the CLI runs; each returns the exit code) ----------------------------------------


@dataclass(frozen=True, slots=True)
class Console:
    """Where a command writes, and whether a person is watching."""

    out: TextIO = field(default_factory=lambda: sys.stdout)
    err: TextIO = field(default_factory=lambda: sys.stderr)


async def list_command(
    url: str,
    topology: Topology,
    selection: Selection,
    *,
    batch: int = DEFAULT_BATCH,
    as_json: bool = False,
    console: Console | None = None,
) -> int:
    console = console or Console()

    async def run() -> int:
        async with open_dead_letters(url, topology) as dlq:
            headed = as_json  # JSON lines have no header; the table's comes with its first row

            def emit(found: Found, now: datetime) -> None:
                nonlocal headed
                if not headed:
                    console.out.write(list_header() + "\n")
                    headed = True
                line = json_line(found.letter) if as_json else list_line(found.letter, now)
                console.out.write(line + "\n")

            totals = await browse(dlq, selection, emit, batch=batch)
            console.out.flush()
            console.err.write(f"{totals.selected} of {totals.scanned} dead letters in {dlq.name}\n")
        return EXIT_OK

    return await _guarded(run(), url, console)


async def show_command(
    url: str,
    topology: Topology,
    event_id: str,
    *,
    batch: int = DEFAULT_BATCH,
    console: Console | None = None,
) -> int:
    console = console or Console()

    async def run() -> int:
        async with open_dead_letters(url, topology) as dlq:
            shown: list[str] = []
            await browse(
                dlq,
                Selection(event_ids=frozenset({event_id})),
                lambda found, now: shown.append(format_message(found, now)),
                batch=batch,
            )
            if not shown:
                console.err.write(f"no dead letter with event id {event_id} in {dlq.name}\n")
                return EXIT_FAILED
            for n, text in enumerate(shown, 1):
                if len(shown) > 1:
                    console.out.write(f"--- dead letter {n} of {len(shown)} ---\n")
                console.out.write(text + "\n")
        return EXIT_OK

    return await _guarded(run(), url, console)


async def replay_command(
    url: str,
    topology: Topology,
    selection: Selection,
    *,
    batch: int = DEFAULT_BATCH,
    limit: int | None = None,
    dry_run: bool = False,
    progress: bool = False,
    console: Console | None = None,
) -> int:
    console = console or Console()

    async def run() -> int:
        async with open_dead_letters(url, topology) as dlq:
            meter = _meter("replay", console, progress) if not dry_run else None
            on_found = None
            if dry_run:
                console.out.write(list_header() + "\n")

                def on_found(found: Found, now: datetime) -> None:
                    console.out.write(list_line(found.letter, now) + "\n")

            try:
                totals = await replay(
                    dlq,
                    selection,
                    batch=batch,
                    limit=limit,
                    dry_run=dry_run,
                    on_found=on_found,
                    progress=meter,
                )
            finally:
                if meter is not None:
                    meter.finish()
            if dry_run:
                console.out.write(
                    f"dry run: would move {totals.selected}, keep {totals.kept - totals.selected}; "
                    "nothing moved\n"
                )
                return EXIT_OK
            for event_id, why in totals.failures:
                console.err.write(f"not replayed: {event_id or '-'}: {why}\n")
            console.out.write(f"moved {totals.removed}, kept {totals.kept}\n")
            return EXIT_FAILED if totals.failures else EXIT_OK

    return await _guarded(run(), url, console)


async def purge_command(
    url: str,
    topology: Topology,
    selection: Selection,
    *,
    yes: bool,
    batch: int = DEFAULT_BATCH,
    progress: bool = False,
    ask: Callable[[str], Awaitable[str]] | None = None,
    console: Console | None = None,
) -> int:
    """``ask`` shows the prompt and returns the answer (default: ``input`` on the terminal)."""
    console = console or Console()
    if not yes and ask is None and not sys.stdin.isatty():
        console.err.write(
            "refusing to purge: stdin is not a terminal, so there is no one to confirm; "
            "pass --yes to delete without asking\n"
        )
        return EXIT_USAGE
    prompt = ask or _ask_on_terminal
    declined = False
    meter = _meter("purge", console, progress)

    async def confirm(count: int) -> bool:
        nonlocal declined
        if meter is not None:
            meter.finish()
        answer = await prompt(f"Delete {count} dead letters? [y/N] ")
        declined = answer.strip().lower() not in ("y", "yes")
        return not declined

    async def run() -> int:
        async with open_dead_letters(url, topology) as dlq:
            try:
                totals = await purge(
                    dlq, selection, batch=batch, confirm=None if yes else confirm, progress=meter
                )
            finally:
                if meter is not None:
                    meter.finish()
            if declined:
                console.out.write(f"nothing deleted, kept {totals.kept}\n")
                return EXIT_FAILED
            console.out.write(f"deleted {totals.removed}, kept {totals.kept}\n")
        return EXIT_OK

    return await _guarded(run(), url, console)


async def _ask_on_terminal(prompt: str) -> str:
    try:
        return await asyncio.to_thread(input, prompt)
    except EOFError:
        return ""


def _meter(verb: str, console: Console, forced: bool) -> Progress | None:
    """A progress line when a person watches stderr, or when asked for."""
    live = console.err.isatty()
    return Progress(verb, console.err, live=live) if live or forced else None


async def _guarded(work: Awaitable[int], url: str, console: Console) -> int:
    """Run a command; turn the failures an operator can act on into a message and an exit code."""
    try:
        return await work
    except DlqError as exc:
        console.err.write(f"{exc}\n")
        return exc.exit_code
    except BrokenPipeError:  # `worker dlq list | head`: the reader has seen enough; the sweep requeued all
        return EXIT_OK
    except (OSError, TimeoutError, aiormq.exceptions.AMQPError) as exc:
        console.err.write(
            f"lost the connection to RabbitMQ at {redact(url)}: {_describe(exc)} "
            "(dead letters not yet settled stay in the queue)\n"
        )
        return EXIT_UNREACHABLE


# --- small helpers ------------------------------------------------------------------------------------


def vhost_of(url: str) -> str:
    path = urlsplit(url).path
    return unquote(path[1:]) if len(path) > 1 else "/"


def _connect_reason(exc: BaseException, url: str) -> str:
    text = _describe(exc)
    if "Connection.Close" in text:  # aiormq only says it got a Connection.Close instead of OpenOk
        user = urlsplit(url).username or "guest"
        return (
            f"the broker closed the connection while opening vhost {vhost_of(url)!r} "
            f"(does the vhost exist, and may user {user!r} use it?)"
        )
    return text


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return text if text else type(exc).__name__


async def _close_quietly(channel: AbstractChannel) -> None:
    if channel.is_closed:
        return
    with contextlib.suppress(Exception):
        await asyncio.wait_for(channel.close(), timeout=5)
