"""``worker check``'s pure parts: which shard queues it flags (security review 5, N-E), whose credentials it
calls the management API with, and how a check it skipped is said."""

from __future__ import annotations

from worker.ops.check import (
    SHARD_QUEUES_SKIPPED,
    CheckResult,
    _management_target,
    as_json,
    render,
    shard_queue_findings,
)

#: rows as RabbitMQ 3.10's management API gives them (``GET /api/queues/<vhost>?columns=name,arguments``)
QUEUES = [
    {"name": "ltm.create_memory", "arguments": {"x-dead-letter-exchange": "tomori.dead_letter"}},
    {"name": "ltm.create_memory.shard.1", "arguments": {"x-dead-letter-exchange": "tomori.dead_letter"}},
    {
        "name": "tomori.shard.0.results",
        "arguments": {
            "x-dead-letter-exchange": "tomori.tool_calls",
            "x-dead-letter-routing-key": "tool.x.shard.1",
            "x-message-ttl": 0,
        },
    },
    {"name": "tomori.shard.0.notifications", "arguments": {}},
    {"name": "tomori.shard.1.results", "arguments": {"x-queue-type": "quorum", "x-expires": 86400000}},
    {"name": "tomori.shard.2.notifications", "arguments": {"x-dead-letter-routing-key": "elsewhere"}},
    {"name": "tomori.shard.07.results", "arguments": {"x-dead-letter-exchange": "x"}},  # no shard's name
    {"name": "tomori.shard.3.results.old", "arguments": {"x-dead-letter-exchange": "x"}},
]


def test_only_a_shards_own_queues_with_a_dead_letter_argument_are_flagged() -> None:
    count, findings = shard_queue_findings(QUEUES)

    assert count == 4
    assert findings == [
        "tomori.shard.0.results has x-dead-letter-exchange='tomori.tool_calls', "
        "x-dead-letter-routing-key='tool.x.shard.1': its messages go on elsewhere",
        "tomori.shard.2.notifications has x-dead-letter-routing-key='elsewhere': its messages go on "
        "elsewhere",
    ]
    assert shard_queue_findings([]) == (0, [])


def test_the_management_api_is_called_with_its_urls_credentials_else_the_workers() -> None:
    amqp = "amqp://worker:w%40rker@rabbitmq:5672/ltm"

    assert _management_target("http://rabbitmq:15672/", amqp) == ("http://rabbitmq:15672", "worker", "w@rker")
    assert _management_target("https://ops:S3c%2Fret@mq.example/api-proxy?x=1", amqp) == (
        "https://mq.example/api-proxy",
        "ops",
        "S3c/ret",
    )
    assert _management_target("http://rabbitmq:15672", "amqp://rabbitmq/") == (
        "http://rabbitmq:15672",
        "guest",
        "guest",
    )


def test_a_skipped_check_is_a_line_of_its_own_and_fails_nothing() -> None:
    results = [CheckResult("redis", "redis://r", True, "server 7")]
    skipped = (("shard queues", SHARD_QUEUES_SKIPPED),)

    text = render(results, skipped=skipped)
    assert text.splitlines() == [
        "ok    redis     redis://r",
        "      server 7",
        "skip  shard queues",
        f"      {SHARD_QUEUES_SKIPPED}",
        "all dependencies work",
    ]
    report = as_json(results, skipped=skipped)
    assert report["ok"] is True
    assert report["skipped"] == [{"check": "shard queues", "why": SHARD_QUEUES_SKIPPED}]
    assert list(report["dependencies"]) == ["redis"]
