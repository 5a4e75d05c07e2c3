"""The page's buttons: a replay of a group at a rate, a letter, a purge, a cancel, each a POST with the
session's form token from the page's own origin, run as ``worker dlq`` processes on record as ``--by``.

Against a real RabbitMQ (a fresh vhost per test, the worker's topology) and a real Postgres (a migrated
database per test for the audit record); the page runs as ``worker dlq ui`` in its own process and is spoken
to over plain HTTP, as a browser would: the token once in the URL, then its cookie.
"""

from __future__ import annotations

import asyncio
import html
import http.server
import re
import threading
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

import pytest

from tests.integration import test_dlq as base
from tests.integration.test_dlq import (
    TOPOLOGY,
    Broker,
    Seeded,
    add_schema_letters,
    event_ids,
    fill_dlq,
)
from tests.integration.test_dlq_oncall import history
from tests.integration.test_dlq_operations import started_replay
from tests.integration.test_dlq_page import browse_page, chromium, ui
from tests.support.wait import eventually

pytestmark = pytest.mark.integration

broker = base.broker
seeded = base.seeded
audit_database = base.audit_database

DLQ = TOPOLOGY.dead_letter_queue
ACTOR = "pat (the page)"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    text: str

    @property
    def said(self) -> str:
        """The text as a reader sees it (entities unescaped)."""
        return html.unescape(self.text)


@dataclass
class Session:
    """A browser's session with the page: its cookie, and what it sends."""

    base: str
    cookie: str

    @property
    def origin(self) -> str:
        return self.base.rstrip("/")

    def request(
        self, path: str, *, form: dict[str, str] | None = None, origin: str | None = None, cookie: bool = True
    ) -> Answer:
        headers = {"Cookie": self.cookie} if cookie else {}
        data = None
        if form is not None:
            data = urllib.parse.urlencode(form).encode()
            headers["Content-Type"] = "application/x-www-form-urlencoded"
            headers["Origin"] = origin or self.origin
        request = urllib.request.Request(self.base + path.lstrip("/"), data=data, headers=headers)
        try:
            with urllib.request.build_opener(_NoRedirect).open(request, timeout=60) as response:
                return Answer(response.status, dict(response.headers), response.read().decode())
        except urllib.error.HTTPError as exc:
            return Answer(exc.code, dict(exc.headers), exc.read().decode())

    async def get(self, path: str) -> Answer:
        return await asyncio.to_thread(self.request, path)

    async def post(self, form: dict[str, str], **kwargs: object) -> Answer:
        return await asyncio.to_thread(self.request, "/act", form=form, **kwargs)  # type: ignore[arg-type]

    async def confirm(self, **query: str) -> tuple[Answer, dict[str, str]]:
        """The confirmation of ``query`` and the fields of its form (hidden ones and their defaults)."""
        shown = await self.get("/confirm?" + urllib.parse.urlencode(query))
        fields = {
            html.unescape(name): html.unescape(value)
            for name, value in re.findall(r"<input type=hidden name='([^']*)' value='([^']*)'>", shown.text)
        }
        return shown, fields


async def signed_in(base_url: str, token: str) -> Session:
    answer = await asyncio.to_thread(Session(base_url, "").request, f"/?token={token}", cookie=False)
    assert answer.status == 303
    return Session(base_url, answer.headers["Set-Cookie"].split(";")[0])


async def test_a_group_replayed_from_the_page_goes_at_its_rate_on_record_as_the_page_user(
    broker: Broker, audit_database: str
) -> None:
    ids = await fill_dlq(broker, 30)
    async with ui(broker.url, "--by", ACTOR) as page:
        session = await signed_in(page.base, page.token)

        shown, form = await session.confirm(action="replay", by="kind", value="transient_exhausted")
        assert shown.status == 200
        assert "Replay 30 dead letter(s) of the group kind=transient_exhausted?" in shown.said
        assert "will fail again" not in shown.said  # a replay can help this kind
        assert set(form) == {"action", "by", "value", "csrf"}

        # without this session's form token, from another origin, or without the cookie: nothing moves
        no_token = await session.post({**form, "csrf": "0" * 64})
        assert no_token.status == 403
        assert "without this session's token" in no_token.said
        other_port = urllib.parse.urlsplit(page.base).port + 1  # type: ignore[operator]
        elsewhere = await session.post(form, origin=f"http://127.0.0.1:{other_port}")
        assert elsewhere.status == 403
        assert "another site" in elsewhere.said
        assert (await session.post(form, cookie=False)).status == 401
        assert await broker.depth(DLQ) == 30

        done = await session.post({**form, "rate": "200"})
        assert done.status == 303
        assert done.headers["Location"] == "/operations"

        async def all_replayed() -> bool:
            return await broker.depth(TOPOLOGY.work_queue) == 30 and await broker.depth(DLQ) == 0

        await eventually(all_replayed, "the page's replay moved every letter", 60, interval=0.1)
        replayed = [m.message_id for m in await broker.take_all(TOPOLOGY.work_queue)]
        assert sorted(replayed) == sorted(ids)

        async def closed() -> bool:
            return (await history(audit_database))[0]["state"] == "done"

        await eventually(closed, "the page's replay is on record as done", 30, interval=0.1)
    (entry,) = await history(audit_database)
    assert (entry["action"], entry["actor"], entry["rate"]) == ("replay", ACTOR, 200.0)
    assert entry["filters"] == {"group": ["kind=transient_exhausted"]}
    assert entry["letters"] == {"replayed": 30}
    assert "moved 30, kept 0" in page.log  # the replay's own line, in the page's log


async def test_a_kind_a_replay_cannot_help_needs_a_second_yes_and_a_purge_is_on_record(
    broker: Broker, seeded: Seeded, audit_database: str
) -> None:
    schema = await add_schema_letters(broker, [7, 9])
    async with ui(broker.url, "--by", ACTOR) as page:
        session = await signed_in(page.base, page.token)

        shown, form = await session.confirm(action="replay", by="shard", value="9")
        assert "Replay 2 dead letter(s) of the group shard=9?" in shown.said
        assert "2 of them (2 schema) will fail again" in shown.said
        refused = await session.post(form)
        assert refused.status == 409
        assert "tick the box" in refused.said
        assert await broker.depth(DLQ) == 7

        assert (await session.post({**form, "again": "yes", "rate": "0"})).status == 303

        async def replayed() -> bool:
            return await broker.depth(TOPOLOGY.work_queue) == 2

        await eventually(replayed, "the confirmed replay moved both letters", 60, interval=0.1)
        assert sorted(m.message_id for m in await broker.take_all(TOPOLOGY.work_queue)) == sorted(schema)

        # one letter, by its id
        shown, form = await session.confirm(action="replay", id=seeded.ids["A"])
        assert "Replay 1 dead letter(s) of the letter " in shown.said
        assert (await session.post(form)).status == 303
        await eventually(
            lambda: _depth_is(broker, TOPOLOGY.work_queue, 1), "the letter was replayed", 60, interval=0.1
        )

        # a group purged: deleted for good, on record
        shown, form = await session.confirm(action="purge", by="kind", value="malformed")
        assert "Delete for good 1 dead letter(s) of the group kind=malformed?" in shown.said
        assert (await session.post(form)).status == 303
        await eventually(lambda: _depth_is(broker, DLQ, 3), "the purge deleted the letter", 60, interval=0.1)
        assert seeded.ids["D"] not in await event_ids(broker.url)

        # nothing matches any more: said, not done
        nothing = await session.post(form)
        assert nothing.status == 409
        assert "Nothing matches now" in nothing.said

        async def all_closed() -> bool:
            entries = await history(audit_database)
            return len(entries) == 3 and all(entry["state"] == "done" for entry in entries)

        await eventually(all_closed, "the three operations are on record as done", 30, interval=0.1)
    purge, one, group = await history(audit_database)
    assert (group["action"], group["actor"], group["letters"]) == ("replay", ACTOR, {"replayed": 2})
    assert (one["filters"], one["letters"]) == ({"event_id": [seeded.ids["A"]]}, {"replayed": 1})
    assert (purge["action"], purge["actor"], purge["letters"]) == ("purge", ACTOR, {"deleted": 1})


async def _depth_is(broker: Broker, queue: str, depth: int) -> bool:
    return await broker.depth(queue) == depth


async def test_a_running_replay_is_cancelled_from_the_page(broker: Broker, audit_database: str) -> None:
    total = 200
    await fill_dlq(broker, total)
    process, running = await started_replay("--rate", "10", "--by", "alice", url=broker.url)
    async with ui(broker.url, "--by", ACTOR) as page:
        session = await signed_in(page.base, page.token)
        listed = await session.get("/operations")
        assert listed.status == 200
        assert f"data-operation='{running['operation_id']}' data-state='running'" in listed.text
        csrf = re.search(r"name='csrf' value='([0-9a-f]+)'", listed.text)
        assert csrf, listed.text

        asked = await session.post(
            {"action": "cancel", "operation": running["operation_id"], "csrf": csrf.group(1)}
        )
        assert asked.status == 303

        out, err = await asyncio.wait_for(process.communicate(), 60)
        assert process.returncode == 130, err.decode()
        said = out.decode().strip()
        assert said.startswith(f"cancelled by {ACTOR} once the letters in flight were settled: moved "), said
        moved = int(said.split("moved ")[1].split(",")[0])
        assert await broker.depth(DLQ) + await broker.depth(TOPOLOGY.work_queue) == total
        assert await broker.depth(TOPOLOGY.work_queue) == moved
        assert "No replay or purge runs now" in (await session.get("/operations")).said
    (entry,) = await history(audit_database)
    assert (entry["state"], entry["actor"]) == ("cancelled", "alice")


ATTACK = """<!doctype html><html><body>
<iframe src="{page}?token={token}" onload="document.getElementById('f').submit()"></iframe>
<form id=f method=post action="{page}act">
<input type=hidden name=action value=purge><input type=hidden name=by value=kind>
<input type=hidden name=value value=malformed><input type=hidden name=csrf value="{guess}">
</form>
</body></html>"""


async def test_a_page_of_another_origin_cannot_act_in_a_real_browser(broker: Broker, seeded: Seeded) -> None:
    """The operator signed in to the page in this browser (its cookie is there); a page on another port of the
    same host (the same *site*, so the SameSite=Strict cookie goes with its requests) submits a purge with a
    guessed form token once the sign-in frame has loaded. Headless chromium carries it out; the page refuses
    it, and nothing is deleted."""
    chromium()
    async with ui(broker.url) as page:
        guess = "0" * 64
        attack = ATTACK.format(page=page.base, token=urllib.parse.quote(page.token), guess=guess).encode()

        class Attacker(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(attack)))
                self.end_headers()
                self.wfile.write(attack)

            def log_message(self, *args: object) -> None:
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Attacker)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            dom = await browse_page(f"http://127.0.0.1:{server.server_address[1]}/")
        finally:
            server.shutdown()
            server.server_close()
    assert "Refused: a form of another site" in html.unescape(dom), dom[:2000]
    # the cookie went with it (a request without one is 401), and the Origin check refused it (403)
    assert re.search(r'"POST /act HTTP/1\.1" 403', page.log), page.log
    assert await event_ids(broker.url) == seeded.order(*"ABCDE")
