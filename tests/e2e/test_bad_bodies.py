"""The bad bodies of security-review-3 sections 1 and 3, sent as a shard sends them to a worker process on
real RabbitMQ, Postgres and Redis: what the shard gets back, what reaches the DLQ, what Postgres holds, what
the log says. Each event the contract can answer is answered; nothing that cannot be answered is written; an
input error is never an ERROR with a traceback.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

import orjson
import pytest

from contracts.models import (
    NOTICE_DESCRIPTION_LIMIT,
    NOTICE_FULL_CONTENT_LIMIT,
    NOTICE_TITLE_LIMIT,
    DeadLetterKind,
    Status,
)
from sim.shard import EVENT_TYPE
from tests.e2e.stack import Stack
from tests.factories import TRIGGER, event_body, member
from tests.support.harness import Shard, take_dead_letters
from worker.pipeline.outcome import DEAD_LETTER_REASONS

pytestmark = pytest.mark.e2e

SCHEMA_REASON = DEAD_LETTER_REASONS[DeadLetterKind.SCHEMA]


@dataclass
class Case:
    """One body as sent, and what the contract says becomes of it."""

    name: str
    body: bytes
    #: the event id the shard would match its answer by (as in the body)
    event_id: str
    message_id: str | None
    #: (status, error sentence or a part of it) of the result the shard gets; None: no result
    answer: tuple[str, str] | None
    #: (kind, part of x-ltm-error) of the dead letter; None: none
    dead_letter: tuple[str, str] | None = None
    #: the pipeline's outcome is in the ledger (answered without a dead letter)
    recorded: bool = False


def raw_case(persona_id: int, name: str, placeholder_in: str, raw: bytes, **expected: Any) -> Case:
    """An event whose ``placeholder_in`` (``arguments``, ``context.<key>`` or a top-level key) is ``raw``
    JSON text that the shard wrote (orjson may refuse it)."""
    data = event_body({"memory_content": "x", "memory_scope": "server_wide"}, persona_id=persona_id)
    if placeholder_in.startswith("context."):
        data["context"][placeholder_in.removeprefix("context.")] = "@raw"
    else:
        data[placeholder_in] = "@raw"
    body = orjson.dumps(data).replace(b'"@raw"', raw)
    return Case(name, body, data["event_id"], data["event_id"], **expected)


def json_case(data: dict[str, Any], name: str, *, message_id: str | None = None, **expected: Any) -> Case:
    body = json.dumps(data).encode()
    return Case(name, body, data["event_id"], message_id or data["event_id"], **expected)


def section_1_cases(persona_id: int) -> list[Case]:
    p = persona_id

    def args(arguments: Any, **kwargs: Any) -> dict[str, Any]:
        return event_body(arguments, persona_id=p, **kwargs)

    invalid = Status.INVALID_ARGS
    internal = Status.INTERNAL_ERROR
    schema = DeadLetterKind.SCHEMA
    cases = [
        raw_case(
            p,
            "10,000-deep array in arguments",
            "arguments",
            b"[" * 10_000 + b"]" * 10_000,
            answer=(invalid, "Invalid parameters: arguments are nested more than 1024 levels deep"),
            recorded=True,
        ),
        raw_case(
            p,
            "memory_content 1e400",
            "arguments",
            b'{"memory_content": 1e400, "memory_scope": "server_wide"}',
            answer=(
                invalid,
                "Invalid parameters: Parameter 'memory_content' expected type 'string' but got 'number'",
            ),
            recorded=True,
        ),
        raw_case(
            p,
            "memory_content \\ud800",
            "arguments",
            b'{"memory_content": "likes \\ud800 tea", "memory_scope": "server_wide"}',
            answer=(
                invalid,
                "Invalid parameters: Parameter 'memory_content' is not valid Unicode (a lone surrogate)",
            ),
            recorded=True,
        ),
        raw_case(
            p,
            "persona_id NaN",
            "context.persona_id",
            b"NaN",
            answer=(internal, "Internal bot error"),
            dead_letter=(schema, "context.persona_id"),
        ),
        raw_case(p, "shard_id 1e400", "shard_id", b"1e400", answer=None, dead_letter=(schema, "shard_id")),
        raw_case(
            p,
            "persona_id 2^31",
            "context.persona_id",
            str(2**31).encode(),
            answer=(internal, "Internal bot error"),
            dead_letter=(schema, "context.persona_id: Input should be less than or equal to 2147483647"),
        ),
        raw_case(
            p,
            "persona_id 2^63",
            "context.persona_id",
            str(2**63).encode(),
            answer=(internal, "Internal bot error"),
            dead_letter=(schema, "context.persona_id"),
        ),
        raw_case(
            p,
            "shard_id 2^64-1",
            "shard_id",
            str(2**64 - 1).encode(),
            answer=None,
            dead_letter=(schema, "shard_id"),
        ),
        json_case(
            args({"memory_content": "likes \x00 tea", "memory_scope": "server_wide"}),
            "NUL in memory_content",
            answer=(
                invalid,
                "Invalid parameters: Parameter 'memory_content' must not contain NUL characters",
            ),
            recorded=True,
        ),
        json_case(
            args(
                {"memory_content": "likes tea", "memory_scope": "target_user", "target_user": "Spar\x00row"}
            ),
            "NUL in target_user",
            answer=(invalid, "Invalid parameters: Parameter 'target_user' must not contain NUL characters"),
            recorded=True,
        ),
        json_case(
            {**args({"memory_content": "x", "memory_scope": "server_wide"}), "tool_call_id": "call\x00nul"},
            "NUL in tool_call_id",
            answer=(internal, "Internal bot error"),
            dead_letter=(schema, "tool_call_id: holds U+0000"),
        ),
        json_case(
            {**args({"memory_content": "x", "memory_scope": "server_wide"}), "tool_call_id": "c" * 300},
            "tool_call_id of 300 characters",
            answer=None,  # a result could not carry it in its correlation_id: nothing is written either
            dead_letter=(schema, "tool_call_id: 300 characters, at most 255"),
        ),
    ]
    upper = args({"memory_content": "x", "memory_scope": "server_wide"})
    upper["event_id"] = upper["event_id"].upper().replace("-", "")
    cases.append(
        json_case(upper, "event_id upper case, no hyphens", answer=None, dead_letter=(schema, "event_id"))
    )
    huge_name = args(
        {"memory_content": "{user}" * 166, "memory_scope": "server_wide"},
        members=[member(TRIGGER, "sparrow_ow", "N" * 200_000)],
    )
    cases.append(
        json_case(
            huge_name,
            "{user} x166, a 200,000-character display name",
            answer=(internal, "Internal bot error"),
            dead_letter=(schema, "context.guild_members.0.global_name: 200000 characters, at most 32"),
        )
    )
    mismatch = args({"memory_content": "x", "memory_scope": "server_wide"})
    cases.append(
        json_case(
            mismatch,
            "message_id not the event_id",
            message_id=str(uuid.uuid4()),
            answer=(internal, "Internal bot error"),
            dead_letter=(schema, "is not the body's event_id"),
        )
    )
    return cases


async def publish(shard: Shard, case: Case) -> None:
    await shard.link.publish(case.body, message_id=case.message_id, type=EVENT_TYPE)


def worker_errors(stack: Stack) -> list[dict[str, Any]]:
    return [line for line in stack.workers[0].lines() if line.get("level") == "error" or "exception" in line]


async def test_every_bad_body_of_section_1_is_answered_or_refused_as_the_contract_says(stack: Stack) -> None:
    world = await stack.rows.world()
    stack.worker()
    await stack.workers_ready()
    cases = section_1_cases(world.persona_id)
    # the review's 300-character tool_call_id was committed, then unanswerable, and a re-publish failed again
    again = next(c for c in cases if c.name == "tool_call_id of 300 characters")
    # the notice of a save with {user} 166 times and the longest display name the contract allows
    bounded = event_body(
        {"memory_content": "{user}" * 166, "memory_scope": "server_wide"},
        persona_id=world.persona_id,
        members=[member(TRIGGER, "s" * 32, "N" * 32)],
    )
    deep_unknown = event_body(  # 1,000 deep in an argument nobody reads: saved, as before
        {"memory_content": "deep but fine", "memory_scope": "server_wide", "x": "@raw"},
        persona_id=world.persona_id,
    )
    deep_body = orjson.dumps(deep_unknown).replace(b'"@raw"', b"[" * 1000 + b"]" * 1000)
    goods = [
        event_body(
            {"memory_content": f"good {n}", "memory_scope": "server_wide"}, persona_id=world.persona_id
        )
        for n in range(3)
    ]
    async with Shard(stack.rabbitmq_url) as shard:
        for n, case in enumerate(cases):
            await publish(shard, case)
            if n % 5 == 0:
                await shard.publish(goods[n // 5])
        await publish(shard, again)
        await shard.publish(bounded)
        await shard.link.publish(deep_body, message_id=deep_unknown["event_id"])
        answered = [c.event_id for c in cases if c.answer] + [g["event_id"] for g in goods]
        await shard.wait_for_results([*answered, bounded["event_id"], deep_unknown["event_id"]], timeout=60)
        dead = [c for c in cases if c.dead_letter] + [again]
        letters = await take_dead_letters(stack.rabbitmq_url, len(dead))
        await shard.settle()

    # every dead letter is the one the case expects, with the field named
    letters_by_id: dict[str | None, list[Any]] = {}
    for letter in letters:
        letters_by_id.setdefault(letter.message_id, []).append(letter)
    assert len(letters) == len(dead)
    for case in cases:
        got = letters_by_id.get(case.message_id, [])
        if case.dead_letter is None:
            assert not got, case.name
            continue
        kind, error = case.dead_letter
        assert len(got) == (2 if case is again else 1), case.name
        for letter in got:
            assert letter.headers["x-ltm-error-kind"] == kind, case.name
            assert error in letter.headers["x-ltm-error"], (case.name, letter.headers["x-ltm-error"])
            assert letter.body == case.body, case.name

    # what each shard-side event id got back
    results = shard.received.results
    for case in cases:
        if case.answer is None:
            assert case.event_id not in results, case.name
            # nor under another spelling of the same id
            assert str(uuid.UUID(case.event_id)) not in results, case.name
            continue
        status, error = case.answer
        [result] = results[case.event_id]
        assert result["status"] == status, case.name
        assert error in result["error"], (case.name, result["error"])
        assert result["success"] is False
        if status == Status.INTERNAL_ERROR:
            assert result["data"]["reason"] == SCHEMA_REASON, case.name  # no validator or exception text
    nul_call = next(c for c in cases if c.name == "NUL in tool_call_id")
    assert results[nul_call.event_id][0]["tool_call_id"] == "call\x00nul"
    for good in goods:
        assert results[good["event_id"]][0]["status"] == Status.SAVED
    assert results[deep_unknown["event_id"]][0]["status"] == Status.SAVED

    # the bounded notice: Discord's limits, however many {user} the memory holds
    [saved] = results[bounded["event_id"]]
    assert saved["status"] == Status.SAVED
    [notification] = shard.received.notices[bounded["event_id"]]
    notice = notification["notice"]
    assert len(notice["title"]) <= NOTICE_TITLE_LIMIT
    assert len(notice["description"]) <= NOTICE_DESCRIPTION_LIMIT
    # 166 x 32 = 5,312 characters rendered: more than the "Show Full Memory" embed holds, so cut
    assert len(notice["full_content"]) <= NOTICE_FULL_CONTENT_LIMIT
    assert notice["full_content"].startswith("N" * 64)
    assert notice["full_content"].endswith("…")
    assert notice["expandable"] is True

    # what Postgres holds: the pipeline's answers are recorded; nothing of a refused event is
    ledger = {
        str(row["event_id"]): row
        for row in await stack.rows.conn.fetch("SELECT event_id, status, notice FROM ltm_processed_events")
    }
    for case in cases:
        try:
            key = str(uuid.UUID(case.event_id))
        except ValueError:
            key = case.event_id
        if case.recorded:
            assert case.answer is not None
            assert ledger[key]["status"] == case.answer[0], case.name
        else:
            assert key not in ledger, case.name
    stored_notice = ledger[bounded["event_id"]]["notice"]
    assert len(stored_notice) < 2 * (NOTICE_FULL_CONTENT_LIMIT + NOTICE_DESCRIPTION_LIMIT)  # not 33 MB
    memories = await stack.rows.conn.fetch("SELECT content FROM server_memories ORDER BY content")
    assert sorted(m["content"] for m in memories) == sorted(
        ["deep but fine", "{user}" * 166, *(g["arguments"]["memory_content"] for g in goods)]
    )

    # an input error is a warning without a traceback, never an ERROR
    assert worker_errors(stack) == []
    assert stack.workers[0].proc is not None
    assert stack.workers[0].proc.poll() is None, "the worker died"


async def test_a_flood_of_bad_bodies_is_answered_and_every_good_event_with_it(stack: Stack) -> None:
    """Section 3's floods, correctness only (the latency under them is `python -m bench.flood`): 60 events of
    240 KB over the participants bound, 300 with NUL in memory_content, 10 over 256 KiB, interleaved with good
    events."""
    world = await stack.rows.world()
    stack.worker()
    await stack.workers_ready()

    def body(arguments: Any, **kwargs: Any) -> dict[str, Any]:
        return event_body(arguments, persona_id=world.persona_id, **kwargs)

    wide = [body({"memory_content": "x", "memory_scope": "server_wide"}) for _ in range(60)]
    for data in wide:
        data["context"]["participants"] = [0] * 120_000
    nul = [body({"memory_content": f"a\x00{n}", "memory_scope": "server_wide"}) for n in range(300)]
    over = [body({"memory_content": "x" * 263_000, "memory_scope": "server_wide"}) for _ in range(10)]
    goods = [body({"memory_content": f"good {n}", "memory_scope": "server_wide"}) for n in range(40)]
    bad = [*wide, *nul, *over]
    waiting = list(goods)
    async with Shard(stack.rabbitmq_url) as shard:
        for n, data in enumerate(bad):
            # compact JSON, as a shard writes it: 240 KB, within the 256 KiB a body may have
            await shard.link.publish(orjson.dumps(data), message_id=data["event_id"], type=EVENT_TYPE)
            if n % 10 == 0 and waiting:
                await shard.publish(waiting.pop(0))
        for good in waiting:
            await shard.publish(good)
        answered = [d["event_id"] for d in (*wide, *nul, *goods)]
        await shard.wait_for_results(answered, timeout=120)
        letters = await take_dead_letters(stack.rabbitmq_url, len(wide) + len(over), timeout=60)
        await shard.settle()

    results = shard.received.results
    assert all(results[g["event_id"]][0]["status"] == Status.SAVED for g in goods)
    for data in wide:
        [result] = results[data["event_id"]]
        assert result["status"] == Status.INTERNAL_ERROR
        assert result["data"]["reason"] == SCHEMA_REASON
    for data in nul:
        [result] = results[data["event_id"]]
        assert result["status"] == Status.INVALID_ARGS
        assert "must not contain NUL characters" in result["error"]
    assert not any(d["event_id"] in results for d in over)  # not read: no ids to answer by
    errors = [(letter.headers["x-ltm-error-kind"], letter.headers["x-ltm-error"]) for letter in letters]
    assert all(kind == "schema" for kind, _ in errors)
    assert sum("context.participants: 120000 items, at most 100" in error for _, error in errors) == 60
    assert sum("byte limit" in error for _, error in errors) == 10
    assert await stack.rows.conn.fetchval("SELECT count(*) FROM server_memories") == len(goods)
    assert worker_errors(stack) == []
    assert stack.workers[0].proc is not None
    assert stack.workers[0].proc.poll() is None, "the worker died"
