"""RabbitMQ users of a test's own on its vhost (a shard's user with a shard's grants, an operator), made
through the management API when the session's broker has one, else with this machine's ``rabbitmqctl``, and
deleted after the test. Users are the broker's, not the vhost's: their names carry a random prefix."""

from __future__ import annotations

import contextlib
import secrets
import shutil
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import quote, unquote, urlsplit

import pytest

from tests.services import ManagementApi, Services, is_this_machine
from tests.support.commands import run_command
from worker.testing.management import FULL_PERMISSIONS
from worker.testing.permissions import shard_permissions, shard_topic_permissions

CTL_TIMEOUT = 60.0


@dataclass(frozen=True)
class Grants:
    """What a user may do on the test's vhost: ``configure``/``write``/``read`` and its topic permissions."""

    permissions: Mapping[str, str] = field(default_factory=lambda: dict(FULL_PERMISSIONS))
    topics: Sequence[Mapping[str, str]] = ()

    @classmethod
    def shard(cls, shard_id: int) -> Grants:
        """A shard's user's grants, as deploy/rabbitmq/shard_users.py makes them (CONTRACT.md section 2)."""
        return cls(shard_permissions(shard_id), shard_topic_permissions(shard_id))


@dataclass(frozen=True)
class Users:
    """The users made for a test: their names by role, and the AMQP URL of each on the test's vhost."""

    prefix: str
    urls: dict[str, str]

    def name(self, role: str) -> str:
        return f"{self.prefix}-{role}"

    def url(self, role: str) -> str:
        return self.urls[self.name(role)]


@contextlib.asynccontextmanager
async def rabbitmq_users(services: Services, url: str, roles: Mapping[str, Grants]) -> AsyncIterator[Users]:
    """Make a user per role (``<prefix>-<role>``, e.g. ``ltm3f2a-shard-0``) with its grants on the vhost of
    ``url``, each with a password of its own; delete them all after."""
    prefix = f"ltm{secrets.token_hex(3)}"
    parts = urlsplit(url)
    vhost = unquote(parts.path[1:])
    host = f"{parts.hostname}:{parts.port or 5672}"
    admin = services.broker_admin()
    made: list[str] = []
    urls: dict[str, str] = {}
    try:
        for role, grants in roles.items():
            user, password = f"{prefix}-{role}", secrets.token_hex(12)
            made.append(user)
            if isinstance(admin, ManagementApi):
                admin.put_user(user, password)
                admin.set_permissions(vhost, user, dict(grants.permissions))
                for topic in grants.topics:
                    admin.set_topic_permissions(vhost, user, topic["exchange"], topic["write"], topic["read"])
            else:
                ctl = _rabbitmqctl(url)
                p = grants.permissions
                await _ctl(ctl, "add_user", user, password)
                await _ctl(ctl, "set_permissions", "-p", vhost, user, p["configure"], p["write"], p["read"])
                for topic in grants.topics:
                    await _ctl(
                        ctl,
                        *("set_topic_permissions", "-p", vhost, user),
                        *(topic["exchange"], topic["write"], topic["read"]),
                    )
            urls[user] = parts._replace(netloc=f"{quote(user, safe='')}:{password}@{host}").geturl()
        yield Users(prefix, urls)
    finally:
        for user in made:
            with contextlib.suppress(Exception):
                if isinstance(admin, ManagementApi):
                    admin.delete_user(user)
                else:
                    await _ctl(_rabbitmqctl(url), "delete_user", user)


def _rabbitmqctl(url: str) -> str:
    ctl = shutil.which("rabbitmqctl")
    if ctl is None or not is_this_machine(urlsplit(url).hostname or ""):
        pytest.fail("making RabbitMQ users needs the management API or rabbitmqctl on the broker's machine")
    return ctl


async def _ctl(ctl: str, *args: str) -> None:
    code, text = await run_command(ctl, "-q", *args, timeout=CTL_TIMEOUT)
    if code != 0:
        raise RuntimeError(f"rabbitmqctl {args[0]} exited {code}: {text}")
