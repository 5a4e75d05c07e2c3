"""Background sampling for ``/metrics``: queue depths and dependency state, every few seconds.

Every ``LTM_METRICS_INTERVAL_SECONDS`` (default 15) the sampler

- passively declares the work queue, each retry queue and the DLQ on a channel of its own connection and
  sets ``ltm_queue_messages{queue}`` and ``ltm_queue_consumers{queue}`` from the answers. A passive declare
  is one small frame each way, creates nothing and needs no permission beyond the vhost, so with the
  default retry settings a worker costs the broker 6 declares per 15 s; 20 workers, 8 a second. Each pod
  reports the same numbers: aggregate with ``max`` (not ``sum``) across pods;
- once the worker has its Postgres pool (:meth:`Sampler.sample_shards`), reads the shards that have a queue
  of their own (``ltm_shard_queues``: one small query) and passively declares each shard's queue
  ``ltm.create_memory.shard.<N>`` on the same channel, one after the other, setting
  ``ltm_shard_events_queued{shard}`` (its ready messages; the events workers hold are
  ``ltm_shard_events_held``). That is one declare per shard per interval per worker. Measured with 1,024
  quorum shard queues on RabbitMQ 3.10 (one CPU, loopback): 0.4 s per sample, 0.24 s of the worker's CPU
  (1.6 % of a core at the 15 s default) and 0.16 s of the broker's, so 20 workers cost the broker about a
  fifth of a core; raise ``LTM_METRICS_INTERVAL_SECONDS`` to pay less. The shard queues are not also in
  ``ltm_queue_messages``/``ltm_queue_consumers``: those stay the few queues every panel and alert lists,
  and 1,024 shards would add 2,048 series per pod saying nothing ``ltm_shard_events_queued`` does not;
- refreshes ``ltm_dependency_up`` through the worker's readiness check, so the gauge is current even when
  nothing calls ``/readyz``.

Its own connection keeps the sampling out of the consumer's way: a passive declare of a missing queue
closes its channel (404), and a broker outage is seen here without waiting for the consumer's reconnect.
When a sample cannot be taken its series are removed rather than left stale: a queue that is gone, a shard no
longer recorded, every queue and shard while the broker does not answer, every shard while Postgres does not.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable, Sequence

import aio_pika
import structlog
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractQueue

from worker.broker.topology import retry_queue_name
from worker.broker.urls import Nodes
from worker.config import Settings
from worker.observability.metrics import Metrics
from worker.redact import describe
from worker.service.policy import RetryPolicy

log = structlog.get_logger("worker.sampler")

DEFAULT_INTERVAL_SECONDS = 15
#: how long reading the recorded shards may take (a Postgres that does not answer must not stall the sampling)
SHARDS_TIMEOUT_SECONDS = 5.0

#: the shards that have a queue of their own, in order (``worker.store.shard_queues.registered_shards``)
ShardSource = Callable[[], Awaitable[Sequence[int]]]


def sampled_queues(settings: Settings) -> list[str]:
    """The queues whose depth /metrics reports: the work queue, every retry tier, the DLQ and its copies
    (the dead letters not yet kept in Postgres)."""
    topology = settings.topology
    delays = RetryPolicy.of(settings).tiers()
    return [
        topology.work_queue,
        *[retry_queue_name(topology, delay) for delay in delays],
        topology.dead_letter_queue,
        topology.dead_letter_copies_queue,
    ]


class Sampler:
    """Samples queue depths and dependency state into ``metrics`` until closed."""

    def __init__(
        self,
        rabbitmq_url: str,
        queues: Sequence[str],
        metrics: Metrics,
        refresh_dependencies: Callable[[], Awaitable[object]],
        interval: float = DEFAULT_INTERVAL_SECONDS,
    ) -> None:
        # several cluster nodes: sample through whichever answers (worker/broker/urls.py)
        self._nodes = Nodes.from_setting(rabbitmq_url)
        self._queues = tuple(queues)
        self._metrics = metrics
        self._refresh_dependencies = refresh_dependencies
        self._interval = interval
        self._connection: AbstractConnection | None = None
        self._channel: AbstractChannel | None = None
        self._task: asyncio.Task[None] | None = None
        self._failing = False
        #: where the shards come from and what their queues are called; None until the pool exists
        self._shards: ShardSource | None = None
        self._shard_queue: Callable[[int], str] | None = None
        #: the shards with a ``ltm_shard_events_queued`` series now
        self._reported_shards: set[int] = set()
        self._shards_failing = False

    def sample_shards(self, shards: ShardSource, queue_name: Callable[[int], str]) -> None:
        """From the next sample on, also report the depth of each of ``shards()``'s own queue, named by
        ``queue_name`` (the worker calls this once its Postgres pool exists)."""
        self._shards = shards
        self._shard_queue = queue_name

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="metrics-sampler")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._disconnect()

    async def _loop(self) -> None:
        while True:
            await self.sample_once()
            await asyncio.sleep(self._interval)

    async def sample_once(self) -> None:
        """Take one sample of everything; never raises (a failure shows as missing series)."""
        with contextlib.suppress(Exception):
            await self._refresh_dependencies()
        shards = await self._read_shards()
        try:
            await self._sample_queues()
            if shards is not None:
                await self._sample_shard_queues(shards)
        except Exception as exc:
            self._forget_queues()
            self._forget_shards(self._reported_shards)
            await self._disconnect()
            if not self._failing:  # once per outage, not once per interval
                log.warning("could not sample queue depths", error=describe(exc)[:300])
            self._failing = True
        else:
            self._failing = False

    async def _read_shards(self) -> list[int] | None:
        """The shards to sample, or None (none to sample yet, or Postgres did not say: their series go)."""
        if self._shards is None:
            return None
        try:
            shards = list(await asyncio.wait_for(self._shards(), timeout=SHARDS_TIMEOUT_SECONDS))
        except Exception as exc:
            self._forget_shards(self._reported_shards)
            if not self._shards_failing:
                log.warning("could not read the shards to sample", error=describe(exc)[:300])
            self._shards_failing = True
            return None
        self._shards_failing = False
        return shards

    async def _sample_queues(self) -> None:
        for name in self._queues:
            queue = await self._declare_passively(name)
            if queue is None:
                for gauge in (self._metrics.queue_messages, self._metrics.queue_consumers):
                    with contextlib.suppress(KeyError):
                        gauge.remove(name)
                continue
            result = queue.declaration_result
            self._metrics.queue_messages.labels(name).set(result.message_count or 0)
            self._metrics.queue_consumers.labels(name).set(result.consumer_count or 0)

    async def _sample_shard_queues(self, shards: Sequence[int]) -> None:
        assert self._shard_queue is not None  # set with the shard source
        self._forget_shards(self._reported_shards - set(shards))  # no longer recorded
        for shard_id in shards:
            queue = await self._declare_passively(self._shard_queue(shard_id))
            if queue is None:
                self._forget_shards([shard_id])
                continue
            self._metrics.shard_events_queued.labels(str(shard_id)).set(
                queue.declaration_result.message_count or 0
            )
            self._reported_shards.add(shard_id)

    async def _declare_passively(self, name: str) -> AbstractQueue | None:
        """The queue ``name`` as the broker describes it now, or None when it does not exist."""
        channel = await self._open_channel()
        try:
            return await channel.declare_queue(name, passive=True, timeout=5)
        except aio_pika.exceptions.ChannelNotFoundEntity:
            # the queue does not exist (yet, or any more): nothing to report; the broker closed the channel
            # (the next declare opens another). Any other refusal (access) fails the whole sample, and is
            # logged
            self._channel = None
            return None

    async def _open_channel(self) -> AbstractChannel:
        if self._connection is None or self._connection.is_closed:
            self._connection = await self._nodes.connect(
                client_properties={"connection_name": "ltm-worker metrics sampler"}
            )
            self._channel = None
        if self._channel is None or self._channel.is_closed:
            self._channel = await self._connection.channel(publisher_confirms=False)
        return self._channel

    def _forget_queues(self) -> None:
        self._metrics.queue_messages.clear()
        self._metrics.queue_consumers.clear()

    def _forget_shards(self, shards: Iterable[int]) -> None:
        for shard_id in list(shards):
            with contextlib.suppress(KeyError):
                self._metrics.shard_events_queued.remove(str(shard_id))
            self._reported_shards.discard(shard_id)

    async def _disconnect(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(connection.close(), timeout=5)
