"""A newcomer's first hour (newcomer reviews 3 and 4): the README's "Try it locally" played as written, what
the worker says when the bot's rows are missing, its start-up line, one line per failed connect, and
``worker demo`` as another shard and cleaning up after itself.

The README block runs in ``bash -e`` from a scratch directory whose ``.venv`` is this interpreter's
environment, with the one variable the block reads, ``LTM_DEMO_DB``, set to a name of this test's own (the
block makes a database and a vhost of that name, and removes both), so the commands are the README's,
character for character. It needs ``rabbitmqctl`` for the local broker, as the README says.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import aio_pika
import aiormq
import asyncpg
import pytest

from tests.e2e.stack import Stack
from tests.support.harness import REPO
from worker.ops.demo import AUTHOR, GUILD, PERSONA_ID, TOOL_CALL_PREFIX
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


def test_the_readme_block_pairs_its_database_with_a_vhost_of_its_own() -> None:
    """Newcomer review 4, F8: the block made a database of its own but used vhost `/`."""
    block = try_it_locally_block()

    assert "${LTM_DEMO_DB:-ltm_demo}" in block  # the one variable the test sets
    assert 'createdb -h 127.0.0.1 -U postgres "$db"' in block
    assert 'rabbitmqctl -q add_vhost "$db" && rabbitmqctl -q set_permissions -p "$db" guest' in block
    assert 'LTM_RABBITMQ_URL="amqp://guest:guest@127.0.0.1:5672/$db"' in block
    assert 'dropdb -h 127.0.0.1 -U postgres "$db" && rabbitmqctl -q delete_vhost "$db"' in block


def rabbitmqctl_runs() -> bool:
    """Whether this process may run `rabbitmqctl` against the local broker (root, or the rabbitmq user)."""
    executable = shutil.which("rabbitmqctl")
    if executable is None:
        return False
    done = subprocess.run([executable, "-q", "list_vhosts"], capture_output=True, timeout=60, check=False)
    return done.returncode == 0


def vhosts() -> set[str]:
    done = subprocess.run(
        ["rabbitmqctl", "-q", "list_vhosts"], capture_output=True, text=True, timeout=60, check=True
    )
    return {line.strip() for line in done.stdout.splitlines() if line.strip()} - {"name"}


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
    if not await asyncio.to_thread(rabbitmqctl_runs):
        pytest.skip("the README's block runs rabbitmqctl (as root or the rabbitmq user); it cannot run here")
    database = f"ltm_demo_{uuid.uuid4().hex[:8]}"
    (tmp_path / ".venv").symlink_to(Path(sys.prefix))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LTM_", "MAX_"))}
    env.update(LTM_DEMO_DB=database, PYTHONUNBUFFERED="1")
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
        left_vhost = database in await asyncio.to_thread(vhosts)
        if left_vhost:
            await asyncio.to_thread(
                subprocess.run, ["rabbitmqctl", "-q", "delete_vhost", database], check=False
            )
    text = out.decode()
    log = tmp_path / "ltm-demo.log"

    assert process.returncode == 0, text + (log.read_text() if log.exists() else "")
    assert text.count("result: memory_saved_successfully") == 2, text
    assert "notice: 🧠 Tomori Learned Something New! - Kaede likes dogs" in text
    assert "notice: 💡 Tomori Learned Something New about Master Sparrow!" in text
    # back to a clean machine: the database, the vhost (with every queue and exchange), the log
    assert (left, left_vhost) == (0, False)
    assert not log.exists()


async def test_demo_send_speaks_as_the_shard_it_is_told_and_clean_removes_what_the_demo_made(
    stack: Stack,
) -> None:
    """`--shard N` (newcomer review 4, F9: the compose stack ships shard-0's user, not shard-3's): the event
    says shard N, its `user_id` is the URL's user, the answer comes to shard N's queues; `demo clean --shard N
    --topology` removes the rows, shard N's queues and the worker's topology."""
    rabbitmq_url = stack.rabbitmq_url
    assert (await asyncio.to_thread(stack.cli, "demo", "seed")).returncode == 0
    worker = stack.worker()
    await stack.workers_ready()
    connection = await aio_pika.connect(rabbitmq_url)
    try:
        channel = await connection.channel()
        spy = await channel.declare_queue(exclusive=True)  # a copy of what the demo publishes
        await spy.bind("tomori.tool_calls", "tool.#")

        sent = await asyncio.to_thread(stack.cli, "demo", "send", "--shard", "5", "--timeout", "60")

        assert sent.returncode == 0, sent.stdout + sent.stderr
        assert "result: memory_saved_successfully" in sent.stdout
        published = await spy.get(timeout=10)
        await spy.delete(if_unused=False, if_empty=False)
    finally:
        await connection.close()
    assert json.loads(published.body)["shard_id"] == 5
    assert published.user_id == (urlsplit(rabbitmq_url).username or "guest")
    worker.signal(signal.SIGTERM)
    assert await worker.wait_exit() == 0

    cleaned = await asyncio.to_thread(stack.cli, "demo", "clean", "--shard", "5", "--topology")

    assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
    assert "database: deleted 1 ledger rows, 2 users rows, 1 servers row" in cleaned.stdout
    demo_rows = "SELECT count(*) FROM ltm_processed_events WHERE starts_with(tool_call_id, $1)"
    assert await stack.rows.conn.fetchval(demo_rows, TOOL_CALL_PREFIX) == 0
    for kind, name in [
        ("queue", "tomori.shard.5.results"),
        ("queue", "tomori.shard.5.notifications"),
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
