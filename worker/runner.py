"""``worker run``: consume tool-call events until told to stop. Read it top to bottom:

1. wait until Postgres (migrated), Redis and RabbitMQ all answer;
2. connect to RabbitMQ, declare the topology, consume with a bounded prefetch;
3. for each delivery: read the envelope, process it against Postgres (one read, one writing statement
   that commits everything the event writes), publish the result and notice (confirmed) and the
   invalidation, ack. Failures go to a retry queue or the DLQ, never in a loop;
4. when the connection is lost: let in-flight events fail, reconnect with backoff, consume again
   (unacked deliveries are redelivered and answered from the store);
5. on SIGTERM/SIGINT: stop consuming, finish in-flight events within the grace period, close, exit 0.
   A second signal exits at once; whatever was not acked is requeued by the broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import random
import signal
import time
from collections.abc import Awaitable
from typing import Any

import aio_pika
import asyncpg
import structlog
from aio_pika.abc import AbstractConnection, AbstractIncomingMessage, AbstractQueue

from contracts.models import ToolCallEvent
from worker.backoff import Backoff
from worker.broker.envelope import RoutableIds, Unreadable, read_event
from worker.broker.publisher import ATTEMPTS, TRACEPARENT, Publisher
from worker.broker.topology import (
    backoff_tier,
    declare_topology,
    retry_delays,
    retry_queue_name,
    work_queue_arguments,
)
from worker.cache import InvalidationPublisher
from worker.config import Settings
from worker.faults import is_transient
from worker.http import HealthServer
from worker.metrics import Metrics
from worker.outbox import InvalidationOutbox
from worker.pipeline import outcome
from worker.store.batcher import Batcher
from worker.store.migrate import pending_migrations
from worker.store.pool import create_pool
from worker.store.unit_of_work import ProcessedEvent, utcnow
from worker.tracing import Attribute, EventSpan, create_tracer

log = structlog.get_logger("worker")

#: a connection that lived this long was not a failed try: the next loss starts the backoff afresh
RECONNECT_RESET_SECONDS = 30.0
#: how long closing the Postgres pool may wait for connections to be handed back before closing them hard
POOL_CLOSE_SECONDS = 3.0
#: how long abandoned events and batches get to let go of Postgres before their connections are cut
ABANDON_SECONDS = 5.0
#: pause before a delivery the worker could not route is handed back (no hot loop through the broker)
UNSETTLED_REQUEUE_SECONDS = 1.0


class Worker:
    """One worker process: any number of them may consume the same queue."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.delays = retry_delays(
            settings.retry_base_delay_ms, settings.retry_max_delay_ms, settings.retry_max_attempts
        )
        self._stopping = asyncio.Event()
        self._signals = 0
        self._slots = asyncio.Semaphore(settings.concurrency)
        self._inflight: set[asyncio.Task[Any]] = set()
        self._pool: asyncpg.Pool | None = None
        self._batcher: Batcher | None = None
        self._cache = InvalidationPublisher(settings.redis_url, settings.topology.invalidation_channel)
        self._outbox: InvalidationOutbox | None = None
        self._publisher: Publisher | None = None
        self._consuming = False
        self.metrics = Metrics()
        self._tracer = create_tracer(settings.tracing, settings.topology.work_queue)
        self._http = (
            HealthServer(settings.http_port, self.readiness, self.metrics) if settings.http_port > 0 else None
        )

    # -- lifecycle ---------------------------------------------------------------------------------

    async def run(self) -> int:
        """Run until stopped; the exit code (0 after a graceful stop)."""
        self._install_signal_handlers()
        for var, raw, default in self.settings.fallbacks:
            log.warning("invalid setting, using the default", variable=var, value=raw, default=default)
        try:
            if self._http is not None:
                await self._http.start()
                log.info("probe endpoint listening", port=self.settings.http_port)
            if not await self._wait_for_dependencies():
                return 0
            assert self._outbox is not None
            self._outbox.start()
            # everything allocated at start-up lives as long as the process: keep it out of the collector's
            # way, so full collections (tail-latency spikes under load) only walk per-event garbage
            gc.collect()
            gc.freeze()
            backoff = Backoff()
            while not self._stopping.is_set():
                started = time.monotonic()
                failure: str | None = None
                try:
                    await self._consume_until_stopped_or_lost()
                except Exception as exc:  # connection refused, declare failed, channel died mid-start
                    failure = _describe(exc)
                if self._stopping.is_set():
                    break
                if time.monotonic() - started > RECONNECT_RESET_SECONDS:
                    backoff.reset()
                delay = backoff.next()
                if failure is not None:
                    log.warning("rabbitmq unavailable", error=failure, retry_in_s=round(delay, 2))
                await self._sleep_unless_stopping(delay)
            return 0
        finally:
            await self._close()

    def _install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)

    def _on_signal(self, sig: signal.Signals) -> None:
        self._signals += 1
        if self._signals > 1:
            log.warning("second signal: exiting now; unacked events will be redelivered", signal=sig.name)
            os._exit(1)
        log.info(
            "stopping: no new events; finishing the ones in flight",
            signal=sig.name,
            in_flight=len(self._inflight),
            grace_s=self.settings.shutdown_grace_seconds,
        )
        self._stopping.set()

    async def _sleep_unless_stopping(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), timeout=seconds)

    async def _wait_for_dependencies(self) -> bool:
        """Wait until Postgres (migrated) and Redis answer; False if stopped first. RabbitMQ is the loop's."""
        backoff = Backoff()
        while not self._stopping.is_set():
            problems = await self._dependency_problems()
            if not problems:
                return True
            delay = backoff.next()
            for name, problem in problems.items():
                log.warning(
                    "waiting for dependency", dependency=name, problem=problem, retry_in_s=round(delay, 2)
                )
            await self._sleep_unless_stopping(delay)
        return False

    async def _dependency_problems(self) -> dict[str, str]:
        problems: dict[str, str] = {}
        try:
            pending = await pending_migrations(self.settings.postgres_dsn)
            if pending:
                problems["postgres"] = f"schema not migrated (run `worker migrate`): {', '.join(pending)}"
            elif self._pool is None:
                self._pool = await create_pool(
                    self.settings.postgres_dsn, size=self.settings.postgres_pool_size
                )
                # at most as many batches at Postgres at once as the pool has connections (usually one:
                # see Batcher); a batch holds at most the events the worker processes at once
                self._batcher = Batcher(
                    self._pool,
                    self.settings.limits,
                    max_running=self.settings.postgres_pool_size,
                    max_batch=self.settings.concurrency,
                    on_batch=self.metrics.batch_size.observe,
                )
                self._outbox = InvalidationOutbox(
                    self._pool,
                    self._cache,
                    on_backlog=self.metrics.invalidations_pending.set,
                    on_deferred=self.metrics.invalidations_deferred.inc,
                )
        except Exception as exc:
            problems["postgres"] = _describe(exc)
        try:
            await self._cache.ping()
        except Exception as exc:
            problems["redis"] = _describe(exc)
        return problems

    async def readiness(self) -> dict[str, str | None]:
        """``/readyz``: None per dependency that works, else what is wrong with it."""
        checks: dict[str, str | None] = {
            "rabbitmq": None if self._consuming else "not consuming (connecting or reconnecting)"
        }
        checks["postgres"] = await _probe(self._ping_postgres())
        checks["redis"] = await _probe(self._cache.ping())
        for name, problem in checks.items():
            self.metrics.dependency_up.labels(name).set(0 if problem else 1)
        return checks

    async def _ping_postgres(self) -> None:
        if self._pool is None:
            raise RuntimeError("not connected yet")
        async with self._pool.acquire(timeout=2) as conn:
            await conn.fetchval("SELECT 1")

    async def _close(self) -> None:
        if self._http is not None:
            await self._http.close()
        if self._outbox is not None:
            await self._outbox.close()
        if self._batcher is not None:
            # cancel what is left; a batch stuck on a Postgres that does not answer ends with the pool below
            await self._batcher.abandon(timeout=0)
        if self._pool is not None:
            # A graceful close waits for every connection to come back; one held by an abandoned event
            # whose Postgres does not answer the cancel (a frozen server, a partition) never does, e.g.
            # after a broker outage, and the process would never exit. Its event is redelivered anyway.
            try:
                await asyncio.wait_for(self._pool.close(), timeout=POOL_CLOSE_SECONDS)
            except TimeoutError:
                log.warning("postgres connections not released in time; closed without waiting")
                self._pool.terminate()
        await self._cache.close()
        self._tracer.shutdown()

    # -- one connection's life -----------------------------------------------------------------------

    async def _consume_until_stopped_or_lost(self) -> None:
        settings = self.settings
        connection = await aio_pika.connect(settings.rabbitmq_url, timeout=10)
        lost = asyncio.Event()
        connection.close_callbacks.add(lambda *_: lost.set())
        try:
            publish_channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
            publish_channel.close_callbacks.add(lambda *_: lost.set())
            declared = await declare_topology(publish_channel, settings.topology, self.delays)
            self._publisher = Publisher(
                results=declared.results,
                notifications=declared.notifications,
                dead_letter=declared.dead_letter,
                default=publish_channel.default_exchange,
            )
            consume_channel = await connection.channel(publisher_confirms=False)
            consume_channel.close_callbacks.add(lambda *_: lost.set())
            await consume_channel.set_qos(prefetch_count=settings.prefetch)
            queue = await consume_channel.declare_queue(
                settings.topology.work_queue, durable=True, arguments=work_queue_arguments(settings.topology)
            )
            # the broker may cancel the consumer itself (the queue was deleted, a node went away): aio-pika
            # does not restore it, so treat it like a lost connection and start over (declare, consume)
            underlay = await consume_channel.get_underlay_channel()
            underlay.on_consumer_cancel_callbacks.add(lambda *_: self._consumer_cancelled(lost))
            tag = await queue.consume(self._on_message, no_ack=False)
            self._consuming = True
            self.metrics.dependency_up.labels("rabbitmq").set(1)
            log.info(
                "consuming", queue=queue.name, prefetch=settings.prefetch, concurrency=settings.concurrency
            )
            await _first(self._stopping.wait(), lost.wait())
            if self._stopping.is_set() and not lost.is_set():
                await self._drain(queue, tag)
            else:
                log.warning("rabbitmq connection lost; reconnecting", in_flight=len(self._inflight))
                await self._abandon_inflight()
        finally:
            self._consuming = False
            self.metrics.dependency_up.labels("rabbitmq").set(0)
            self._publisher = None
            await _close_quietly(connection)

    def _consumer_cancelled(self, lost: asyncio.Event) -> None:
        if not self._stopping.is_set():
            log.warning("rabbitmq cancelled the consumer; reconnecting")
            lost.set()

    async def _drain(self, queue: AbstractQueue, tag: str) -> None:
        """Graceful stop: no new deliveries, wait for in-flight events up to the grace period."""
        try:
            await queue.cancel(tag)
        except Exception as exc:
            log.warning("could not cancel the consumer", error=_describe(exc))
        deadline = time.monotonic() + self.settings.shutdown_grace_seconds
        while self._inflight and time.monotonic() < deadline:
            await asyncio.wait(set(self._inflight), timeout=max(0.0, deadline - time.monotonic()))
        stuck = 0
        if self._inflight:
            log.warning("grace period over: in-flight events are requeued", requeued=len(self._inflight))
            stuck = await self._abandon_inflight()
        if stuck and self._pool is not None:
            # Cancelled events still wait for Postgres (a server that does not answer the cancel):
            # closing the channel would wait for them too. Cut their connections; the broker requeues
            # the events and the ledger answers any whose commit did go through.
            log.warning("postgres does not answer; closing its connections", stuck=stuck)
            self._pool.terminate()
        log.info("stopped cleanly")

    async def _abandon_inflight(self) -> int:
        """Cancel what is still running: the broker requeues the unacked deliveries, and the ledger answers
        any whose write had already committed. Returns how many events or batches are still stuck after
        5 s (waiting on a Postgres that does not answer the cancel)."""
        deadline = time.monotonic() + ABANDON_SECONDS
        tasks = set(self._inflight)
        for task in tasks:
            task.cancel()
        stuck_batches = 0
        if self._batcher is not None:
            stuck_batches = await self._batcher.abandon(timeout=ABANDON_SECONDS)
        if tasks:
            await asyncio.wait(tasks, timeout=max(0.0, deadline - time.monotonic()))
        return len(self._inflight) + stuck_batches

    # -- one delivery ----------------------------------------------------------------------------------

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._inflight.add(task)
        try:
            if not await self._take_slot():
                # stopping before this event started: hand it back now, so another worker takes it
                # without waiting for this one's drain to end
                with contextlib.suppress(Exception):
                    await message.nack(requeue=True)
                return
            try:
                await self._handle(message)
            except Exception as exc:  # a path that forgot a failure: still a bug, but not a stuck delivery
                log.error("unexpected error handling a delivery", error=_describe(exc), exc_info=exc)
            finally:
                self._slots.release()
            await self._settle_leftover(message)
        except asyncio.CancelledError:
            pass
        finally:
            if task is not None:
                self._inflight.discard(task)

    async def _settle_leftover(self, message: AbstractIncomingMessage) -> None:
        """Every delivery ends settled: one the handler could neither ack nor route (the broker refused a
        retry or dead-letter copy) is handed back after a pause, so it does not hold a prefetch slot
        until the connection closes. Each hand-back counts toward the work queue's delivery limit, so a
        delivery that can never be routed reaches the DLQ through the broker, never loops for ever."""
        if message.processed or message.channel.is_closed:
            return  # settled, or the broker requeues it with the channel
        log.warning(
            "delivery not settled; handing it back to the queue",
            message_id=message.message_id,
            delivery_tag=message.delivery_tag,
            retry_in_s=UNSETTLED_REQUEUE_SECONDS,
        )
        await self._sleep_unless_stopping(UNSETTLED_REQUEUE_SECONDS)
        try:
            await message.nack(requeue=True)
        except Exception as exc:
            log.warning("could not hand a delivery back; the broker requeues it", error=_describe(exc))

    async def _take_slot(self) -> bool:
        """Wait for one of the ``concurrency`` slots; ``False`` when the worker starts stopping first.

        A slot taken here is released by the caller. If this wait is cancelled (connection lost) or
        loses to the stop, a slot it won anyway is given back: a leaked slot would idle the worker.
        """
        if self._stopping.is_set():
            return False
        if not self._slots.locked():
            await self._slots.acquire()
            return True
        acquire = asyncio.ensure_future(self._slots.acquire())
        stop = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({acquire, stop}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            await self._give_back(acquire)
            raise
        finally:
            stop.cancel()
        if acquire.done() and not self._stopping.is_set():
            return True
        await self._give_back(acquire)
        return False

    async def _give_back(self, acquire: asyncio.Future[Any]) -> None:
        """Abandon a slot wait: cancel it, and release the slot if it was won before the cancel landed."""
        if not acquire.done():
            acquire.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait({acquire})
        if acquire.done() and not acquire.cancelled() and acquire.exception() is None:
            self._slots.release()

    async def _handle(self, message: AbstractIncomingMessage) -> None:
        started = time.monotonic()
        attempt = _attempts_made(message) + 1
        parsed = read_event(message.body)
        if isinstance(parsed, Unreadable):
            event_id = str(parsed.ids.event_id) if parsed.ids else None
            failure = outcome.internal_error(parsed.error) if parsed.ids else None
            try:
                await self._dead_letter(
                    message,
                    parsed.kind,
                    parsed.error,
                    1,
                    parsed.ids,
                    failure,
                    traceparent=_traceparent(message),
                )
            except Exception as exc:  # the DLQ copy was refused or not confirmed: nothing was acked
                log.warning(
                    "could not dead-letter an unreadable event; it will be redelivered",
                    kind=parsed.kind,
                    event_id=event_id,
                    error=_describe(exc),
                )
                return
            log.warning(
                "dead-lettered unreadable event", kind=parsed.kind, error=parsed.error, event_id=event_id
            )
            return
        event = parsed
        fields = {
            "event_id": str(event.event_id),
            "tool_call_id": event.tool_call_id,
            "shard_id": event.shard_id,
            "attempts": attempt,
        }
        span_attributes: dict[str, Attribute] = {
            "messaging.message.id": str(event.event_id),
            "ltm.tool_call_id": event.tool_call_id,
            "ltm.shard_id": event.shard_id,
            "ltm.attempts": attempt,
        }
        with self._tracer.event_span(_traceparent(message), span_attributes) as span:
            processed: ProcessedEvent | None = None
            self.metrics.in_flight.inc()
            try:
                assert self._batcher is not None
                processed = await self._batcher.process(event, attempt)
                span.set(
                    {
                        "ltm.status": processed.status,
                        "ltm.memory_id": processed.memory_id,
                        "ltm.replayed": processed.replayed,
                    }
                )
                await self._publish(event, processed, span.traceparent)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                span.fail(exc)
                await self._fail(
                    message, event, attempt, exc, committed=processed is not None, fields=fields, span=span
                )
                return
            finally:
                self.metrics.in_flight.dec()
            if not await _ack(message):
                return  # the channel closed: the broker redelivers it, and the ledger answers it
            elapsed = time.monotonic() - started
            self.metrics.events.labels(processed.status).inc()
            self.metrics.duration.observe(elapsed)
            if processed.replayed:
                self.metrics.replayed.inc()
            if processed.memory_id is not None:
                log.debug(
                    "memory content",
                    event_id=fields["event_id"],
                    content=processed.result["data"].get("content_saved"),
                )
            log.info(
                "event processed",
                **fields,
                status=processed.status,
                memory_id=processed.memory_id,
                replayed=processed.replayed,
                duration_ms=round(elapsed * 1000, 1),
            )

    async def _publish(
        self, event: ToolCallEvent, processed: ProcessedEvent, traceparent: str | None
    ) -> None:
        """Result and notice (confirmed) and the invalidation, side by side: all must succeed before the ack,
        none waits for another. The invalidation succeeds once it is in Redis or pending in the outbox."""
        assert self._publisher is not None
        assert self._outbox is not None
        outputs = [
            self._publisher.publish_outputs(
                event_id=event.event_id,
                tool_call_id=event.tool_call_id,
                shard_id=event.shard_id,
                result=processed.result,
                notification=processed.notification,
                traceparent=traceparent,
            )
        ]
        if processed.invalidation is not None:
            outputs.append(self._outbox.publish(event.event_id, processed.invalidation))
        await asyncio.gather(*outputs)

    async def _fail(
        self,
        message: AbstractIncomingMessage,
        event: ToolCallEvent,
        attempt: int,
        exc: Exception,
        *,
        committed: bool,
        fields: dict[str, Any],
        span: EventSpan,
    ) -> None:
        """Route a failed attempt: retry later, or dead-letter it (with a failure result when none exists)."""
        ids = RoutableIds(event.event_id, event.tool_call_id, event.shard_id, event.tool_name)
        reason = _describe(exc)
        if self._publisher is None:
            # the broker connection is gone: this delivery can be neither routed nor acked, and the
            # broker redelivers it after the reconnect (answered from the ledger if it committed)
            log.warning("connection lost mid-event; it will be redelivered", **fields, error=reason)
            return
        try:
            if not is_transient(exc):
                log.error("internal error; dead-lettered", **fields, error=reason, exc_info=exc)
                failure = None if committed else outcome.internal_error(f"{type(exc).__name__}: {exc}")
                span.set({"ltm.status": failure.status if failure else None})
                await self._dead_letter(
                    message, "internal", reason, attempt, ids, failure, traceparent=span.traceparent
                )
            elif attempt >= self.settings.retry_max_attempts:
                log.error("transient fault outlasted every retry; dead-lettered", **fields, error=reason)
                failure = None if committed else outcome.database_error()
                span.set({"ltm.status": failure.status if failure else None})
                await self._dead_letter(
                    message,
                    "transient_exhausted",
                    reason,
                    attempt,
                    ids,
                    failure,
                    traceparent=span.traceparent,
                )
            else:
                delay = self._delay_before(attempt + 1)
                assert self._publisher is not None
                queue = retry_queue_name(self.settings.topology, self._tier_before(attempt + 1))
                await self._publisher.retry_later(message, queue=queue, attempts=attempt, delay_ms=delay)
                self.metrics.retries.inc()
                await _ack(message)
                log.warning("transient fault; retrying later", **fields, error=reason, retry_in_ms=delay)
        except Exception as routing_error:
            # the broker refused the retry or dead-letter copy: the delivery is handed back to the work
            # queue (see _settle_leftover), or requeued by the broker if the connection is gone
            log.warning(
                "could not route a failed event; it will be redelivered",
                **fields,
                error=_describe(routing_error),
            )

    def _tier_before(self, attempt: int) -> int:
        """The retry queue's nominal delay before ``attempt`` (2 = first retry)."""
        s = self.settings
        return backoff_tier(s.retry_base_delay_ms, s.retry_max_delay_ms, attempt)

    def _delay_before(self, attempt: int) -> int:
        """The tier's delay with jitter (75-100%), so a burst of failures does not come back as one."""
        return max(1, int(self._tier_before(attempt) * random.uniform(0.75, 1.0)))

    async def _dead_letter(
        self,
        message: AbstractIncomingMessage,
        kind: str,
        error: str,
        attempts: int,
        ids: RoutableIds | None,
        failure: outcome.Outcome | None,
        *,
        traceparent: str | None,
    ) -> None:
        """DLQ copy first (confirmed), then the failure result for a waiting shard, then the ack.

        Once the DLQ copy is confirmed the delivery is acked whatever becomes of the failure result: the
        dead letter is the record (a replay answers the shard), and an unacked delivery would come back
        and be dead-lettered again. A failure result the broker cannot route (no queue bound for the
        shard) or does not confirm is logged, not retried. The DLQ copy keeps the event's own headers;
        the failure result carries ``traceparent``."""
        assert self._publisher is not None
        await self._publisher.dead_letter(message, kind=kind, error=error, attempts=attempts)
        self.metrics.dead_letters.labels(kind).inc()
        if ids is not None and failure is not None:
            try:
                result = failure.result_for(ids.event_id, ids.tool_call_id, ids.tool_name, utcnow())
                await self._publisher.publish_outputs(
                    event_id=ids.event_id,
                    tool_call_id=ids.tool_call_id,
                    shard_id=ids.shard_id,
                    result=result.model_dump(mode="json"),
                    notification=None,
                    traceparent=traceparent,
                )
            except Exception as exc:
                log.warning(
                    "failure result not delivered; the dead letter keeps the event",
                    event_id=str(ids.event_id),
                    shard_id=ids.shard_id,
                    kind=kind,
                    error=_describe(exc),
                )
        await _ack(message)


async def _ack(message: AbstractIncomingMessage) -> bool:
    """Ack ``message``; False when its channel is gone (the broker then redelivers it)."""
    try:
        await message.ack()
    except Exception as exc:
        log.warning(
            "ack failed; the broker redelivers the event", message_id=message.message_id, error=_describe(exc)
        )
        return False
    return True


def _attempts_made(message: AbstractIncomingMessage) -> int:
    value = (message.headers or {}).get(ATTEMPTS)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return int(value)
    return 0


def _traceparent(message: AbstractIncomingMessage) -> str | None:
    value = (message.headers or {}).get(TRACEPARENT)
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    return value if isinstance(value, str) and value else None


def _describe(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or "(no message)"
    return f"{type(exc).__name__}: {text}"[:500]


async def _first(*waits: Any) -> None:
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


async def _probe(check: Awaitable[Any], timeout: float = 3.0) -> str | None:
    """None when ``check`` completes in time, else a one-line reason."""
    try:
        await asyncio.wait_for(check, timeout=timeout)
    except Exception as exc:
        return _describe(exc)
    return None


async def _close_quietly(connection: AbstractConnection) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(connection.close(), timeout=5)
