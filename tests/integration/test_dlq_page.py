"""``worker dlq ui``: the read-only page, in a real headless browser (Debian's chromium) against real dead
letters on the real broker, and its token over plain HTTP.

The browser test skips when chromium is missing, unless ``CI=true`` (then it fails: CI installs it).
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
import os
import re
import shutil
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import aio_pika
import asyncpg
import pytest

from tests.integration import test_dlq as base
from tests.integration.test_dlq import (
    MAIN_KEY,
    TOPOLOGY,
    Broker,
    Seeded,
    add_schema_letters,
    cli,
    dead_letter_copy,
    event_ids,
    json_lines,
    shard_message,
    start_dlq,
)
from worker.testing.dead_letters import keeping

pytestmark = pytest.mark.integration

broker = base.broker
seeded = base.seeded
audit_database = base.audit_database

DLQ = TOPOLOGY.dead_letter_queue
BROWSER_TIMEOUT = 90.0
TOKEN = "a-token-of-sixteen-or-more"


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium is not installed; CI must install it (apt-get install chromium)")
        pytest.skip("chromium is not installed (apt-get install chromium): the page's browser test needs it")
    return found


async def browse_page(url: str) -> str:
    """The page's DOM after a headless chromium loaded it."""
    with tempfile.TemporaryDirectory(prefix="ltm-chromium-") as profile:
        args = ["--headless", "--disable-gpu", f"--user-data-dir={profile}", "--dump-dom", url]
        if os.geteuid() == 0:
            args.insert(0, "--no-sandbox")  # chromium refuses to sandbox as root
        process = await asyncio.create_subprocess_exec(
            chromium(),
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        out, _ = await asyncio.wait_for(process.communicate(), BROWSER_TIMEOUT)
    assert process.returncode == 0
    dom = out.decode()
    assert "</html>" in dom, dom[:500]
    return dom


@dataclass
class Page:
    """A running ``worker dlq ui``: where it is, its token, its access log so far."""

    base: str
    token: str
    process: asyncio.subprocess.Process
    #: stderr, one line per request: read once the page has stopped
    log: str = ""

    def at(self, path: str = "", **query: str) -> str:
        """The URL of ``path`` with the token in it (each browser run starts without the cookie)."""
        return f"{self.base}{path}?{urllib.parse.urlencode({**query, 'token': self.token})}"


@contextlib.asynccontextmanager
async def ui(url: str, *args: str, token: str | None = None) -> AsyncIterator[Page]:
    """``worker dlq ui --port 0 ARGS`` running (stderr, its access log, to a pipe read at the end), beside a
    keeper that keeps the dead letters in the test's database as the workers would."""
    async with keeping(url, base._AUDIT["dsn"]), _ui(url, *args, token=token) as shown:
        yield shown


@contextlib.asynccontextmanager
async def _ui(url: str, *args: str, token: str | None = None) -> AsyncIterator[Page]:
    process = await start_dlq(
        *("ui", "--port", "0", "--rabbitmq-url", url, *args),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    shown = Page("", "", process)
    try:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), 60)).decode()
        found = re.search(r"(http://\S+/)(\?token=(\S+))?", line)
        assert found, line
        given = found.group(3) or token
        assert given, "no token printed and none given"
        shown.base, shown.token = found.group(1), urllib.parse.unquote(given)
        yield shown
    finally:
        if process.returncode is None:
            process.terminate()
        _, err = await asyncio.wait_for(process.communicate(), 30)
        shown.log = err.decode()


def section(dom: str, section_id: str) -> str:
    found = re.search(rf'<section id="{section_id}">(.*?)</section>', dom, re.S)
    assert found, f"no section {section_id}"
    return found.group(1)


def groups_shown(dom: str, by: str) -> dict[str, int]:
    rows = re.findall(r'<tr data-group="([^"]*)" data-count="(\d+)"', section(dom, f"groups-{by}"))
    return {html.unescape(group): int(count) for group, count in rows}


def pre(dom: str, pre_id: str) -> str:
    found = re.search(rf'<pre id="{pre_id}">(.*?)</pre>', dom, re.S)
    assert found, f"no <pre id={pre_id}>"
    return html.unescape(found.group(1))


async def test_the_page_shows_what_the_cli_says(broker: Broker, seeded: Seeded) -> None:
    chromium()
    await add_schema_letters(broker, [7, 9, 11])
    await broker.wait_depth(DLQ, 8)
    replayed = await cli("replay", "--event-id", seeded.ids["C"], "--by", "carol", url=broker.url)
    assert replayed.code == 0, replayed.err
    order = await event_ids(broker.url)

    async with ui(broker.url) as served:
        dom = await browse_page(served.at())

        assert re.search(r'<div class="tile" id="total" data-count="7">', dom)
        for by in ("kind", "error", "shard"):
            cli_groups = json_lines(await cli("list", "--group-by", by, "--json", url=broker.url))
            assert groups_shown(dom, by) == {g["selector"]: g["count"] for g in cli_groups}, by
            for group in cli_groups:  # the exact command for each group, as the CLI prints it
                assert html.escape(group["replay"], quote=False) in section(dom, f"groups-{by}")
        assert groups_shown(dom, "kind")["kind=schema"] == 4
        assert "<svg" in section(dom, "groups-error")  # the over-time charts
        history = section(dom, "history")
        assert "carol" in history
        assert "replayed 1" in history

        for letter in ("B", "D", "E"):  # JSON, not JSON, the broker's own dead letter
            event_id = seeded.ids[letter]
            letter_dom = await browse_page(served.at("letter", id=event_id))
            shown = await cli("show", event_id, url=broker.url)
            assert shown.code == 0, shown.err
            show_body = shown.out.split("\nbody (", 1)[1].split("\n", 1)[1].rstrip("\n")
            assert pre(letter_dom, "body") == show_body, letter
        # the failure result the shard got: B (schema, ids readable) was answered; E (broker) was not
        b_dom = await browse_page(served.at("letter", id=seeded.ids["B"]))
        result = json.loads(pre(b_dom, "result"))
        assert (result["event_id"], result["success"], result["status"]) == (
            seeded.ids["B"],
            False,
            "memory_save_failed_internal_error",
        )
        e_dom = await browse_page(served.at("letter", id=seeded.ids["E"]))
        assert 'id="result"' not in e_dom
        assert "the broker dead-lettered it (delivery_limit); the worker sent no result" in e_dom

        group_dom = await browse_page(served.at("group", by="shard", value="9"))
        assert re.search(r'<span id="group-count">3</span>', group_dom)

    # the page only read: every dead letter is where it was, in the same order, and nothing was replayed
    assert await event_ids(broker.url) == order
    assert await broker.depth(TOPOLOGY.work_queue) == 1  # C, by carol's replay


def get(
    url: str, *, cookie: str | None = None, method: str = "GET", bearer: str | None = None
) -> tuple[int, dict[str, str], str]:
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: object, **kwargs: object) -> None:
            return None

    headers = {"Cookie": cookie} if cookie else {}
    if bearer is not None:
        headers["Authorization"] = f"Bearer {bearer}"
    request = urllib.request.Request(url, method=method, headers=headers)
    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(request, timeout=60) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


async def test_a_token_guards_the_page_and_nothing_writes_without_a_form(
    broker: Broker, seeded: Seeded
) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".token") as token_file:
        token_file.write(TOKEN + "\n")
        token_file.flush()
        async with ui(broker.url, "--token-file", token_file.name, token=TOKEN) as shown:
            base_url = shown.base
            status, _, text = await asyncio.to_thread(get, base_url)
            assert status == 401
            assert "needs its token" in text
            status, headers, _ = await asyncio.to_thread(get, f"{base_url}?token=wrong-token-of-some-length")
            assert status == 401
            status, headers, _ = await asyncio.to_thread(get, f"{base_url}letter?id=x&token={TOKEN}")
            assert status == 303
            assert headers["Location"] == "/letter?id=x"
            cookie = headers["Set-Cookie"].split(";")[0]
            assert TOKEN not in cookie  # the cookie is derived from the token, not the token
            # named for the page's port (security review 5, N-H): browsers keep cookies by host, not port
            assert cookie.startswith(f"ltm_dlq_ui_{urllib.parse.urlsplit(base_url).port}=")
            status, headers, text = await asyncio.to_thread(get, base_url, cookie=cookie)
            assert status == 200
            assert "id=total data-count='5'" in text  # the server's own HTML, before a browser
            assert "script-src" not in headers["Content-Security-Policy"]  # no script runs on the page
            # a POST is a button's form or nothing (test_dlq_page_buttons.py); no other method writes
            status, _, _ = await asyncio.to_thread(get, base_url, cookie=cookie, method="POST")
            assert status == 400
            for method in ("PUT", "DELETE"):
                status, _, _ = await asyncio.to_thread(get, base_url, cookie=cookie, method=method)
                assert status == 501, method
    assert await event_ids(broker.url) == seeded.order(*"ABCDE")


async def test_off_loopback_the_page_needs_a_token(broker: Broker) -> None:
    process = await start_dlq(
        *("ui", "--host", "0.0.0.0", "--port", "0", "--rabbitmq-url", broker.url),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 2
    assert b"--host 0.0.0.0 is not a loopback address: give a token" in err
    assert out == b""


def test_chromium_is_found_or_the_reason_is_given() -> None:
    """Where the browser test's chromium comes from (a skip here says how to get it)."""
    assert Path(chromium()).exists()


async def test_what_a_shard_wrote_is_shown_as_text(broker: Broker) -> None:
    """Markup and control characters in a dead letter's id, error, headers and body reach the browser as text:
    no element of theirs is built, no script runs (the CSP allows none either)."""
    chromium()
    evil = "<script>document.title='pwned'</script><img src=x onerror=alert(1)>\x1b[2J"
    event_id = f"{uuid.uuid4()}{evil}"
    message = shard_message(json.dumps({"event_id": event_id, "note": evil}).encode(), event_id=event_id)
    message.headers = {**(message.headers or {}), f"x-note{evil}": evil}
    await dead_letter_copy(
        broker, message, MAIN_KEY, kind=f"schema{evil}", error=evil, attempts=1, failed_at=datetime.now(UTC)
    )
    await broker.wait_depth(DLQ, 1)
    async with ui(broker.url) as shown:
        pages = [await browse_page(shown.at()), await browse_page(shown.at("letter", id=event_id))]
    for dom in pages:
        assert "<script" not in dom
        assert "<img" not in dom
        assert "<title>pwned</title>" not in dom  # no script set the title
        assert "&lt;script&gt;document.title='pwned'&lt;/script&gt;" in dom
        assert "\x1b" not in dom
        assert "\\x1b[2J" in dom
    assert pre(pages[1], "body").count("<script>") == 2  # in the body twice, as text


async def test_a_letter_says_who_published_it_and_that_a_replay_cannot_help(broker: Broker) -> None:
    """The letter's page names the publishing user the worker recorded, and for a kind a replay cannot help
    says so first, the replay command folded away (newcomer review F12)."""
    event_id = str(uuid.uuid4())
    message = shard_message(json.dumps({"event_id": event_id, "shard_id": 4}).encode(), event_id=event_id)
    message.headers = {**(message.headers or {}), "x-ltm-user-id": "shard-3"}
    await dead_letter_copy(
        broker,
        message,
        f"{MAIN_KEY}.shard.4",
        kind="unverified_shard",
        error="user shard-3 may not speak for shard 4",
        attempts=1,
        failed_at=datetime.now(UTC),
    )
    await broker.wait_depth(DLQ, 1)
    async with ui(broker.url) as page:
        status, _, text = await asyncio.to_thread(
            get, f"{page.base}letter?{urllib.parse.urlencode({'id': event_id})}", bearer=page.token
        )
    assert status == 200
    assert "published by</th><td><code>shard-3 (recorded by the worker)" in text
    assert f"replays to</th><td><code>{MAIN_KEY} (replayed 0 time(s) so far)" in text
    advice = re.search(r"<p id=advice class=fails>(.*?)</p>", text)
    assert advice is not None
    assert advice.group(1).startswith("a replay fails again: the RabbitMQ user that published it")
    assert "<details><summary class=muted>the replay command all the same</summary>" in text


async def test_a_letters_page_tells_its_whole_life(
    broker: Broker, seeded: Seeded, audit_database: str
) -> None:
    """Failed, replayed by whom at what rate, came back, answered: the letter's page puts the DLQ and the
    record side by side, oldest first."""
    event_id = seeded.ids["A"]  # transient_exhausted
    replayed = await cli("replay", "--event-id", event_id, "--by", "carol", "--rate", "20", url=broker.url)
    assert replayed.code == 0, replayed.err
    (copy,) = await broker.take_all(TOPOLOGY.work_queue)
    assert copy.headers["x-ltm-replay-count"] == 1
    # the worker failed it again: back in the DLQ, as the worker dead-letters it, its replay count kept
    back = aio_pika.Message(copy.body, message_id=event_id, headers=dict(copy.headers))
    await dead_letter_copy(
        broker, back, MAIN_KEY, kind="transient_exhausted", error="still down", attempts=5,
        failed_at=datetime.now(UTC),
    )  # fmt: skip
    await broker.wait_depth(DLQ, 5)
    record = await asyncpg.connect(audit_database)
    try:  # and a later attempt answered it, as the worker records an answer
        await record.execute(
            "INSERT INTO ltm_processed_events (event_id, tool_call_id, tool_name, shard_id, status,"
            " processed_at) VALUES ($1, 'call', 'create_long_term_memory', 3, 'success',"
            " now() + interval '1 s')",
            uuid.UUID(event_id),
        )
    finally:
        await record.close()

    async with ui(broker.url) as page:
        status, _, text = await asyncio.to_thread(
            get, f"{page.base}letter?{urllib.parse.urlencode({'id': event_id})}", bearer=page.token
        )

    assert status == 200
    life = re.search(r"<section id=life>(.*?)</section>", text, re.S)
    assert life, text[:2000]
    steps = [html.unescape(x) for x in re.findall(r"<tr><td>[^<]*</td><td>([^<]*)</td>", life.group(1))]
    assert steps == ["replayed (as replay 1)", "came back after replay 1", "answered by the worker"], steps
    assert "by carol, operation " in life.group(1)
    assert "at 20/s" in life.group(1)
    assert "transient_exhausted after 5 attempt(s): still down; in the DLQ now" in life.group(1)
