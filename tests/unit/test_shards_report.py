"""`worker shards` tells one story: the header says how old the counts are against the live depths, the
verdict under a loud shard follows its own columns (held by the workers, waiting in its own queue, or both),
quiet shards fold into one line, and ``--json`` names the waits' bucket bounds as bounds. The report's
reading is pure: these build a :class:`Report` by hand (the integration tier gathers one from the services,
tests/integration/test_fair_shares.py)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from worker.ops.shards_report import (
    WHAT_TO_DO,
    Report,
    ShardLine,
    as_json,
    header,
    is_loud,
    quantile,
    render,
    shown,
    verdict,
)

BUCKETS = (0.1, 1.0, 10.0)


def line(shard_id: int, **values: Any) -> ShardLine:
    fields: dict[str, Any] = {
        "received": 0,
        "answered": 0,
        "held": 0,
        "queued": 0,
        "wait_p50_le_s": None,
        "wait_p99_le_s": None,
        "share_in": 0.0,
        "share_backlog": 0.0,
    }
    return ShardLine(shard_id=shard_id, **{**fields, **values})


def report(*shards: ShardLine, **values: Any) -> Report:
    fields: dict[str, Any] = {"common_queued": 0, "counts_age_s": 12.4, "interval_s": 15}
    fields |= {"problems": []}
    return Report(minutes=15, workers=1, shards=list(shards), **{**fields, **values})


#: a row as the on-call person saw it during a flood that went through the common queue: every waiting
#: event held by the worker's window, its own queue empty
HELD_ONLY = line(0, received=2748, answered=139, held=2609, queued=0, share_in=0.97, share_backlog=1.0)


def test_a_backlog_held_by_the_workers_is_never_said_to_wait_in_its_own_queue() -> None:
    said = verdict(HELD_ONLY)
    assert "waiting in its own queue" not in said
    assert "all 2609 held by the workers, its own queue empty" in said
    assert said.startswith("shard 0 holds 100% of the backlog (2609 events): ")


def test_the_verdict_names_its_own_queue_when_that_is_where_the_backlog_waits() -> None:
    queued = line(4, received=9000, held=0, queued=6616, share_backlog=0.9)
    assert "all 6616 waiting in its own queue, none held by the workers" in verdict(queued)
    both = line(4, received=9000, held=3100, queued=500, share_backlog=0.9)
    assert "3100 held by the workers and 500 waiting in its own queue" in verdict(both)
    unknown = line(4, received=900, held=900, queued=None, share_backlog=1.0)
    assert "all 900 held by the workers (it has no queue of its own, or RabbitMQ did not say)" in verdict(
        unknown
    )


def test_the_verdict_points_at_what_to_do() -> None:
    assert verdict(HELD_ONLY).endswith(f"What to do: {WHAT_TO_DO}")
    assert WHAT_TO_DO == 'docs/operating.md, "A loud shard: what to do"'


def test_loud_is_half_the_backlog_and_a_hundred_events() -> None:
    assert is_loud(HELD_ONLY)
    assert not is_loud(line(1, held=99, share_backlog=1.0)), "a small backlog is no incident"
    assert not is_loud(line(1, held=4000, share_backlog=0.49))


def test_the_header_gives_the_age_of_the_counts_against_the_live_depths() -> None:
    first, second = header(report(HELD_ONLY))
    assert first == "shards over the last 15 min, from 1 worker(s); the common queue holds 0 event(s) now"
    assert second == (
        "counts as of 12 s ago (the workers write them every LTM_METRICS_INTERVAL_SECONDS: 15 s here); "
        "queue depths now"
    )
    _, none = header(report(counts_age_s=None, common_queued=None))
    assert none.startswith("no counts in that time")
    assert "holds ? event(s)" in header(report(common_queued=None))[0]
    _, unread = header(report(counts_age_s=None, problems=["postgres: cannot connect"]))
    assert unread == "no counts: Postgres could not be read (the warning below); queue depths now"


def test_quiet_shards_fold_into_one_line_unless_asked_for() -> None:
    quiet = [line(n) for n in (2, 3, 6)]
    queued_only = line(9, queued=3)
    answered_only = line(5, answered=4)
    whole = report(HELD_ONLY, queued_only, answered_only, *quiet)
    assert shown(whole, show_quiet=False) == ([HELD_ONLY, queued_only, answered_only], 3)
    assert shown(whole, show_quiet=True) == (whole.shards, 0)
    text = render(whole).splitlines()
    assert [row.split()[0] for row in text[3:6]] == ["0", "9", "5"]
    assert text[6:] == [
        "3 quiet shard(s) not shown: nothing in, answered, held or queued (--all lists them)",
        verdict(HELD_ONLY),
    ]
    everything = render(whole, show_quiet=True).splitlines()
    assert [row.split()[0] for row in everything[3:9]] == ["0", "9", "5", "2", "3", "6"]
    assert not any("not shown" in row for row in everything)


def test_the_table_shows_the_bounds_and_the_verdict_under_the_loud_shard() -> None:
    loud = line(
        0,
        received=5000,
        held=3194,
        queued=0,
        wait_p50_le_s=10.0,
        wait_p99_le_s=float("inf"),
        share_backlog=1.0,
    )
    text = render(report(loud)).splitlines()
    assert text[2].split() == [
        "shard", "in", "answered", "held", "queued", "wait", "p50", "wait", "p99", "share", "of", "in", "of",
        "backlog",
    ]  # fmt: skip
    assert text[3].split()[:8] == ["0", "5000", "0", "3194", "0", "≤", "10", "s"]
    assert "> 60 s" in text[3], "past the last bucket"
    assert text[4] == verdict(loud)
    assert not [row for row in render(report(line(1, received=3))).splitlines() if "backlog (" in row]


def test_json_names_the_waits_bucket_bounds_as_bounds() -> None:
    loud = dataclasses.replace(HELD_ONLY, wait_p50_le_s=10.0, wait_p99_le_s=float("inf"))
    data = json.loads(as_json(report(loud, line(3))))
    [shard] = data["shards"]
    assert (shard["wait_p50_le_s"], shard["wait_p99_le_s"]) == (10.0, "inf")
    assert "wait_p50_s" not in shard
    assert "wait_p99_s" not in shard
    assert shard["loud"] is True
    assert (data["counts_age_s"], data["counts_interval_s"], data["quiet_shards_not_shown"]) == (12.4, 15, 1)
    assert len(json.loads(as_json(report(loud, line(3)), show_quiet=True))["shards"]) == 2


def test_a_quantile_is_the_upper_bound_of_its_bucket() -> None:
    assert quantile([0, 0, 0, 0], 0.5, BUCKETS) is None
    assert quantile([5, 4, 1, 0], 0.5, BUCKETS) == 0.1
    assert quantile([5, 4, 1, 0], 0.99, BUCKETS) == 10.0
    assert quantile([0, 0, 0, 2], 0.5, BUCKETS) == float("inf")
