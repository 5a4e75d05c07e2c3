"""``worker run`` and its probe settings: where the endpoint listens, and what a bad value does."""

from __future__ import annotations

import asyncio
import socket
import urllib.request

import pytest

from tests.e2e.stack import Stack
from worker.testing.workers import free_port

pytestmark = pytest.mark.e2e


def healthz(host: str, port: int) -> int | str:
    """The status of ``GET /healthz`` on ``host:port``, or the connection error's name."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/healthz", timeout=5) as response:
            return int(response.status)
    except OSError as error:
        reason = getattr(error, "reason", error)
        return type(reason).__name__


async def test_the_endpoint_listens_on_127_0_0_1_unless_told(stack: Stack) -> None:
    port = free_port()
    stack.worker(LTM_HTTP_PORT=str(port))
    await stack.workers_ready()

    listening = [line for line in stack.workers[0].lines() if line["event"] == "probe endpoint listening"]
    assert [(line["host"], line["port"]) for line in listening] == [("127.0.0.1", port)]
    assert await asyncio.to_thread(healthz, "127.0.0.1", port) == 200
    # every 127/8 address reaches this host over loopback: one the worker did not bind is refused
    assert await asyncio.to_thread(healthz, "127.0.0.2", port) == "ConnectionRefusedError"


async def test_ltm_http_host_moves_the_endpoint(stack: Stack) -> None:
    port = free_port()
    stack.worker(LTM_HTTP_PORT=str(port), LTM_HTTP_HOST="127.0.0.2")
    await stack.workers_ready()

    assert await asyncio.to_thread(healthz, "127.0.0.2", port) == 200
    assert await asyncio.to_thread(healthz, "127.0.0.1", port) == "ConnectionRefusedError"


async def test_a_port_that_is_no_port_is_a_warning_and_no_endpoint(stack: Stack) -> None:
    worker = stack.worker(LTM_HTTP_PORT="notaport", LTM_LOG_LEVEL="verbose")
    await stack.workers_ready()

    warnings = [line for line in worker.lines() if line["event"] == "invalid setting, using the default"]
    assert [(line["level"], line["variable"], line["value"], line["default"]) for line in warnings] == [
        ("warning", "LTM_HTTP_PORT", "notaport", 0),
        ("warning", "LTM_LOG_LEVEL", "verbose", "info"),
    ]
    assert warnings[0]["expected"] == "a port number 0..65535 (0 or empty: off)"
    assert worker.count("probe endpoint listening") == 0


async def test_a_port_already_taken_stops_the_worker_with_one_line(stack: Stack) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        worker = stack.worker(LTM_HTTP_PORT=str(port))

        assert await worker.wait_exit(timeout=60) == 1
    text = worker.log_path.read_text()
    assert "Traceback" not in text
    # the start-up line (version and targets), then the one error line
    starting, line = worker.lines()
    assert starting["event"] == "starting"
    assert (line["level"], line["event"]) == ("error", "probe endpoint cannot start")
    assert line["error"] == f"cannot listen on 127.0.0.1:{port}: Address already in use"
