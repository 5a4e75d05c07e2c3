"""``worker demo``: a first successful save on a development machine, and back (README "Try it locally").

- ``seed``: the bot rows CONTRACT.md section 3's example event needs: a ``servers`` row for its guild, the
  ``personas`` row ``persona_id`` 7 on that server, ``users`` rows for its author and for Sparrow (a member).
  The worker reads these from the bot's database; without them it answers ``internal_error``.
- ``send``: the example event, published as a shard does (its two queues declared and bound first, the event
  persistent and confirmed, ``user_id`` the URL's user), then its result and, after a save, its notice,
  printed. ``--shard N`` (3 unless told) is the shard it speaks as: with a broker's confined shard users
  (deploy/README.md), shard ``N`` with user ``shard-N``'s URL.
- ``clean``: what ``seed`` and ``send`` left: the rows, the demo's memories and ledger rows, the shard's
  queues; with ``--topology`` also the worker's exchanges and queues on the vhost, each only when it is
  empty and nobody uses it.

For a scratch database and a development broker: the ids are the contract's made-up ones, and ``seed``
refuses a database whose ``personas`` row 7 belongs to another server. Nothing here imports the tests,
``sim`` or ``bench``: it ships with the worker.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import json
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import aio_pika
import aiormq
import asyncpg

from contracts.example import EXAMPLE_EVENT
from contracts.models import MAX_INT4, ShardQueueKind, Status, shard_queue
from worker.broker.events import tool_call_message
from worker.broker.topology import retry_queue_name, shard_queue_name
from worker.broker.urls import connect_any
from worker.config import Settings
from worker.faults import explain
from worker.redact import describe, redact_setting
from worker.service.policy import RetryPolicy
from worker.store.pool import connect_once
from worker.store.repository import registered_shards

# --- the contract's example (CONTRACT.md section 3) -----------------------------------------------------

GUILD = "1150000000000000001"
CHANNEL = "1150000000000000100"
AUTHOR = "1150000000000000200"
SPARROW = "1150000000000000201"
BOT = "1150000000000000999"
PERSONA_ID = 7
PERSONA_NICKNAME = "Tomori"
#: the shard ``send`` speaks as and ``clean`` cleans up after, unless ``--shard`` says another
DEFAULT_SHARD = 3
MAX_SHARD_ID = MAX_INT4
#: every demo event's tool_call_id starts so (``clean`` finds the demo's ledger rows by it)
TOOL_CALL_PREFIX = "demo_call_"
SERVER_CONTENT = "{user} likes dogs"
PERSONAL_CONTENT = "{user} prefers tea to coffee"

EXIT_OK = 0
EXIT_FAILED = 1  # a failure status, or the database refused the seed
EXIT_UNREACHABLE = 3  # Postgres or RabbitMQ unreachable, or no answer in time


def example_event(
    scope: str, content: str | None = None, *, event_id: str | None = None, shard: int = DEFAULT_SHARD
) -> dict[str, Any]:
    """CONTRACT.md section 3's example event with a fresh ``event_id``, sent by shard ``shard``.

    ``guild_members`` holds the author too: the notice names the author by what ``guild_members`` (or the
    author's saved nickname) says, and shows the bare Discord id otherwise (CONTRACT.md section 3, "members").
    ``target_user`` saves a personal memory about Sparrow.
    """
    if scope == "target_user":
        arguments: dict[str, Any] = {
            "memory_content": content or PERSONAL_CONTENT,
            "memory_scope": "target_user",
            "target_user": "Sparrow",
        }
    else:
        arguments = {"memory_content": content or SERVER_CONTENT, "memory_scope": "server_wide"}
    event = copy.deepcopy(EXAMPLE_EVENT)
    event.update(
        event_id=event_id or str(uuid.uuid4()),
        tool_call_id=TOOL_CALL_PREFIX + uuid.uuid4().hex[:12],
        issued_at=datetime.now(UTC).isoformat().replace("+00:00", "Z"),
        shard_id=shard,
        arguments=arguments,
    )
    author = {"user_disc_id": AUTHOR, "username": "kaede_dc", "global_name": "Kaede", "nickname": None}
    event["context"]["guild_members"].insert(0, {**author, "is_bot": False})
    return event


# --- the command line (its options: ops/demo_cli.py) ----------------------------------------------------


def shard_id_argument(text: str) -> int:
    """``--shard N``: a shard id the contract allows."""
    if not (text.isascii() and text.isdigit()) or int(text) > MAX_SHARD_ID:
        raise argparse.ArgumentTypeError(f"a shard id is an integer 0..{MAX_SHARD_ID}, not {text!r}")
    return int(text)


def run_demo(args: argparse.Namespace, settings: Settings) -> int:
    """Run ``worker demo <step>``; the exit code."""
    if args.demo_command == "seed":
        return asyncio.run(seed(settings.postgres_dsn, out=_say))
    if args.demo_command == "send":
        return asyncio.run(
            send(settings, scope=args.scope, content=args.content, timeout=args.timeout, shard=args.shard)
        )
    return asyncio.run(clean(settings, topology=args.topology, shard=args.shard, out=_say))


def _say(line: str) -> None:
    print(line, flush=True)


def _fail(line: str) -> None:
    print(f"worker demo: {line}", file=sys.stderr, flush=True)


def _cannot_reach(dependency: str, url: str, exc: BaseException) -> None:
    """``cannot reach RabbitMQ at <url, password hidden>: <what to do>`` on stderr."""
    _fail(f"cannot reach {dependency} at {redact_setting(url)}: {explain(exc, url)}")


# --- seed and clean (Postgres) --------------------------------------------------------------------------


async def seed(dsn: str, *, out: Callable[[str], None] = _say) -> int:
    """Add the example's rows where missing; say what was added and what was there."""
    conn = await _connect(dsn)
    if conn is None:
        return EXIT_UNREACHABLE
    try:
        if not await _has_bot_tables(conn):
            _fail(f"{redact_setting(dsn)} has no bot tables: run `worker migrate` first")
            return EXIT_FAILED
        async with conn.transaction():
            server_id, added = await _row(
                conn,
                "SELECT server_id FROM servers WHERE server_disc_id = $1",
                "INSERT INTO servers (server_disc_id) VALUES ($1) RETURNING server_id",
                GUILD,
            )
            out(f"servers: guild {GUILD} (server_id {server_id}) {'added' if added else 'was there'}")
            owner = await conn.fetchval("SELECT server_id FROM personas WHERE persona_id = $1", PERSONA_ID)
            if owner is not None and owner != server_id:
                _fail(
                    f"personas row {PERSONA_ID} belongs to server_id {owner}, not to guild {GUILD}: "
                    'this is not a scratch database (seed a database of its own, README "Try it locally")'
                )
                return EXIT_FAILED
            if owner is None:
                await conn.execute(
                    "INSERT INTO personas (persona_id, server_id, persona_nickname) VALUES ($1, $2, $3)",
                    PERSONA_ID,
                    server_id,
                    PERSONA_NICKNAME,
                )
            out(
                f"personas: persona {PERSONA_ID} ({PERSONA_NICKNAME}) on that server "
                f"{'was there' if owner is not None else 'added'}"
            )
            for disc_id, who in ((AUTHOR, "the author"), (SPARROW, "Sparrow, a member")):
                user_id, added = await _row(
                    conn,
                    "SELECT user_id FROM users WHERE user_disc_id = $1",
                    "INSERT INTO users (user_disc_id) VALUES ($1) RETURNING user_id",
                    disc_id,
                )
                out(f"users: {disc_id}, {who} (user_id {user_id}) {'added' if added else 'was there'}")
    except asyncpg.PostgresError as exc:
        _fail(f"the database refused the seed: {describe(exc)}")
        return EXIT_FAILED
    finally:
        await conn.close()
    return EXIT_OK


async def _connect(dsn: str) -> asyncpg.Connection | None:
    """A connection to the database, or None (said on stderr) when Postgres cannot be reached."""
    try:
        return await connect_once(dsn, timeout=10)
    except (OSError, TimeoutError, ValueError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        _cannot_reach("Postgres", dsn, exc)
        return None


async def _has_bot_tables(conn: asyncpg.Connection) -> bool:
    return await conn.fetchval("SELECT to_regclass('public.personas')") is not None


async def _row(conn: asyncpg.Connection, select: str, insert: str, key: str) -> tuple[int, bool]:
    """The id of the row ``select`` finds, else of the row ``insert`` adds; and whether it was added."""
    found = await conn.fetchval(select, key)
    if found is not None:
        return int(found), False
    return int(await conn.fetchval(insert, key)), True


async def _recorded_shards(dsn: str) -> list[int]:
    """The shards with a queue of their own recorded in ``ltm_shard_queues`` (none when it cannot be read)."""
    try:
        conn = await connect_once(dsn, timeout=10)
    except Exception:
        return []
    try:
        if await conn.fetchval("SELECT to_regclass('public.ltm_shard_queues')") is None:
            return []
        return list(await registered_shards(conn))
    except asyncpg.PostgresError:
        return []
    finally:
        await conn.close()


async def _clean_rows(dsn: str, out: Callable[[str], None]) -> int:
    conn = await _connect(dsn)
    if conn is None:
        return EXIT_UNREACHABLE
    try:
        if not await _has_bot_tables(conn):
            out("database: no bot tables, nothing to delete")
            return EXIT_OK
        async with conn.transaction():
            ledger = 0
            if await conn.fetchval("SELECT to_regclass('public.ltm_processed_events')") is not None:
                # the demo's, whichever shard sent them (--shard)
                ledger = _count(
                    await conn.execute(
                        "DELETE FROM ltm_processed_events WHERE starts_with(tool_call_id, $1)",
                        TOOL_CALL_PREFIX,
                    )
                )
            # personal memories go with their users, server memories and the persona with the server
            users = _count(
                await conn.execute("DELETE FROM users WHERE user_disc_id = ANY($1)", [AUTHOR, SPARROW])
            )
            servers = _count(await conn.execute("DELETE FROM servers WHERE server_disc_id = $1", GUILD))
        out(
            f"database: deleted {ledger} ledger rows, {users} users rows, {servers} servers row "
            "(with its persona and memories)"
        )
    except asyncpg.PostgresError as exc:
        _fail(f"the database refused the clean-up: {describe(exc)}")
        return EXIT_FAILED
    finally:
        await conn.close()
    return EXIT_OK


def _count(status: str) -> int:
    """The row count of a ``DELETE n`` command status."""
    return int(status.rsplit(" ", 1)[-1])


# --- send (RabbitMQ) ------------------------------------------------------------------------------------


async def _wait_for_worker(
    connection: aio_pika.abc.AbstractConnection, settings: Settings, deadline: float
) -> bool:
    """True once the tool-call exchange exists and the work queue has a consumer; False at ``deadline``."""
    topology = settings.topology
    said = False
    while True:
        channel = await connection.channel()
        try:
            await channel.get_exchange(topology.tool_calls_exchange, ensure=True)
            queue = await channel.declare_queue(topology.work_queue, passive=True)
            consumers = queue.declaration_result.consumer_count
        except aiormq.exceptions.ChannelNotFoundEntity:
            consumers = 0  # not declared yet: no worker has started on this vhost
        finally:
            with contextlib.suppress(Exception):
                await channel.close()
        if consumers:
            return True
        if time.monotonic() >= deadline:
            return False
        if not said:
            _say(f"waiting for a worker to consume {topology.work_queue} (start `worker run`) ...")
            said = True
        await asyncio.sleep(0.25)


def user_of(url: str) -> str | None:
    """The user a connection to the AMQP ``url`` logs in as (``guest`` when it names none), for the
    ``user_id`` property; None for a login by TLS certificate (``auth_mechanism=external``), whose user
    the broker takes from the certificate."""
    parts = urlsplit(url)
    mechanisms = parse_qs(parts.query).get("auth_mechanism", [""])
    if mechanisms[-1].lower() == "external":
        return None
    return unquote(parts.username) if parts.username else "guest"


async def send(
    settings: Settings, *, scope: str, content: str | None, timeout: float, shard: int = DEFAULT_SHARD
) -> int:
    """Publish the example event as shard ``shard`` would, and print its result and notice. The event's
    ``user_id`` is the connection's user: RabbitMQ refuses any other, and a worker that checks shard
    identity takes shard N's events from user ``shard-N`` (CONTRACT.md)."""
    deadline = time.monotonic() + timeout
    try:
        connection, node = await connect_any(settings.rabbitmq_url)
    except Exception as exc:  # refused, unresolvable, access refused, no such vhost
        _cannot_reach("RabbitMQ", settings.rabbitmq_url, exc)
        return EXIT_UNREACHABLE
    topology = settings.topology
    try:
        if not await _wait_for_worker(connection, settings, deadline):
            _fail(f"no worker consumes {topology.work_queue} on {redact_setting(node)} after {timeout:g} s")
            return EXIT_UNREACHABLE
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        queues: dict[str, aio_pika.abc.AbstractQueue] = {}
        kinds: tuple[tuple[ShardQueueKind, str], ...] = (
            ("results", topology.results_exchange),
            ("notifications", topology.notifications_exchange),
        )
        for kind, exchange_name in kinds:
            exchange = await channel.get_exchange(exchange_name, ensure=True)
            queue = await channel.declare_queue(shard_queue(shard, kind), durable=True)
            await queue.bind(exchange, f"shard.{shard}")
            queues[kind] = queue
        event = example_event(scope, content, shard=shard)
        tool_calls = await channel.get_exchange(topology.tool_calls_exchange, ensure=True)
        await tool_calls.publish(
            tool_call_message(event, json.dumps(event).encode(), user_id=user_of(node)),
            routing_key=f"tool.{event['tool_name']}",
            mandatory=True,
        )
        _say(
            f"sent event {event['event_id']} ({scope}: {event['arguments']['memory_content']!r}) as shard "
            f"{shard} to {redact_setting(node)}"
        )
        result = await _take(queues["results"], event["event_id"], deadline)
        if result is None:
            _fail(f"no result for event {event['event_id']} within {timeout:g} s (is the worker running?)")
            return EXIT_UNREACHABLE
        _say(f"result: {result.get('status')}")
        _say(json.dumps(result, indent=2, ensure_ascii=False))
        if result.get("status") != Status.SAVED:
            if result.get("status") == Status.INTERNAL_ERROR:
                _say("the worker's log says why: a WARNING `critical state missing` names the missing rows")
            return EXIT_FAILED
        notice = await _take(queues["notifications"], event["event_id"], deadline)
        if notice is None:
            _fail(f"no notice for event {event['event_id']} within {timeout:g} s")
            return EXIT_UNREACHABLE
        _say(f"notice: {notice['notice']['title']} - {notice['notice']['full_content']}")
        _say(json.dumps(notice, indent=2, ensure_ascii=False))
        return EXIT_OK
    except Exception as exc:
        _fail(f"RabbitMQ at {redact_setting(node)}: {explain(exc, node)}")
        return EXIT_UNREACHABLE
    finally:
        with contextlib.suppress(Exception):
            await connection.close()


async def _take(queue: aio_pika.abc.AbstractQueue, event_id: str, deadline: float) -> dict[str, Any] | None:
    """The body of the message for ``event_id`` from ``queue`` (acking whatever comes before it, as a
    shard acks what it has handled), or None at ``deadline``."""
    while time.monotonic() < deadline:
        message = await queue.get(no_ack=False, fail=False)
        if message is None:
            await asyncio.sleep(0.05)
            continue
        await message.ack()
        with contextlib.suppress(ValueError):
            body = json.loads(message.body)
            if isinstance(body, dict) and body.get("event_id") == event_id:
                return body
    return None


# --- clean (RabbitMQ) -----------------------------------------------------------------------------------


async def clean(
    settings: Settings, *, topology: bool, shard: int = DEFAULT_SHARD, out: Callable[[str], None] = _say
) -> int:
    """Delete the demo's rows, then its queues (and, with ``topology``, the worker's) when empty and
    unused."""
    code = await _clean_rows(settings.postgres_dsn, out)
    try:
        connection, node = await connect_any(settings.rabbitmq_url)
    except Exception as exc:
        _cannot_reach("RabbitMQ", settings.rabbitmq_url, exc)
        return EXIT_UNREACHABLE
    names = [shard_queue(shard, "results"), shard_queue(shard, "notifications")]
    exchanges: list[str] = []
    if topology:
        t = settings.topology
        delays = RetryPolicy.of(settings).tiers()
        names += [t.work_queue, *(retry_queue_name(t, d) for d in delays), t.dead_letter_queue]
        # the shards' own queues the worker declared (README "Fair shares"): the demo's shard's, and any other
        # recorded in Postgres; each only when empty and unused, like the rest
        own = sorted({shard, *await _recorded_shards(settings.postgres_dsn)})
        names += [shard_queue_name(t, n) for n in own]
        exchanges = [
            t.tool_calls_exchange,
            t.results_exchange,
            t.notifications_exchange,
            t.dead_letter_exchange,
        ]
    deleted: list[str] = []
    kept: list[str] = []
    try:
        for name in names:
            channel = await connection.channel()
            try:
                queue = await channel.declare_queue(name, passive=True)
                found = queue.declaration_result
                # quorum queues take neither if-unused nor if-empty: the passive declare's counts decide
                if found.message_count or found.consumer_count:
                    kept.append(
                        f"queue {name} ({found.message_count} messages, {found.consumer_count} consumers)"
                    )
                else:
                    await queue.delete(if_unused=False, if_empty=False)
                    deleted.append(f"queue {name}")
            except aiormq.exceptions.ChannelNotFoundEntity:
                pass  # not there
            finally:
                with contextlib.suppress(Exception):
                    await channel.close()
        for name in exchanges:
            channel = await connection.channel()
            try:
                exchange = await channel.get_exchange(name, ensure=True)
                await exchange.delete(if_unused=True)
                deleted.append(f"exchange {name}")
            except aiormq.exceptions.ChannelNotFoundEntity:
                pass
            except aiormq.exceptions.ChannelPreconditionFailed:
                kept.append(f"exchange {name} (queues still bound)")
            finally:
                with contextlib.suppress(Exception):
                    await channel.close()
    finally:
        with contextlib.suppress(Exception):
            await connection.close()
    out(f"rabbitmq {redact_setting(node)}: deleted {', '.join(deleted) if deleted else 'nothing'}")
    if kept:
        out(f"rabbitmq: kept {', '.join(kept)}")
    return code
