"""Several RabbitMQ nodes in one setting: ``LTM_RABBITMQ_URL`` may list one AMQP URL per cluster node.

The list is comma-separated (Celery's failover list uses the same idea): ``amqp://u:p@rmq-1:5672/ltm,
amqp://u:p@rmq-2:5672/ltm``. Whitespace around the commas is ignored. A comma cannot occur unescaped in an
AMQP URL (a password holding one is percent-encoded), so the split is unambiguous.

The worker connects to the first node that answers, in the order given; after losing it, the next attempt
starts with the node after it and goes round the list once. Connections therefore spread only as far as the
operator's order spreads them: list the nodes in a different order per host (or per replica) to balance.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

import aio_pika

from worker.faults import FailedEverywhere, Problem, explain
from worker.redact import redact_url


def vhost_of(url: str) -> str:
    """The vhost an AMQP URL names (``/`` when it names none)."""
    path = urlsplit(url).path
    return unquote(path[1:]) if len(path) > 1 else "/"


#: how long one node gets to accept the connection before the next one is tried
NODE_CONNECT_TIMEOUT = 10.0


def split_urls(value: str) -> list[str]:
    """The AMQP URLs listed in ``value`` (comma-separated), in order; at least one."""
    urls = [part.strip() for part in value.split(",") if part.strip()]
    if not urls:
        raise ValueError("no AMQP URL given (LTM_RABBITMQ_URL is empty)")
    return urls


class NoNodeAnswered(FailedEverywhere):
    """Every listed node refused or timed out; the message names each with its error (``problems``, one
    per node, say whether a person must act)."""


@dataclass
class Nodes:
    """The cluster's nodes as one setting lists them, and which one to try first next time."""

    urls: Sequence[str]
    timeout: float = NODE_CONNECT_TIMEOUT
    _next: int = field(default=0, init=False)
    #: the URL of the node the last connection went to, or None before the first
    current: str | None = field(default=None, init=False)

    @classmethod
    def from_setting(cls, value: str, timeout: float = NODE_CONNECT_TIMEOUT) -> Nodes:
        return cls(split_urls(value), timeout)

    async def connect(self, **options: Any) -> aio_pika.abc.AbstractConnection:
        """A connection to the first node that answers, starting after the node used last; every node is
        tried once; ``options`` go to :func:`aio_pika.connect`. Raises :class:`NoNodeAnswered` naming each
        node's error when none answers. A process that reads deliveries installs
        :func:`worker.broker.content_header.install` first (worker/cli.py, worker/bootstrap.py)."""
        errors: list[Problem] = []
        last: Exception | None = None
        count = len(self.urls)
        for step in range(count):
            index = (self._next + step) % count
            url = self.urls[index]
            try:
                connection: aio_pika.abc.AbstractConnection = await aio_pika.connect(
                    url, timeout=self.timeout, **options
                )
            except Exception as exc:  # refused, timed out, authentication or vhost refused
                last = exc
                problem = explain(exc, url)
                errors.append(Problem(f"{redact_url(url)}: {problem}", problem.refusal))
                continue
            # a later reconnect (this node lost, or failing after the connect) starts with the next node
            self._next = (index + 1) % count
            self.current = url
            return connection
        self._next = (self._next + 1) % count
        if count == 1 and last is not None:
            raise last  # one node: its own error, as before there were lists
        raise NoNodeAnswered("no RabbitMQ node answered: " + "; ".join(errors), errors)


async def connect_any(
    value: str, timeout: float = NODE_CONNECT_TIMEOUT
) -> tuple[aio_pika.abc.AbstractConnection, str]:
    """A connection to the first listed node that answers, and that node's URL (for the operator commands,
    which need one broker connection and name the node they used)."""
    nodes = Nodes.from_setting(value, timeout)
    connection = await nodes.connect()
    assert nodes.current is not None
    return connection, nodes.current


async def first_answering(value: str, timeout: float = NODE_CONNECT_TIMEOUT) -> str:
    """The URL of the first listed node that answers (the connection made to find out is closed)."""
    connection, url = await connect_any(value, timeout)
    await connection.close()
    return url
