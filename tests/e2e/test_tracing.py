"""With LTM_TRACING=console a worker spans each event, continues the shard's trace and passes it on."""

from __future__ import annotations

import signal

import pytest

from contracts.models import Status
from tests.e2e.stack import Stack
from tests.factories import event_body
from tests.support.harness import Shard

pytestmark = pytest.mark.e2e

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
SHARD_SPAN_ID = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{SHARD_SPAN_ID}-01"


async def test_console_tracing_continues_the_event_trace(stack: Stack) -> None:
    world = await stack.rows.world()
    worker = stack.worker(LTM_TRACING="console")
    await stack.workers_ready()
    body = event_body(
        {"memory_content": "{user} likes owls", "memory_scope": "server_wide"}, persona_id=world.persona_id
    )
    event_id = body["event_id"]
    async with Shard(stack.rabbitmq_url) as shard:
        await shard.publish(body, headers={"traceparent": TRACEPARENT})
        await shard.wait_for_results([event_id], timeout=30)
        await shard.settle()

    [result] = shard.received.results[event_id]
    assert result["status"] == Status.SAVED
    [result_message] = shard.received.result_messages[event_id]
    [notice_message] = shard.received.notice_messages[event_id]
    version, trace_id, span_id, flags = str(result_message.headers["traceparent"]).split("-")
    assert (version, trace_id, flags) == ("00", TRACE_ID, "01")
    assert len(span_id) == 16
    assert span_id != SHARD_SPAN_ID
    assert notice_message.headers["traceparent"] == result_message.headers["traceparent"]

    # the batch processor exports every few seconds; a graceful stop must flush what it holds
    worker.signal(signal.SIGTERM)
    assert await worker.wait_exit(timeout=30) == 0
    spans = [line for line in worker.lines() if line.get("name") == "ltm.create_memory process"]
    [span] = spans
    assert span["kind"] == "SpanKind.CONSUMER"
    assert span["context"]["trace_id"] == f"0x{TRACE_ID}"
    assert span["context"]["span_id"] == f"0x{span_id}"
    assert span["parent_id"] == f"0x{SHARD_SPAN_ID}"
    assert span["status"]["status_code"] == "UNSET"
    attributes = span["attributes"]
    assert attributes["messaging.system"] == "rabbitmq"
    assert attributes["messaging.destination.name"] == "ltm.create_memory"
    assert attributes["messaging.message.id"] == event_id
    assert attributes["ltm.tool_call_id"] == body["tool_call_id"]
    assert attributes["ltm.shard_id"] == body["shard_id"]
    assert attributes["ltm.attempts"] == 1
    assert attributes["ltm.status"] == Status.SAVED
    assert attributes["ltm.memory_id"] == result["data"]["memory_id"]
    assert span["resource"]["attributes"]["service.name"] == "tomoribot-ltm-worker"
    assert worker.count("tracing on") == 1


async def test_an_event_s_log_lines_and_spans_share_its_trace_id(stack: Stack) -> None:
    """Logs and traces join: every log line of the event names the trace and the event's span, and the
    Postgres write, the publish of result and notice and the Redis invalidation are child spans of it."""
    world = await stack.rows.world()
    worker = stack.worker(LTM_TRACING="console", LTM_LOG_LEVEL="debug")
    await stack.workers_ready()
    body = event_body(
        {"memory_content": "likes owls", "memory_scope": "server_wide"}, persona_id=world.persona_id
    )
    event_id = body["event_id"]
    async with Shard(stack.rabbitmq_url) as shard:
        await shard.publish(body, headers={"traceparent": TRACEPARENT})
        await shard.wait_for_results([event_id], timeout=30)
    worker.signal(signal.SIGTERM)
    assert await worker.wait_exit(timeout=30) == 0

    lines = worker.lines()
    spans = [line for line in lines if "context" in line and "name" in line]
    [process] = [span for span in spans if span["name"] == "ltm.create_memory process"]
    span_id = process["context"]["span_id"].removeprefix("0x")
    logs = [line for line in lines if line.get("event_id") == event_id]
    assert {line["event"] for line in logs} == {"memory content", "event processed"}
    for line in logs:
        assert (line["trace_id"], line["span_id"]) == (TRACE_ID, span_id), line
        assert (line["tool_call_id"], line["shard_id"], line["attempts"]) == (body["tool_call_id"], 3, 1)
    # lines outside any event carry no trace
    assert all("trace_id" not in line for line in lines if line.get("event") == "consuming")

    steps = {span["name"]: span for span in spans if span["parent_id"] == f"0x{span_id}"}
    assert set(steps) == {
        "postgres ltm_save_events",
        "tomori.tool_results publish",
        "tomori:cache-invalidation publish",
    }
    for step in steps.values():
        assert step["context"]["trace_id"] == f"0x{TRACE_ID}"
        assert step["status"]["status_code"] == "UNSET"
    assert steps["postgres ltm_save_events"]["kind"] == "SpanKind.CLIENT"
    assert steps["tomori.tool_results publish"]["kind"] == "SpanKind.PRODUCER"
    assert steps["tomori.tool_results publish"]["attributes"]["ltm.notice"] is True
    assert steps["tomori:cache-invalidation publish"]["attributes"]["messaging.system"] == "redis"
