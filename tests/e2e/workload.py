"""A mixed stream of tool-call events over several limit scopes, and the checks that hold after it.

The stream mixes server-wide saves in a few scopes (server, persona lineage), personal saves in a few
scopes (target user, lineage) and a sprinkle of invalid arguments. Scope sizes are uneven on purpose:
with small limits some scopes overflow and some do not, so the checks can tell "exactly the limit" from
"everything" from "too many".

:func:`check_outcome` compares three views that must agree whatever happened to the workers on the way:
what the shard received, the worker's ledger (``ltm_processed_events``) and the memory tables.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from contracts.models import Status
from tests.factories import TRIGGER, BotRows, event_body, member
from tests.support.harness import Received, Shard, WorkerProcess

#: relative sizes of the scopes; with the limits below the first ones overflow, the last ones do not
SERVER_SCOPE_WEIGHTS = (25, 15, 10, 2.0, 1.5, 0.5)
PERSONAL_SCOPE_WEIGHTS = (15, 10, 7.5, 5, 3, 0.7, 0.5, 0.2)
INVALID_WEIGHT = 4.0
SERVER_LIMIT = 50
PERSONAL_LIMIT = 20


def limit_env() -> dict[str, str]:
    """The worker environment for these limits."""
    return {"MAX_SERVER_MEMORIES": str(SERVER_LIMIT), "MAX_PERSONAL_MEMORIES": str(PERSONAL_LIMIT)}


@dataclass(frozen=True)
class Scope:
    """One limit scope and how to address an event to it."""

    kind: str  # "server" or "personal"
    owner_id: int  # server_id or the target's user_id
    lineage_id: int
    guild: str
    persona_id: int
    target_disc_id: str | None = None

    @property
    def limit(self) -> int:
        return SERVER_LIMIT if self.kind == "server" else PERSONAL_LIMIT


@dataclass
class Stream:
    """The events of one test, in publishing order, and the scope each one aims at (None: invalid)."""

    bodies: list[dict[str, Any]]
    scope_of: dict[str, Scope | None] = field(default_factory=dict)

    @property
    def event_ids(self) -> list[str]:
        return [body["event_id"] for body in self.bodies]

    def __len__(self) -> int:
        return len(self.bodies)


async def seed_scopes(rows: BotRows) -> tuple[list[Scope], list[Scope]]:
    """Three servers with two personas each (six server scopes); eight personal scopes on server 1."""
    await rows.user(TRIGGER)
    server_scopes: list[Scope] = []
    for n in range(3):
        guild = f"11500000000000{n + 1:05d}"
        server_id = await rows.server(guild)
        for persona, is_alter in (("Tomori", False), ("Mika", True)):
            persona_id, lineage = await rows.persona(server_id, persona, is_alter=is_alter)
            server_scopes.append(Scope("server", server_id, lineage, guild, persona_id))
    personal_scopes: list[Scope] = []
    for n in range(4):
        disc_id = f"11500000000009{n:05d}"
        user_id = await rows.user(disc_id)
        for scope in server_scopes[:2]:  # the two personas of server 1: two lineages per user
            personal_scopes.append(
                Scope("personal", user_id, scope.lineage_id, scope.guild, scope.persona_id, disc_id)
            )
    return server_scopes, personal_scopes


def build_stream(
    n: int, server_scopes: Sequence[Scope], personal_scopes: Sequence[Scope], seed: int = 7
) -> Stream:
    """``n`` events spread over the scopes by their weights, shuffled (deterministically)."""
    targets: list[Scope | None] = [*server_scopes, *personal_scopes, None]
    weights = [*SERVER_SCOPE_WEIGHTS, *PERSONAL_SCOPE_WEIGHTS, INVALID_WEIGHT]
    assert len(weights) == len(targets)
    counts = [int(n * w / sum(weights)) for w in weights]
    counts[0] += n - sum(counts)
    plan = [target for target, count in zip(targets, counts, strict=True) for _ in range(count)]
    random.Random(seed).shuffle(plan)
    stream = Stream([])
    for i, scope in enumerate(plan):
        body = event_for(scope, i)
        stream.bodies.append(body)
        stream.scope_of[body["event_id"]] = scope
    return stream


def round_robin(n: int, scopes: Sequence[Scope]) -> Stream:
    """``n`` saves dealt over ``scopes`` in turn."""
    stream = Stream([])
    for i in range(n):
        scope = scopes[i % len(scopes)]
        body = event_for(scope, i)
        stream.bodies.append(body)
        stream.scope_of[body["event_id"]] = scope
    return stream


def event_for(scope: Scope | None, i: int) -> dict[str, Any]:
    """A save aimed at ``scope``, or (``None``) an event refused for its arguments."""
    content = f"fact {i} {uuid.uuid4().hex[:8]}"
    if scope is None:
        # step 1 refuses it before any state matters
        return event_body({"memory_content": content, "memory_scope": "galaxy_wide"}, persona_id=1)
    if scope.kind == "server":
        return event_body(
            {"memory_content": content, "memory_scope": "server_wide"},
            persona_id=scope.persona_id,
            guild=scope.guild,
        )
    assert scope.target_disc_id is not None
    return event_body(
        {"memory_content": content, "memory_scope": "target_user", "target_user": scope.target_disc_id},
        persona_id=scope.persona_id,
        guild=scope.guild,
        members=[member(scope.target_disc_id, f"user_{scope.target_disc_id[-2:]}")],
    )


# -- waiting --------------------------------------------------------------------------------------------


async def wait_for_results(
    shard: Shard, event_ids: Sequence[str], timeout: float, workers: Sequence[WorkerProcess] = ()
) -> None:
    """Wait until every event has a result; fail early (with the log tail) if a worker dies."""
    wanted = set(event_ids)
    deadline = time.monotonic() + timeout
    while True:
        missing = wanted - set(shard.received.results)
        if not missing:
            return
        for worker in workers:
            if worker.proc is not None and worker.proc.poll() is not None:
                raise AssertionError(
                    f"{worker.name} exited ({worker.proc.returncode}) with {len(missing)} events unanswered:"
                    f"\n{worker.log_path.read_text(errors='replace')[-3000:]}"
                )
        if time.monotonic() > deadline:
            tails = "\n".join(
                f"--- {w.name}\n{w.log_path.read_text(errors='replace')[-2000:]}" for w in workers
            )
            raise AssertionError(
                f"{len(missing)} of {len(wanted)} events got no result within {timeout}s\n{tails}"
            )
        await asyncio.sleep(0.05)


async def wait_for_count(shard: Shard, at_least: int, timeout: float) -> None:
    """Wait until results for ``at_least`` distinct events have arrived."""
    deadline = time.monotonic() + timeout
    while len(shard.received.results) < at_least:
        if time.monotonic() > deadline:
            raise AssertionError(
                f"only {len(shard.received.results)} of {at_least} results within {timeout}s"
            )
        await asyncio.sleep(0.02)


# -- the checks --------------------------------------------------------------------------------------------


async def check_outcome(
    conn: asyncpg.Connection,
    stream: Stream,
    received: Received,
    *,
    exactly_once: bool = False,
) -> Counter[str]:
    """Every event answered, the answers agree with the ledger and the memory tables, limits exact.

    ``exactly_once``: no event was answered twice (a run without failures). Otherwise copies are allowed
    (at-least-once) but must be identical except ``replayed``, and at most one is not a replay.
    Returns the number of events per status.
    """
    ids = set(stream.event_ids)
    assert len(ids) == len(stream), "the stream itself has duplicate event ids"
    unknown = set(received.results) - ids
    assert not unknown, f"results for events never published: {sorted(unknown)[:5]}"
    missing = ids - set(received.results)
    assert not missing, f"{len(missing)} events got no result, e.g. {sorted(missing)[:5]}"

    answer: dict[str, dict[str, Any]] = {}
    for event_id in ids:
        copies = received.results[event_id]
        first = {**copies[0], "replayed": False}
        for copy in copies[1:]:
            assert {**copy, "replayed": False} == first, f"event {event_id}: results differ: {copies}"
        # the same message twice (the shard's own connection dropped before its ack) is one result;
        # two different non-replayed results would mean the event was processed twice
        fresh = {json.dumps(c, sort_keys=True) for c in copies if not c["replayed"]}
        assert len(fresh) <= 1, f"event {event_id}: {len(fresh)} different non-replayed results"
        if exactly_once:
            assert len(copies) == 1, f"event {event_id} answered {len(copies)} times: {copies}"
            assert fresh, f"event {event_id}: its only result is a replay"
        answer[event_id] = first

    # the ledger: one row per event, holding exactly what the shard was told
    ledger = {
        str(row["event_id"]): row
        for row in await conn.fetch(
            "SELECT event_id, status, memory_scope, memory_id, result FROM ltm_processed_events"
        )
    }
    assert set(ledger) == ids, (
        f"ledger has {len(ledger)} rows for {len(ids)} events "
        f"({len(set(ledger) - ids)} unknown, {len(ids - set(ledger))} missing)"
    )
    for event_id, row in ledger.items():
        assert row["status"] == answer[event_id]["status"], event_id
        assert {**json.loads(row["result"]), "replayed": False} == answer[event_id], event_id

    # memory rows: one per saved event, and nothing else
    server_rows = {
        r["server_memory_id"]: r
        for r in await conn.fetch(
            "SELECT server_memory_id, server_id, persona_lineage_id, content FROM server_memories"
        )
    }
    personal_rows = {
        r["personal_memory_id"]: r
        for r in await conn.fetch(
            "SELECT personal_memory_id, user_id, persona_lineage_id, content FROM personal_memories"
        )
    }
    saved_in: dict[Scope, int] = defaultdict(int)
    refused_in: dict[Scope, int] = defaultdict(int)
    events_in: dict[Scope, int] = defaultdict(int)
    server_ids: list[int] = []
    personal_ids: list[int] = []
    statuses: Counter[str] = Counter()
    for event_id in ids:
        result, scope = answer[event_id], stream.scope_of[event_id]
        statuses[result["status"]] += 1
        if scope is None:
            assert result["status"] == Status.INVALID_ARGS, result
            continue
        events_in[scope] += 1
        if result["status"] == Status.SAVED:
            saved_in[scope] += 1
            memory_id = result["data"]["memory_id"]
            table, owner_key = (
                (server_rows, "server_id") if scope.kind == "server" else (personal_rows, "user_id")
            )
            (server_ids if scope.kind == "server" else personal_ids).append(memory_id)
            row = table.get(memory_id)
            assert row is not None, f"event {event_id}: memory {memory_id} is not in the table"
            assert row[owner_key] == scope.owner_id, event_id
            assert row["persona_lineage_id"] == scope.lineage_id, event_id
            assert row["content"] == result["data"]["content_saved"], event_id
            assert ledger[event_id]["memory_id"] == memory_id
        else:
            assert result["status"] == Status.LIMIT_EXCEEDED, result
            assert result["data"]["max_allowed"] == scope.limit
            assert result["data"]["current_count"] == scope.limit, (
                f"refused at a count other than the limit: {result}"
            )
            refused_in[scope] += 1
    assert len(server_ids) == len(set(server_ids)), "two events were answered with the same server memory"
    assert len(personal_ids) == len(set(personal_ids)), "two events were answered with the same memory"
    assert sorted(server_ids) == sorted(server_rows), (
        f"{len(server_rows)} server memory rows for {len(server_ids)} saved results"
    )
    assert sorted(personal_ids) == sorted(personal_rows), (
        f"{len(personal_rows)} personal memory rows for {len(personal_ids)} saved results"
    )

    # limits: exact, per scope
    for scope, events in events_in.items():
        expected = min(events, scope.limit)
        assert saved_in[scope] == expected, (
            f"{scope.kind} scope {scope.owner_id}/{scope.lineage_id}: {saved_in[scope]} saved of {events} "
            f"events, limit {scope.limit}"
        )
        assert saved_in[scope] + refused_in[scope] == events
    rows_per_scope = Counter(
        [("server", r["server_id"], r["persona_lineage_id"]) for r in server_rows.values()]
        + [("personal", r["user_id"], r["persona_lineage_id"]) for r in personal_rows.values()]
    )
    for (kind, owner, lineage), count in rows_per_scope.items():
        limit = SERVER_LIMIT if kind == "server" else PERSONAL_LIMIT
        assert count <= limit, f"{kind} scope {owner}/{lineage} holds {count} memories, limit {limit}"

    # a notice for every save, none for a failure
    noticed = {event_id for event_id, notices in received.notices.items() if notices}
    assert noticed == {e for e in ids if answer[e]["status"] == Status.SAVED}
    return statuses


def processed_counts(workers: Sequence[WorkerProcess]) -> dict[str, int]:
    """How many events each worker logged as processed (replays included)."""
    return {w.name: w.count("event processed") for w in workers}
