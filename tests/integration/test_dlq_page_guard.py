"""``worker dlq ui`` against the findings of security review 4 (N3, N4, N5, and the cross-site GETs that each
cost a pass over the DLQ): a real page process, real sockets, the real broker."""

from __future__ import annotations

import asyncio
import http.client
import socket
import tempfile
import threading
import time
import urllib.parse
from typing import Any

import pytest

from tests.integration import test_dlq as base
from tests.integration.test_dlq import TOPOLOGY, Broker, Seeded, event_ids, start_dlq
from tests.integration.test_dlq_page import TOKEN, ui
from worker.ops import dlq
from worker.ops.dlq.page.server import MAX_CONNECTIONS
from worker.ops.dlq.reading import Seen

pytestmark = pytest.mark.integration

broker = base.broker
seeded = base.seeded
audit_database = base.audit_database


def request(base_url: str, path: str = "/", headers: dict[str, str] | None = None) -> tuple[int, str]:
    """GET ``path`` with exactly these headers (``Host`` too, when given); the status and the body."""
    parts = urllib.parse.urlsplit(base_url)
    assert parts.hostname is not None
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        given = headers or {}
        connection.putrequest("GET", path, skip_host="Host" in given)
        for name, value in given.items():
            connection.putheader(name, value)
        connection.endheaders()
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


async def times_read(url: str, event_id: str) -> int:
    """The letter's ``x-delivery-count`` as this read finds it (the read itself adds one for the next)."""
    found: list[Seen] = []
    async with dlq.open_dead_letters(url, TOPOLOGY) as queue:
        await dlq.browse(
            queue,
            dlq.Selection(event_ids=frozenset({event_id})),
            lambda seen, _: found.append(seen),
            details=True,
        )
    (seen,) = found
    return seen.times_read or 0


async def test_no_token_no_host_no_pass_over_the_dlq(broker: Broker, seeded: Seeded) -> None:
    """Without its token (the loopback default makes one) and its own name in ``Host``, the page answers
    401 or 421 and reads nothing: a cross-site GET or a rebound name costs no pass over the DLQ. With them,
    it reads the letters the workers keep in Postgres: no pass over the DLQ either."""
    letter = seeded.ids["A"]
    async with ui(broker.url) as page:
        bearer = {"Authorization": f"Bearer {page.token}"}
        before = await times_read(broker.url, letter)

        status, text = await asyncio.to_thread(request, page.base)  # what an <img src> on any site sends
        assert status == 401
        assert "needs its token" in text
        rebound = {"Host": f"rebind.attacker.example:{urllib.parse.urlsplit(page.base).port}"}
        status, text = await asyncio.to_thread(request, page.base, "/", {**rebound, **bearer})
        assert status == 421
        assert "not rebind.attacker.example" in text
        assert "dead letters</div>" not in text
        status, _ = await asyncio.to_thread(request, page.base, "/", {"Host": ""})
        assert status == 421

        assert await times_read(broker.url, letter) == before + 1  # only the first check read it

        status, text = await asyncio.to_thread(request, page.base, "/", bearer)
        assert status == 200
        assert "id=total data-count='5'" in text
        assert await times_read(broker.url, letter) == before + 2  # the two checks; the page read the table
    assert await event_ids(broker.url) == seeded.order(*"ABCDE")


@pytest.mark.slow
async def test_idle_connections_neither_block_the_page_nor_stay(broker: Broker, seeded: Seeded) -> None:
    """Security review 4, N4: connections that say nothing took the page down. Now they wait in their own
    threads and are cut off after their deadline; and at the cap a newcomer takes the place of the oldest
    silent one (security review 5, N-F: eight held silent connections kept the operator out)."""
    async with ui(broker.url) as page:
        bearer = {"Authorization": f"Bearer {page.token}"}
        parts = urllib.parse.urlsplit(page.base)
        address = (parts.hostname, parts.port)

        silent = await asyncio.to_thread(socket.create_connection, address, 60)
        trickling = await asyncio.to_thread(socket.create_connection, address, 60)
        trickling.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
        status, _ = await asyncio.to_thread(request, page.base, "/", bearer)
        assert status == 200  # answered while both wait
        assert await asyncio.to_thread(_closed_by_server, silent)  # each is cut off at its deadline (10 s)
        assert await asyncio.to_thread(_closed_by_server, trickling)

        # security review 5, N-F, as the review ran it: one client holds every connection the page takes,
        # re-opening each as the server cuts it; at the cap a newcomer takes the place of the oldest one still
        # silent, so the operator's requests are served all the same
        stop = threading.Event()

        def hold() -> None:
            held = [socket.create_connection(address, 60) for _ in range(MAX_CONNECTIONS)]
            while not stop.is_set():
                for n, connection in enumerate(held):
                    connection.setblocking(False)
                    try:
                        closed = connection.recv(1) == b""
                    except BlockingIOError:
                        closed = False
                    except OSError:
                        closed = True
                    if closed:
                        connection.close()
                        held[n] = socket.create_connection(address, 60)
                time.sleep(0.05)
            for connection in held:
                connection.close()

        holder = threading.Thread(target=hold, daemon=True)
        holder.start()
        try:
            await asyncio.sleep(0.5)
            statuses = [(await asyncio.to_thread(request, page.base, "/", bearer))[0] for _ in range(10)]
        finally:
            stop.set()
            await asyncio.to_thread(holder.join, 30)
        assert statuses == [200] * 10, "a client holding silent connections kept the operator out"


def _closed_by_server(connection: socket.socket) -> bool:
    """Whether the server closes the connection (within a generous minute)."""
    connection.settimeout(60)
    try:
        while connection.recv(4096):  # a 400 for the trickled head may come first
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    finally:
        connection.close()


async def test_the_access_log_shows_no_token(broker: Broker, seeded: Seeded) -> None:
    """Security review 4, N5: ``/?token=...`` was logged in clear, a wrong token too."""
    wrong = "wrong-token-0123456789"
    with tempfile.NamedTemporaryFile("w", suffix=".token") as token_file:
        token_file.write(TOKEN + "\n")
        token_file.flush()
        async with ui(broker.url, "--token-file", token_file.name, token=TOKEN) as page:
            for query in (
                {"token": TOKEN, "x": "1"},
                {"token": wrong},
                {"id": seeded.ids["A"], "ToKeN": TOKEN},
            ):
                path = "/letter?" + urllib.parse.urlencode(query)
                status, _ = await asyncio.to_thread(request, page.base, path, {"Host": "localhost"})
                assert status in (303, 401)
            status, _ = await asyncio.to_thread(
                request, page.base, "/?%74oken=" + TOKEN, {"Host": "localhost"}
            )
    lines = page.log.splitlines()
    assert len(lines) >= 4, page.log
    assert TOKEN not in page.log
    assert wrong not in page.log
    assert '"GET /letter?token=***&x=1 HTTP/1.1" 303' in page.log


@pytest.mark.parametrize(
    ("token", "why"),
    [
        (" " * 16, "holds a blank"),
        ("a" * 16, "must hold at least 8 different characters"),
        ("short", "must be at least 16 characters"),
    ],
)
async def test_a_weak_token_is_refused_at_start(broker: Broker, token: str, why: str) -> None:
    process = await start_dlq(
        *("ui", "--port", "0", "--token", token, "--rabbitmq-url", broker.url),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 2
    assert f"worker dlq ui: the token {why}" in err.decode()
    assert out == b""


async def test_a_name_given_with_allow_host_is_answered(broker: Broker, seeded: Seeded) -> None:
    async with ui(broker.url, "--allow-host", "dlq.tunnel.example") as page:
        headers: dict[str, Any] = {"Host": "dlq.tunnel.example:443", "Authorization": f"Bearer {page.token}"}
        status, _ = await asyncio.to_thread(request, page.base, "/", headers)
        assert status == 200
        status, _ = await asyncio.to_thread(request, page.base, "/", {**headers, "Host": "other.example"})
        assert status == 421
