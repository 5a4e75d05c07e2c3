"""``worker run``: the process's lifecycle. Build the services (waiting for Postgres and Redis), then
consume on one connection after another until a signal: a lost connection is followed by a jittered
reconnect, a SIGTERM/SIGINT by a graceful drain, a second signal by an immediate exit (docs/operating.md
"Shutdown").
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

import asyncpg
import structlog

from worker.bootstrap import Stopped, open_services
from worker.config import Settings
from worker.faults import Problem, explain, needs_a_person
from worker.invalidation.redis import InvalidationPublisher
from worker.observability.logs import log_setting_warnings
from worker.observability.metrics import build_versions
from worker.observability.probes import InvalidSetting
from worker.observability.tracing import EventTracer
from worker.redact import redact_setting, redact_url
from worker.runtime import heap
from worker.runtime.backoff import Backoff
from worker.runtime.consumer import Consumer
from worker.runtime.fair import FairShares

log = structlog.get_logger("worker")

#: a connection that lived this long was not a failed try: the next loss starts the backoff afresh
RECONNECT_RESET_SECONDS = 30.0


class Worker:
    """One worker process: any number of them may consume the same queue.

    ``pool``, ``cache`` and ``tracer`` replace the Postgres pool, the Redis publisher and the tracer built
    from ``settings`` (:func:`~worker.bootstrap.open_services`): a test, or a program that embeds the worker,
    hands in its own, and closes them itself after the worker stopped."""

    def __init__(
        self,
        settings: Settings,
        *,
        pool: asyncpg.Pool | None = None,
        cache: InvalidationPublisher | None = None,
        tracer: EventTracer | None = None,
    ) -> None:
        self.settings = settings
        self._pool, self._cache, self._tracer = pool, cache, tracer
        self._stopping = asyncio.Event()
        self._signals = 0
        #: how the worker shares itself out, once it runs (process-wide: it outlives a connection)
        self.fair: FairShares | None = None
        self._consumer: Consumer | None = None

    async def run(self, *, signals: bool = True) -> int:
        """Run until stopped; the exit code (0 after a graceful stop). Without ``signals`` (a worker in a
        test's event loop) SIGTERM and SIGINT are left alone: :meth:`stop` stops it."""
        if signals:
            self._install_signal_handlers()
        log_setting_warnings(self.settings)
        self._log_targets()
        try:
            return await self._run()
        except InvalidSetting as exc:
            log.error("cannot start", error=str(exc))
            return 1

    def _log_targets(self) -> None:
        """One line with what this worker is and where it writes, every password masked."""
        s = self.settings
        log.info(
            "starting",
            version=build_versions()["version"],
            postgres=redact_setting(s.postgres_dsn),
            rabbitmq=redact_setting(s.rabbitmq_url),
            redis=redact_setting(s.redis_url),
            http=f"{s.http_host}:{s.http_port}" if s.http_port else "off",
            tracing=s.tracing,
            concurrency=s.concurrency,
            prefetch=s.prefetch,
        )

    def stop(self) -> None:
        """A graceful stop, as on the first signal: no new events, the ones in flight finish."""
        self._stopping.set()

    async def _run(self) -> int:
        try:
            return await self._serve()
        except Stopped:
            return 0

    async def _serve(self) -> int:
        """One :class:`Consumer` per connection, one after another, with a jittered backoff between them.

        Why the worker reconnects itself instead of using aio-pika's ``connect_robust``: a robust
        connection restores itself inside the library, re-opening its channels, re-declaring what was
        declared on them and consuming again, so the code above it never learns that a channel died. The
        worker must learn it, because:

        - the deliveries in flight died with their channel: their tags mean nothing on a new one, and the
          per-channel :class:`~worker.broker.acks.Acks` (which coalesces acks into ``multiple``) holds the
          old channel. The worker cancels those events (the broker redelivers them; the ledger answers any
          whose write committed) and builds new acks; it also stops taking work meanwhile (``/readyz``
          says not consuming) and a stop drains instead of racing a restore;
        - ``LTM_RABBITMQ_URL`` may list several nodes: a robust connection retries the one URL it was given,
          at a fixed interval; :class:`~worker.broker.urls.Nodes` starts with the node after the lost one,
          and :class:`~worker.runtime.backoff.Backoff` spreads many workers' retries (docs/scaling-out.md);
        - each connection declares the topology again from the settings (the retry tiers of
          ``LTM_RETRY_*``), so a refused declaration (a queue deleted or re-declared with other arguments)
          surfaces as an error the operator sees, and the shards' own queues are consumed as Postgres
          records them now, not as a restore replays the old set;
        - the memory and disk alarm is watched on the connection itself (:mod:`worker.broker.blocking`),
          which a restore would replace under it.
        """
        async with open_services(
            self.settings, self._stopping, pool=self._pool, cache=self._cache, tracer=self._tracer
        ) as services:
            # start-up's objects out of the collector's way, and fewer young collections (runtime/heap.py)
            heap.freeze_startup()
            backoff = Backoff()
            # process-wide, it outlives a connection: what each connection holds gives itself back
            self.fair = fair = FairShares(self.settings, self._stopping, services.metrics)
            while not self._stopping.is_set():
                started = time.monotonic()
                failure: Problem | None = None
                self._consumer = Consumer(services, fair, self._stopping)
                try:
                    await self._consumer.run()
                except Exception as exc:  # connection refused, declare failed, channel died mid-start
                    # several nodes that all failed come as one error already explained node by node
                    failure = explain(exc, services.nodes.current or services.nodes.urls[0])
                if self._stopping.is_set():
                    break
                if time.monotonic() - started > RECONNECT_RESET_SECONDS:
                    backoff.reset()
                delay = backoff.next()
                if failure is not None:
                    # a refused login, vhost, permission or certificate, or a host name that does not
                    # resolve, is an error (it needs a person) but is retried all the same: a secret or a
                    # permission fixed on the other side heals the worker without a restart (README
                    # "Operating it"). aiormq's own record of a failed connect is lowered to DEBUG
                    # (worker/observability/logs.py), so each attempt is this one line, naming the node(s)
                    report = log.error if needs_a_person(failure) else log.warning
                    urls = services.nodes.urls
                    where = (
                        {"node": redact_url(urls[0])}
                        if len(urls) == 1
                        else {"nodes": redact_url(",".join(urls))}
                    )
                    report("rabbitmq unavailable", **where, error=failure, retry_in_s=round(delay, 2))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), timeout=delay)
        return 0

    def _install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)

    def _on_signal(self, sig: signal.Signals) -> None:
        # act first, then say it: nothing a log line does may stand between a signal and the stop
        self._signals += 1
        if self._signals > 1:
            try:
                log.warning("second signal: exiting now; unacked events will be redelivered", signal=sig.name)
            finally:
                os._exit(1)
        self._stopping.set()
        log.info(
            "stopping: no new events; finishing the ones in flight",
            signal=sig.name,
            in_flight=self._consumer.in_flight if self._consumer else 0,
            grace_s=self.settings.shutdown_grace_seconds,
        )
