"""The metrics' own rules: default collectors, build info, which deliveries count as queue wait, clocks."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from worker.observability.metrics import Metrics, build_versions

NOW = datetime(2026, 12, 3, 10, 0, 0, tzinfo=UTC)


def samples(metrics: Metrics) -> dict[str, float]:
    text = metrics.exposition().decode()
    return {name: float(value) for name, value in re.findall(r"^(\S+) (\S+)$", text, re.M)}


def test_the_registry_has_the_default_collectors_and_the_build_info() -> None:
    found = samples(Metrics())
    names = {name.partition("{")[0] for name in found}
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes", "python_info"} <= names
    assert "python_gc_collections_total" in names
    versions = build_versions()
    assert versions["version"] != "unknown"
    assert versions["aio_pika"] != "unknown"
    assert versions["asyncpg"] != "unknown"
    [info] = [name for name in found if name.startswith("ltm_build_info{")]
    for label, value in versions.items():
        assert f'{label}="{value}"' in info
    assert found[info] == 1


def wait_count(metrics: Metrics) -> float:
    return samples(metrics)["ltm_queue_wait_seconds_count"]


def test_queue_wait_counts_first_trips_only() -> None:
    metrics = Metrics()
    issued = NOW - timedelta(seconds=0.3)
    metrics.observe_delivery(issued, headers={}, timestamp=None, redelivered=False, now=NOW)
    assert wait_count(metrics) == 1
    assert samples(metrics)["ltm_queue_wait_seconds_sum"] == 0.3
    # a retry, a replay from the DLQ and a redelivery re-entered the queue at a moment the message lacks
    metrics.observe_delivery(
        issued, headers={"x-ltm-attempts": 1}, timestamp=None, redelivered=False, now=NOW
    )
    metrics.observe_delivery(
        issued, headers={"x-ltm-replay-count": 1}, timestamp=None, redelivered=False, now=NOW
    )
    metrics.observe_delivery(issued, headers=None, timestamp=None, redelivered=True, now=NOW)
    assert wait_count(metrics) == 1


def test_queue_wait_starts_at_the_later_of_issued_at_and_the_amqp_timestamp() -> None:
    metrics = Metrics()
    issued = NOW - timedelta(seconds=30)  # built long before it was published
    stamped = (NOW - timedelta(seconds=2)).replace(tzinfo=None)  # pamqp may hand back a naive UTC time
    metrics.observe_delivery(issued, headers=None, timestamp=stamped, redelivered=False, now=NOW)
    assert samples(metrics)["ltm_queue_wait_seconds_sum"] == 2
    earlier_stamp = NOW - timedelta(seconds=40)  # cut to the second, before issued_at: issued_at wins
    metrics.observe_delivery(issued, headers=None, timestamp=earlier_stamp, redelivered=False, now=NOW)
    assert samples(metrics)["ltm_queue_wait_seconds_sum"] == 32


def test_event_age_is_measured_from_issued_at_and_never_negative() -> None:
    metrics = Metrics()
    metrics.observe_answered(NOW - timedelta(minutes=5), now=NOW)
    metrics.observe_answered(NOW + timedelta(seconds=1), now=NOW)  # the shard's clock runs ahead
    found = samples(metrics)
    assert found["ltm_event_age_seconds_count"] == 2
    assert found["ltm_event_age_seconds_sum"] == 300
    assert found['ltm_event_age_seconds_bucket{le="0.01"}'] == 1
    assert found['ltm_event_age_seconds_bucket{le="300.0"}'] == 2
