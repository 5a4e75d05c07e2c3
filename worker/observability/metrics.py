"""Prometheus metrics of one worker process (served on ``/metrics`` when the HTTP port is set).

Names follow the Prometheus conventions (base units in the name, ``_total`` on counters). Two names
predate this and stay as they are, because dashboards already use them: ``ltm_events_in_flight`` (a gauge
of events, no unit needed) and ``ltm_db_batch_size`` (a histogram of event counts).

Two clocks, two questions:

- ``ltm_event_age_seconds``: now − the event's ``issued_at``, observed when an answered event is acked.
  The whole life of the event as its shard sees it (queueing, retries, replays from the DLQ, processing),
  on the shard's clock against the worker's; "are answers late?".
- ``ltm_queue_wait_seconds``: how long a fresh event sat in the work queue before a worker took it,
  observed at delivery; "is the queue backing up?". Only first deliveries of first attempts count (no
  ``x-ltm-attempts``, no ``x-ltm-replay-count``, not redelivered): for a retry, a replay or a redelivery the
  moment it re-entered the queue is not on the message. The start is the later of ``issued_at`` and the
  AMQP ``timestamp`` property when the shard sets one: both are at or before the publish, the property
  is cut to whole seconds, so the later one is the tighter bound.

Ages are clamped at 0: a shard's clock a little ahead of the worker's must not produce negative samples.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import platform
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

from contracts.names import ATTEMPTS_HEADER, REPLAY_COUNT_HEADER
from worker.observability.activity import OTHER_SHARD, ShardActivity

DEPENDENCIES = ("rabbitmq", "postgres", "redis")
#: an event's age spans milliseconds (a idle worker) to hours (a replay from the DLQ)
AGE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900, 3600, 14400)
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
#: an event's wait by shard (from its publish to the start of its processing): few buckets, one series each
#: per shard (docs/fair-shares.md)
SHARD_WAIT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 10, 60)
#: the shard label of every shard without a queue of its own: the label set is bounded by the shard queues'
#: cap (``LTM_SHARD_QUEUES_MAX``) plus this one, whatever shard ids events name
OTHER_SHARD_LABEL = "other"
#: a shard's series unused this long are dropped (a shard that is gone stops costing series)
SHARD_SERIES_KEPT_SECONDS = 3600.0
#: how often the series are looked over for the unused ones
_SERIES_SWEEP_SECONDS = 60.0
#: headers that say a delivery is not the event's first trip through the work queue
_NOT_FIRST_TRIP = (ATTEMPTS_HEADER, REPLAY_COUNT_HEADER)


def build_versions() -> dict[str, str]:
    """The labels of ``ltm_build_info``: this package's version and those of Python and the drivers."""

    def version(distribution: str) -> str:
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            return "unknown"

    return {
        "version": version("tomoribot-ltm-worker"),
        "python": platform.python_version(),
        "aio_pika": version("aio-pika"),
        "asyncpg": version("asyncpg"),
    }


class Metrics:
    """Every metric the worker exports, on a registry of its own (no process-global state)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        # the defaults the global registry would have had: process_* (CPU, memory, fds), python_info,
        # python_gc_*
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        Info("ltm_build", "Versions of the running worker.", registry=self.registry).info(build_versions())
        self.events = Counter(
            "ltm_events_total", "Events answered, by result status.", ["status"], registry=self.registry
        )
        self.duration = Histogram(
            "ltm_event_duration_seconds",
            "Time from delivery to ack of an answered event.",
            buckets=(0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10),
            registry=self.registry,
        )
        self.event_age = Histogram(
            "ltm_event_age_seconds",
            "Time from the event's issued_at (the shard's clock) to the ack of its answer: "
            "queueing, retries, replays and processing.",
            buckets=AGE_BUCKETS,
            registry=self.registry,
        )
        self.queue_wait = Histogram(
            "ltm_queue_wait_seconds",
            "Time a fresh event waited in the work queue: from its publish (issued_at, or the AMQP "
            "timestamp when later) to its delivery; first attempts only.",
            buckets=WAIT_BUCKETS,
            registry=self.registry,
        )
        self.batch_size = Histogram(
            "ltm_db_batch_size",
            "Events written to Postgres together (one transaction); 1 when the worker is not busy.",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128),
            registry=self.registry,
        )
        self.retries = Counter(
            "ltm_retries_total",
            "Attempts that met a transient fault and went to a retry queue.",
            registry=self.registry,
        )
        self.dead_letters = Counter(
            "ltm_dead_letters_total",
            "Messages moved to the dead-letter queue, by kind.",
            ["kind"],
            registry=self.registry,
        )
        self.in_flight = Gauge("ltm_events_in_flight", "Events being processed now.", registry=self.registry)
        self.replayed = Counter(
            "ltm_replayed_outcomes_total",
            "Events answered from the stored outcome (redelivery or replay).",
            registry=self.registry,
        )
        self.invalidations_deferred = Counter(
            "ltm_invalidations_deferred_total",
            "Invalidations Redis did not take at once, kept in Postgres for the outbox to publish.",
            registry=self.registry,
        )
        self.invalidations_pending = Gauge(
            "ltm_invalidations_pending",
            "Invalidations waiting in Postgres for Redis (every worker's), as of this worker's last sweep.",
            registry=self.registry,
        )
        self.dependency_up = Gauge(
            "ltm_dependency_up",
            "1 when the dependency answered its last check (sampled in the background and on /readyz).",
            ["dependency"],
            registry=self.registry,
        )
        for name in DEPENDENCIES:
            self.dependency_up.labels(name).set(0)
        self.rabbitmq_blocked = Gauge(
            "ltm_rabbitmq_blocked",
            "1 while RabbitMQ blocks this worker's connection (a memory or disk alarm): results wait.",
            registry=self.registry,
        )
        self.queue_messages = Gauge(
            "ltm_queue_messages",
            "Messages ready in the queue (work queue, retry queues, DLQ), as this worker last sampled it.",
            ["queue"],
            registry=self.registry,
        )
        self.queue_consumers = Gauge(
            "ltm_queue_consumers",
            "Consumers of the queue, as this worker last sampled it.",
            ["queue"],
            registry=self.registry,
        )

        # per shard: the shard as a label, never the guild or the user (docs/fair-shares.md)
        self.shard_events_received = Counter(
            "ltm_shard_events_received_total",
            "Events of the shard that reached this worker (the worker's own copies are not counted again).",
            ["shard"],
            registry=self.registry,
        )
        self.shard_events_answered = Counter(
            "ltm_shard_events_answered_total",
            "Events of the shard this worker answered and acked.",
            ["shard"],
            registry=self.registry,
        )
        self.shard_events_moved = Counter(
            "ltm_shard_events_moved_total",
            "Events of a shard over its share that this worker moved from the common queue to the shard's "
            "own queue.",
            ["shard"],
            registry=self.registry,
        )
        self.shard_events_turned_away = Counter(
            "ltm_shard_events_turned_away_total",
            "Events of the shard turned away at its own queue's bound (answered 'try again later'); one a "
            "minute is kept as a shard_backlog_full dead letter.",
            ["shard"],
            registry=self.registry,
        )
        self.shard_events_held = Gauge(
            "ltm_shard_events_held",
            "Events of the shard this worker holds: delivered to it and not yet settled.",
            ["shard"],
            registry=self.registry,
        )
        self.shard_events_queued = Gauge(
            "ltm_shard_events_queued",
            "Events waiting in the shard's own queue ltm.create_memory.shard.<N>, as this worker last "
            "sampled it.",
            ["shard"],
            registry=self.registry,
        )
        self.shard_wait = Histogram(
            "ltm_shard_wait_seconds",
            "Time from an event's publish (issued_at, or the AMQP timestamp when later) to the start of its "
            "processing, by shard; first attempts only.",
            ["shard"],
            buckets=SHARD_WAIT_BUCKETS,
            registry=self.registry,
        )
        self.shard_events_without_user_id = Counter(
            "ltm_shard_events_without_user_id_total",
            "Events accepted with no AMQP user_id (LTM_SHARD_IDENTITY=checked): shards still to move to "
            "their own RabbitMQ user.",
            ["shard"],
            registry=self.registry,
        )
        #: the per-shard metrics, whose series are dropped together when a shard label goes unused
        self._per_shard = (
            self.shard_events_received,
            self.shard_events_answered,
            self.shard_events_moved,
            self.shard_events_turned_away,
            self.shard_events_held,
            self.shard_wait,
            self.shard_events_without_user_id,
        )
        #: the shards with a label of their own: those with a queue of their own (ltm_shard_queues) and, while
        #: the queues are under their cap, every shard (its first event asks for its queue)
        self._labelled: frozenset[int] = frozenset()
        self._label_any = True
        #: each per-shard metric's series by label, looked up once (the hot path asks per event)
        self._series: dict[tuple[int, str], Any] = {}
        #: when each label was last used, for dropping the series of shards gone quiet
        self._label_used: dict[str, float] = {}
        self._clock: Callable[[], float] = time.monotonic
        self._next_sweep = self._clock() + _SERIES_SWEEP_SECONDS
        #: events held by shard, and under which label they were counted (the label's gauge is their sum)
        self._held: dict[int, tuple[str, int]] = {}
        self._held_by_label: dict[str, int] = {}
        #: the same per-shard counts for `worker shards`, written to Postgres
        #: (worker/observability/activity.py)
        self.activity = ShardActivity(SHARD_WAIT_BUCKETS)

    def label_shards(self, shard_ids: Iterable[int], *, under_cap: bool) -> None:
        """The shards with a queue of their own, which get a label of their own; ``under_cap``: the queues
        are below ``LTM_SHARD_QUEUES_MAX``, so every shard gets one (it is getting its queue). Past the cap
        every other shard is counted as ``other``: the labels stay as many as the cap allows queues."""
        self._labelled = frozenset(shard_ids)
        self._label_any = under_cap

    def shard_label(self, shard_id: int) -> str:
        """Only ever called for a shard whose event passed the checks (worker/runtime/fair.py)."""
        return str(shard_id) if self._label_any or shard_id in self._labelled else OTHER_SHARD_LABEL

    def _activity_key(self, label: str) -> int:
        return OTHER_SHARD if label == OTHER_SHARD_LABEL else int(label)

    def _of(self, metric: Any, label: str) -> Any:
        now = self._clock()
        self._label_used[label] = now
        if now >= self._next_sweep:
            self._sweep(now)
        key = (id(metric), label)
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = metric.labels(label)
        return series

    def _sweep(self, now: float) -> None:
        """Drop the series of labels unused for :data:`SHARD_SERIES_KEPT_SECONDS` (none holding events)."""
        self._next_sweep = now + _SERIES_SWEEP_SECONDS
        for label, used in list(self._label_used.items()):
            if now - used < SHARD_SERIES_KEPT_SECONDS or self._held_by_label.get(label):
                continue
            del self._label_used[label]
            for metric in self._per_shard:
                self._series.pop((id(metric), label), None)
                with contextlib.suppress(KeyError):
                    metric.remove(label)

    def shard_received(self, shard_id: int, guild: str | None = None) -> None:
        """An event of shard ``shard_id`` (and ``guild``, for `worker shards`' loudest guilds) came in."""
        label = self.shard_label(shard_id)
        self._of(self.shard_events_received, label).inc()
        key = self._activity_key(label)
        self.activity.received(key, guild if key != OTHER_SHARD else None)

    def guild_held(self, shard_id: int, guild: str, count: int) -> None:
        """This worker holds ``count`` events of ``guild`` of shard ``shard_id`` now (no metric: a label per
        guild would explode the series; `worker shards` names the loudest)."""
        key = self._activity_key(self.shard_label(shard_id))
        if key != OTHER_SHARD:
            self.activity.guild_held(key, guild, count)

    def shard_answered(self, shard_id: int) -> None:
        label = self.shard_label(shard_id)
        self._of(self.shard_events_answered, label).inc()
        self.activity.answered(self._activity_key(label))

    def shard_held(self, key: Hashable, count: int) -> None:
        """The events of tenant ``key`` this worker holds changed to ``count`` (a key that is no shard, the
        deliveries that failed a check, is not counted by shard)."""
        if not isinstance(key, int) or isinstance(key, bool):
            return
        label, before = self._held.get(key, (self.shard_label(key), 0))
        self._held_by_label[label] = self._held_by_label.get(label, 0) - before
        if count:
            label = self.shard_label(key) if not before else label
            self._held[key] = (label, count)
            self._held_by_label[label] = self._held_by_label.get(label, 0) + count
        else:
            self._held.pop(key, None)
        total = self._held_by_label.get(label, 0)
        if not total:
            self._held_by_label.pop(label, None)
        self._of(self.shard_events_held, label).set(total)
        self.activity.held(self._activity_key(label), total)

    def shard_moved(self, shard_id: int, guild: str | None = None) -> None:
        label = self.shard_label(shard_id)
        self._of(self.shard_events_moved, label).inc()
        key = self._activity_key(label)
        if guild is not None and key != OTHER_SHARD:
            self.activity.moved(key, guild)

    def shard_turned_away(self, shard_id: int) -> None:
        self._of(self.shard_events_turned_away, self.shard_label(shard_id)).inc()

    def shard_without_user_id(self, shard_id: int) -> None:
        self._of(self.shard_events_without_user_id, self.shard_label(shard_id)).inc()

    def observe_delivery(
        self,
        issued_at: datetime,
        *,
        headers: Mapping[str, Any] | None,
        timestamp: datetime | None,
        redelivered: bool,
        shard_id: int | None = None,
        now: datetime | None = None,
    ) -> None:
        """``ltm_queue_wait_seconds`` (and ``ltm_shard_wait_seconds`` of ``shard_id``) for a delivery, when it
        is the event's first trip (see the module)."""
        if redelivered or any(key in (headers or {}) for key in _NOT_FIRST_TRIP):
            return
        start = issued_at
        if timestamp is not None:
            stamped = timestamp if timestamp.tzinfo is not None else timestamp.replace(tzinfo=UTC)
            start = max(start, stamped)
        waited = _seconds_since(start, now)
        self.queue_wait.observe(waited)
        if shard_id is not None:
            label = self.shard_label(shard_id)
            self._of(self.shard_wait, label).observe(waited)
            self.activity.waited(self._activity_key(label), waited)

    def observe_answered(self, issued_at: datetime, now: datetime | None = None) -> None:
        """``ltm_event_age_seconds`` for an event whose answer was just acked."""
        self.event_age.observe(_seconds_since(issued_at, now))

    def exposition(self) -> bytes:
        """The Prometheus text format of every metric."""
        return generate_latest(self.registry)


def _seconds_since(moment: datetime, now: datetime | None) -> float:
    return max(0.0, ((now or datetime.now(UTC)) - moment).total_seconds())
