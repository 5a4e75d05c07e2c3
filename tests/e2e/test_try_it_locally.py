"""A newcomer's first hour (newcomer review 3): the README's "Try it locally" played as written, what the
worker says when the bot's rows are missing, its start-up line, and one line per failed connect.

The README block runs in ``bash -e`` from a scratch directory whose ``.venv`` is this interpreter's
environment, with the two variables the block itself reads set to this test's own database name and vhost
(``LTM_DEMO_DB``, ``LTM_RABBITMQ_URL``), so the commands are the README's, character for character.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import aio_pika
import aiormq
import asyncpg
import pytest

from tests.e2e.conftest import Stack
from tests.e2e.harness import REPO
from worker.ops.demo import AUTHOR, GUILD, PERSONA_ID
from worker.pipeline.outcome import CRITICAL_STATE_MISSING
from worker.redact import redact_url

README = REPO / "README.md"


def try_it_locally_block() -> str:
    """The second ``sh`` block of the README's "Try it locally" section (the first is the install)."""
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## Try it locally\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, flags=re.DOTALL)
    assert len(blocks) == 2, "Try it locally: an install block, then the demo block"
    return str(blocks[1])


def test_the_readme_block_reads_only_the_variables_the_test_sets() -> None:
    block = try_it_locally_block()

    assert "${LTM_DEMO_DB:-ltm_demo}" in block
    assert "LTM_RABBITMQ_URL" not in block  # the worker's default vhost, or whatever the reader exported
    assert "worker demo clean --topology" in block
    assert "dropdb" in block


async def _exists(url: str, kind: str, name: str) -> bool:
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel()
        try:
            if kind == "queue":
                await channel.declare_queue(name, passive=True)
            else:
                await channel.get_exchange(name, ensure=True)
        except aiormq.exceptions.ChannelNotFoundEntity:
            return False
        return True
    finally:
        await connection.close()


async def test_the_readme_try_it_locally_commands_run_as_written(
    postgres_dsn: str, rabbitmq_url: str, redis_url: str, tmp_path: Path
) -> None:
    """The README's commands save the example event, print its result and notice, and leave nothing."""
    pg, amqp = urlsplit(postgres_dsn), urlsplit(rabbitmq_url)
    local = (pg.hostname, pg.port, pg.username, amqp.hostname, amqp.port, amqp.username, redis_url)
    if local != ("127.0.0.1", 5432, "postgres", "127.0.0.1", 5672, "guest", "redis://127.0.0.1:6379/0"):
        pytest.skip("the README's commands name the local services' defaults; these tests use other services")
    database = f"ltm_demo_{uuid.uuid4().hex[:8]}"
    (tmp_path / ".venv").symlink_to(Path(sys.prefix))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LTM_", "MAX_"))}
    env.update(LTM_DEMO_DB=database, LTM_RABBITMQ_URL=rabbitmq_url, PYTHONUNBUFFERED="1")
    process = await asyncio.create_subprocess_exec(
        "bash",
        "-e",
        "-c",
        try_it_locally_block(),
        cwd=tmp_path,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = await asyncio.wait_for(process.communicate(), timeout=240)
    finally:
        if process.returncode is None:  # the block hung: its whole group goes (the worker too)
            os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
        admin = await asyncpg.connect(postgres_dsn)
        try:
            left = await admin.fetchval("SELECT count(*) FROM pg_database WHERE datname = $1", database)
            await admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        finally:
            await admin.close()
    text = out.decode()
    log = tmp_path / "ltm-demo.log"

    assert process.returncode == 0, text + (log.read_text() if log.exists() else "")
    assert text.count("result: memory_saved_successfully") == 2, text
    assert "notice: 🧠 Tomori Learned Something New! - Kaede likes dogs" in text
    assert "notice: 💡 Tomori Learned Something New about Master Sparrow!" in text
    assert "deleted 2 ledger rows, 2 users rows, 1 servers row" in text
    # back to a clean machine: the database, the log, the shard's and the worker's queues and exchanges
    assert left == 0
    assert not log.exists()
    for kind, name in [
        ("queue", "tomori.shard.3.results"),
        ("queue", "tomori.shard.3.notifications"),
        ("queue", "ltm.create_memory"),
        ("queue", "ltm.create_memory.dlq"),
        ("queue", "ltm.create_memory.retry.1000"),
        ("exchange", "tomori.tool_calls"),
        ("exchange", "tomori.tool_results"),
        ("exchange", "tomori.notifications"),
        ("exchange", "tomori.dead_letter"),
    ]:
        assert not await _exists(rabbitmq_url, kind, name), f"{kind} {name} left behind"


async def test_missing_bot_rows_are_named_in_a_warning_and_the_model_gets_the_original_sentence(
    stack: Stack,
) -> None:
    worker = stack.worker()
    await stack.workers_ready()

    sent = await asyncio.to_thread(stack.cli, "demo", "send", "--timeout", "60")

    assert sent.returncode == 1, sent.stdout + sent.stderr
    assert "result: memory_save_failed_internal_error" in sent.stdout
    printed = sent.stdout.split("result: memory_save_failed_internal_error\n", 1)[1]
    result = json.loads(printed[: printed.index("\n}\n") + 2])
    assert (result["error"], result["data"]["reason"]) == (CRITICAL_STATE_MISSING, CRITICAL_STATE_MISSING)
    await worker.wait_for_log("critical state missing")
    [warning] = [line for line in worker.lines() if line.get("event") == "critical state missing"]
    assert warning["level"] == "warning"
    assert warning["event_id"] == result["event_id"]
    assert warning["missing"] == [
        f"no servers row for guild {GUILD}",
        f"no personas row with persona_id {PERSONA_ID} on that server",
        f"no users row for the author {AUTHOR}",
    ]

    # the seed adds exactly those; the same event shape then saves
    seeded = await asyncio.to_thread(stack.cli, "demo", "seed")
    saved = await asyncio.to_thread(stack.cli, "demo", "send", "--timeout", "60")

    assert seeded.returncode == 0, seeded.stderr
    assert saved.returncode == 0, saved.stdout + saved.stderr
    assert "notice: 🧠 Tomori Learned Something New! - Kaede likes dogs" in saved.stdout
    assert worker.count("critical state missing") == 1


async def test_only_the_author_missing_is_named_alone(stack: Stack) -> None:
    await asyncio.to_thread(stack.cli, "demo", "seed")
    await stack.rows.conn.execute("DELETE FROM users WHERE user_disc_id = $1", AUTHOR)
    worker = stack.worker()
    await stack.workers_ready()

    sent = await asyncio.to_thread(stack.cli, "demo", "send", "--timeout", "60")

    assert sent.returncode == 1, sent.stdout + sent.stderr
    await worker.wait_for_log("critical state missing")
    [warning] = [line for line in worker.lines() if line.get("event") == "critical state missing"]
    assert warning["missing"] == [f"no users row for the author {AUTHOR}"]


async def test_the_start_up_line_names_every_target_and_an_unresolvable_node_is_one_error_line_per_try(
    stack: Stack,
) -> None:
    url = "amqp://guest:hunter2@ltm-no-such-host.invalid:5672/"
    worker = stack.worker(LTM_RABBITMQ_URL=url, LTM_HTTP_PORT="0")

    await worker.wait_for_log("rabbitmq unavailable", at_least=3, timeout=60)
    lines = worker.lines()
    [starting] = [line for line in lines if line.get("event") == "starting"]
    failures = [line for line in lines if line.get("event") == "rabbitmq unavailable"]
    from_aiormq = [line for line in lines if str(line.get("logger", "")).startswith("aiormq")]

    assert re.fullmatch(r"\d+\.\d+\.\d+.*", starting["version"])
    assert starting["postgres"] == redact_url(stack.postgres_dsn)
    assert starting["rabbitmq"] == "amqp://guest:***@ltm-no-such-host.invalid:5672/"
    assert starting["redis"] == stack.redis_url
    assert starting["http"] == "off"
    assert all(line["node"] == "amqp://guest:***@ltm-no-such-host.invalid:5672/" for line in failures)
    assert all(line["level"] == "error" for line in failures)  # a host that does not resolve needs a person
    assert from_aiormq == []  # one line per attempt: the worker's, not aiormq's too
    assert "hunter2" not in worker.tail()


async def test_dlq_with_an_unresolvable_host_prints_only_its_own_line(stack: Stack) -> None:
    done = await asyncio.to_thread(
        stack.cli, "dlq", "list", LTM_RABBITMQ_URL="amqp://guest:guest@ltm-no-such-host.invalid:1/"
    )

    assert done.returncode == 3
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert "cannot reach RabbitMQ at amqp://guest:***@ltm-no-such-host.invalid:1/" in lines[0]
