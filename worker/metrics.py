"""Prometheus metrics of one worker process (served on ``/metrics`` when the HTTP port is set)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

DEPENDENCIES = ("rabbitmq", "postgres", "redis")


class Metrics:
    """Every metric the worker exports, on a registry of its own (no process-global state)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.events = Counter(
            "ltm_events_total", "Events answered, by result status.", ["status"], registry=self.registry
        )
        self.duration = Histogram(
            "ltm_event_duration_seconds",
            "Time from delivery to ack of an answered event.",
            buckets=(0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10),
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
            "1 when the dependency answered its last check.",
            ["dependency"],
            registry=self.registry,
        )
        for name in DEPENDENCIES:
            self.dependency_up.labels(name).set(0)

    def exposition(self) -> bytes:
        """The Prometheus text format of every metric."""
        return generate_latest(self.registry)
