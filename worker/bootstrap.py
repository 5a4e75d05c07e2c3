"""The composition root: builds every long-lived part of ``worker run`` and tears them down in reverse.

:func:`open_services` is the only place that knows every part: metrics, the probe server, tracing, the Redis
publisher, then (once Postgres is migrated and Redis answers) the pool, the batcher and the invalidation
outbox. Everything it yields is ready; nothing downstream checks for ``None``. A test may hand it its own
Postgres pool, Redis publisher or tracer (it then neither builds nor closes them).

What it yields is a :class:`~worker.runtime.services.Services`, whose
:meth:`~worker.runtime.services.Services.handler_for`
wires one connection's handler. Nothing below imports this module: the runner (worker/runner.py) and the
tests call it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator

import asyncpg
import structlog

from worker.broker import content_header
from worker.broker.topology import shard_queue_name
from worker.broker.urls import Nodes
from worker.config import Settings, connection_problems, refused_settings
from worker.faults import Problem, explain, needs_a_person
from worker.invalidation.outbox import InvalidationOutbox
from worker.invalidation.redis import InvalidationPublisher
from worker.observability.activity import ActivityRecorder
from worker.observability.http_server import HealthServer
from worker.observability.metrics import Metrics
from worker.observability.probes import InvalidSetting, Readiness, migrations_problem, probe
from worker.observability.sampler import Sampler, sampled_queues
from worker.observability.tracing import EventTracer, create_tracer
from worker.redact import describe
from worker.runtime.backoff import Backoff
from worker.runtime.services import Services
from worker.service.batcher import Batcher
from worker.service.policy import RetryPolicy
from worker.store.pool import create_pool
from worker.store.shard_queues import registered_shards

log = structlog.get_logger("worker")

#: how long closing the Postgres pool may wait for connections to be handed back before closing them hard
POOL_CLOSE_SECONDS = 3.0


class Stopped(Exception):
    """The worker was stopped while :func:`open_services` still waited for Postgres or Redis."""


@contextlib.asynccontextmanager
async def open_services(
    settings: Settings,
    stopping: asyncio.Event,
    *,
    pool: asyncpg.Pool | None = None,
    cache: InvalidationPublisher | None = None,
    tracer: EventTracer | None = None,
) -> AsyncIterator[Services]:
    """Build the worker's parts, waiting (with backoff, logged) until Postgres is migrated and Redis answers.

    ``pool``, ``cache`` and ``tracer`` replace the ones built from ``settings``; whoever passes one closes
    it. Raises :class:`Stopped` when ``stopping`` is set before the dependencies answer. On exit everything
    is closed in reverse order.
    """
    # process-wide, before the first connection: a worker in a test's event loop, not started by
    # worker/cli.py (which installs it for every command), decodes any content header all the same
    content_header.install()
    # a URL that can never work, an identity setting mistyped: nothing to wait for
    problems = [*connection_problems(settings).values(), *refused_settings(settings).values()]
    if problems:
        raise InvalidSetting("; ".join(problems))
    try:
        nodes = Nodes.from_setting(settings.rabbitmq_url)
    except ValueError as exc:
        raise InvalidSetting(f"invalid LTM_RABBITMQ_URL: {exc}") from exc
    async with contextlib.AsyncExitStack() as stack:
        metrics = Metrics()
        if tracer is None:
            tracer = create_tracer(settings.tracing, settings.topology.work_queue)
            stack.callback(tracer.shutdown)
        if cache is None:
            cache = InvalidationPublisher(settings.redis_url, settings.topology.invalidation_channel)
            stack.push_async_callback(cache.close)
        readiness = Readiness(cache, metrics)
        sampler: Sampler | None = None
        if settings.http_port > 0:
            http = HealthServer(settings.http_port, readiness.check, metrics, host=settings.http_host)
            await http.start()
            stack.push_async_callback(http.close)
            log.info("probe endpoint listening", host=settings.http_host, port=settings.http_port)
            # queue depths and dependency state for /metrics: sampled only when something can scrape them
            sampler = Sampler(
                settings.rabbitmq_url,
                sampled_queues(settings),
                metrics,
                readiness.check,
                interval=settings.metrics_interval_seconds,
            )
            sampler.start()
            stack.push_async_callback(sampler.close)
        if pool is None:
            pool = await _wait_for_dependencies(settings, cache, stopping)
            stack.push_async_callback(_close_pool, pool)
        else:
            await _wait_for_dependencies(settings, cache, stopping, given=pool)
        readiness.pool = pool
        if sampler is not None:  # the shards' own queues are recorded in Postgres: sample them from now on
            shard_queue = functools.partial(shard_queue_name, settings.topology)
            sampler.sample_shards(functools.partial(registered_shards, pool), shard_queue)
        # at most as many batches at Postgres at once as the pool has connections (usually one: see
        # Batcher); a batch holds at most the events the worker processes at once
        batcher = Batcher(
            pool,
            settings.limits,
            max_running=settings.postgres_pool_size,
            max_batch=settings.concurrency,
            on_batch=metrics.batch_size.observe,
        )
        # cancel what is left; a batch stuck on a Postgres that does not answer ends with the pool
        stack.push_async_callback(batcher.abandon, 0)
        outbox = InvalidationOutbox(
            pool,
            cache,
            on_backlog=metrics.invalidations_pending.set,
            on_deferred=metrics.invalidations_deferred.inc,
        )
        outbox.start()
        stack.push_async_callback(outbox.close)
        # what this worker sees of each shard, for `worker shards` (no Prometheus needed)
        recorder = ActivityRecorder(pool, metrics.activity, settings.metrics_interval_seconds)
        recorder.start()
        stack.push_async_callback(recorder.close)
        policy = RetryPolicy.of(settings)
        yield Services(settings, policy, metrics, tracer, readiness, pool, batcher, outbox, nodes)


async def _wait_for_dependencies(
    settings: Settings,
    cache: InvalidationPublisher,
    stopping: asyncio.Event,
    *,
    given: asyncpg.Pool | None = None,
) -> asyncpg.Pool:
    """Wait until Postgres (migrated) and Redis answer; the pool (``given``, else a new one). Raises
    :class:`Stopped` if stopped first. RabbitMQ is the consumer's (each connection's)."""
    backoff = Backoff()
    pool: asyncpg.Pool | None = given
    while not stopping.is_set():
        problems: dict[str, Problem] = {}
        postgres = await migrations_problem(settings.postgres_dsn)
        if postgres is None and pool is None:
            try:
                pool = await create_pool(
                    settings.postgres_dsn,
                    size=settings.postgres_pool_size,
                    statement_cache_size=settings.postgres_statement_cache_size,
                )
            except Exception as exc:
                postgres = explain(exc, settings.postgres_dsn)
        if postgres is not None:
            problems["postgres"] = postgres
        redis = await probe(cache.ping(), url=settings.redis_url)
        if redis is not None:
            problems["redis"] = redis
        if not problems:
            assert pool is not None  # no Postgres problem: the pool exists
            return pool
        delay = backoff.next()
        for name, problem in problems.items():
            # a refused login or certificate, a missing database, an unknown host will not pass by itself
            # (someone must act): an error, but still waited on, like any other dependency failure
            report = log.error if needs_a_person(problem) else log.warning
            report("waiting for dependency", dependency=name, problem=problem, retry_in_s=round(delay, 2))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), timeout=delay)
    if pool is not None and pool is not given:
        await _close_pool(pool)
    raise Stopped


async def _close_pool(pool: asyncpg.Pool) -> None:
    # A graceful close waits for every connection to come back; one held by an abandoned event whose
    # Postgres does not answer the cancel (a frozen server, a partition) never does, e.g. after a broker
    # outage, and the process would never exit. Its event is redelivered anyway.
    try:
        await asyncio.wait_for(pool.close(), timeout=POOL_CLOSE_SECONDS)
    except TimeoutError:
        log.warning("postgres connections not released in time; closed without waiting")
        pool.terminate()
    except Exception as exc:
        log.warning("could not close the postgres pool", error=describe(exc))
        pool.terminate()
