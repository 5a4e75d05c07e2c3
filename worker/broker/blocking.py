"""RabbitMQ blocking the worker's connection.

When a node raises a memory or disk alarm it stops reading from every connection that publishes, after
telling it so (AMQP ``connection.blocked`` with the reason, then ``connection.unblocked`` when the alarm
clears). Nothing the worker sends in between is read: result publishes, their confirms and the acks all
wait. :class:`BrokerBlock` makes that visible (a WARNING line at the start and the end, the
``ltm_rabbitmq_blocked`` gauge and ``/readyz`` through ``on_change``) and keeps a held publish from
counting as a failed one: the publish timeout (10 s) only runs while the connection is not blocked, up to
:data:`BLOCKED_PUBLISH_DEADLINE` in all. Before, a result held through a 10 s alarm timed out, its event was
retried, and the shard got the held result and then the retry's: the event answered twice.

aiormq reads the two frames but exposes them only as log lines; :func:`watch` wraps its handlers on one
connection object.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import aiormq
import aiormq.abc
import structlog
from pamqp import commands as spec

log = structlog.get_logger("worker")

#: the longest a publish may wait in all while the broker blocks the connection: a longer alarm is an
#: outage, and the publish then fails like any other (the event is retried or dead-lettered)
BLOCKED_PUBLISH_DEADLINE = 120.0

#: aiormq's (name-mangled) handlers of connection.blocked and connection.unblocked
_HANDLERS = ("_Connection__handle_connection_blocked", "_Connection__handle_connection_unblocked")

#: aiormq's own lines for the two frames, which the worker's lines replace (one line per change)
_AIORMQ_LINES = ("Connection %r was blocked by: %r", "Connection %r was unblocked")

_BLOCKS: weakref.WeakKeyDictionary[aiormq.Connection, BrokerBlock] = weakref.WeakKeyDictionary()


@dataclass(eq=False)
class _Deadline:
    timeout: float
    cap: float
    scope: asyncio.Timeout | None = field(default=None)


class BrokerBlock:
    """Whether RabbitMQ blocks one connection, and the deadlines of the publishes made on it."""

    def __init__(self, on_change: Callable[[str | None], None] | None = None) -> None:
        #: called with the reason when the block starts, with None when it ends
        self._on_change = on_change
        self.reason: str | None = None
        self._since = 0.0
        self._deadlines: set[_Deadline] = set()

    @property
    def blocked(self) -> bool:
        return self.reason is not None

    def start(self, reason: str) -> None:
        if self.blocked:
            return
        self.reason = reason or "unknown"
        self._since = time.monotonic()
        log.warning(
            "rabbitmq blocked the connection",
            reason=self.reason,
            waiting_publishes=len(self._deadlines),
            publish_deadline_s=BLOCKED_PUBLISH_DEADLINE,
        )
        for deadline in self._deadlines:
            _reschedule(deadline, deadline.cap)
        if self._on_change is not None:
            self._on_change(self.reason)

    def end(self, how: str = "unblocked") -> None:
        """The block is over: the broker unblocked the connection, or the connection is gone."""
        if not self.blocked:
            return
        log.warning(
            "rabbitmq unblocked the connection",
            reason=self.reason,
            blocked_s=round(time.monotonic() - self._since, 2),
            ended=how,
        )
        self.reason = None
        now = asyncio.get_running_loop().time()
        for deadline in self._deadlines:
            _reschedule(deadline, min(deadline.cap, now + deadline.timeout))
        if self._on_change is not None:
            self._on_change(None)

    @contextlib.asynccontextmanager
    async def deadline(self, timeout: float) -> AsyncIterator[None]:
        """A timeout of ``timeout`` seconds that does not run while the connection is blocked, and ends
        :data:`BLOCKED_PUBLISH_DEADLINE` after the start in any case; TimeoutError when it expires."""
        now = asyncio.get_running_loop().time()
        entry = _Deadline(timeout, now + max(timeout, BLOCKED_PUBLISH_DEADLINE))
        async with asyncio.timeout_at(entry.cap if self.blocked else now + timeout) as scope:
            entry.scope = scope
            self._deadlines.add(entry)
            try:
                yield
            finally:
                self._deadlines.discard(entry)


def _reschedule(deadline: _Deadline, when: float) -> None:
    if deadline.scope is None or deadline.scope.expired():
        return
    with contextlib.suppress(RuntimeError):  # already expiring: the publish times out as it was going to
        deadline.scope.reschedule(when)


def watch(connection: aiormq.abc.AbstractConnection, block: BrokerBlock) -> bool:
    """Tell ``block`` when the broker blocks and unblocks ``connection``; publishes on its channels then
    take their deadline from it (:func:`publish_deadline`). False (and a warning) when this aiormq's
    handlers are not where they were: the worker then runs as before, blind to blocks."""
    blocked_name, unblocked_name = _HANDLERS
    on_blocked, on_unblocked = (
        getattr(connection, blocked_name, None),
        getattr(connection, unblocked_name, None),
    )
    if not isinstance(connection, aiormq.Connection) or on_blocked is None or on_unblocked is None:
        log.warning("cannot follow connection.blocked on this aiormq version; publishes time out as before")
        return False

    async def blocked(frame: spec.Connection.Blocked) -> None:
        await on_blocked(frame)
        block.start(str(frame.reason or ""))

    async def unblocked(frame: spec.Connection.Unblocked) -> None:
        await on_unblocked(frame)
        block.end()

    _quiet_aiormq()
    setattr(connection, blocked_name, blocked)
    setattr(connection, unblocked_name, unblocked)
    _BLOCKS[connection] = block
    return True


def publish_deadline(
    connection: aiormq.abc.AbstractConnection, timeout: float
) -> contextlib.AbstractAsyncContextManager[Any]:
    """The deadline of a publish on ``connection``: ``timeout`` seconds, the block's time excluded on a
    watched connection (:meth:`BrokerBlock.deadline`), plain ``asyncio.timeout`` otherwise."""
    block = _BLOCKS.get(connection) if isinstance(connection, aiormq.Connection) else None
    return asyncio.timeout(timeout) if block is None else block.deadline(timeout)


class _DropAiormqBlockLines(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg not in _AIORMQ_LINES


def _quiet_aiormq() -> None:
    logger = logging.getLogger("aiormq.connection")
    if not any(isinstance(f, _DropAiormqBlockLines) for f in logger.filters):
        logger.addFilter(_DropAiormqBlockLines())
