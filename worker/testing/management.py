"""The RabbitMQ management HTTP API, standard library only: vhosts, users and permissions for test brokers.

Used by the shipped test stack (worker/testing/stack.py) and by the project's own test suite
(tests/services.py), so there is one client. The API is the management plugin's (port 15672 of the
`rabbitmq:*-management` images); nothing here needs `rabbitmqctl` on the machine running the tests.
"""

from __future__ import annotations

import asyncio
import base64
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

__all__ = ["FULL_PERMISSIONS", "HTTP_TIMEOUT", "ManagementApi"]

HTTP_TIMEOUT = 10.0
FULL_PERMISSIONS = {"configure": ".*", "write": ".*", "read": ".*"}

# Management APIs of test brokers are local or in containers: never send them through an HTTP proxy.
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _segment(name: str) -> str:
    return quote(name, safe="")


@dataclass(frozen=True)
class ManagementApi:
    """One broker's management API: `base_url` (`http://host:15672`) and an administrator's credentials."""

    base_url: str
    user: str
    password: str

    @classmethod
    def from_url(cls, url: str, default_user: str, default_password: str) -> ManagementApi:
        """Credentials in the URL win over the defaults (the AMQP user's)."""
        parts = urlsplit(url)
        user = unquote(parts.username) if parts.username else default_user
        password = unquote(parts.password) if parts.password is not None else default_password
        base = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2])).rstrip("/")
        return cls(base, user, password)

    # the raw call

    def call(self, method: str, path: str, body: object | None = None, timeout: float = HTTP_TIMEOUT) -> Any:
        """`method` on `/api{path}`; the decoded JSON answer (None when empty). HTTP errors raise
        `urllib.error.HTTPError`, an unreachable API `OSError`/`URLError`."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.base_url}/api{path}", data=data, method=method)
        token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        with _NO_PROXY.open(request, timeout=timeout) as response:
            payload = response.read()
        return json.loads(payload) if payload else None

    def answers(self) -> bool:
        """Whether the API is there at all (any HTTP answer counts; errors show up when it is used)."""
        try:
            self.call("GET", "/overview", timeout=5.0)
        except urllib.error.HTTPError:
            return True
        except (OSError, urllib.error.URLError):
            return False
        return True

    # vhosts, users, permissions (blocking)

    def put_vhost(self, vhost: str) -> None:
        self.call("PUT", f"/vhosts/{_segment(vhost)}", {})

    def delete_vhost(self, vhost: str) -> None:
        """Delete `vhost` and everything in it; a missing vhost is fine."""
        self._delete(f"/vhosts/{_segment(vhost)}")

    def put_user(self, user: str, password: str, tags: str = "") -> None:
        self.call("PUT", f"/users/{_segment(user)}", {"password": password, "tags": tags})

    def delete_user(self, user: str) -> None:
        """Delete `user`; a missing user is fine."""
        self._delete(f"/users/{_segment(user)}")

    def set_permissions(self, vhost: str, user: str, permissions: dict[str, str]) -> None:
        """`configure`, `write` and `read` patterns of `user` on `vhost`."""
        self.call("PUT", f"/permissions/{_segment(vhost)}/{_segment(user)}", permissions)

    def set_topic_permissions(self, vhost: str, user: str, exchange: str, write: str, read: str) -> None:
        """The routing keys `user` may publish (`write`) and bind (`read`) on topic `exchange`."""
        body = {"exchange": exchange, "write": write, "read": read}
        self.call("PUT", f"/topic-permissions/{_segment(vhost)}/{_segment(user)}", body)

    def set_policy(self, vhost: str, name: str, pattern: str, definition: dict[str, Any]) -> None:
        """A queue policy ``name`` on ``vhost`` (e.g. ``max-length`` for the queues ``pattern`` matches)."""
        body = {"pattern": pattern, "definition": definition, "apply-to": "queues", "priority": 0}
        self.call("PUT", f"/policies/{_segment(vhost)}/{_segment(name)}", body)

    async def policy(self, vhost: str, name: str, pattern: str, definition: dict[str, Any]) -> None:
        """:meth:`set_policy` for event-loop callers."""
        await asyncio.to_thread(self.set_policy, vhost, name, pattern, definition)

    async def queue_policy(self, vhost: str, queue: str) -> str | None:
        """The policy applied to ``queue`` (None: no such queue, or no policy), as the broker last reported it
        (its statistics lag a few seconds)."""
        found = await asyncio.to_thread(self.queue, vhost, queue)
        policy = (found or {}).get("policy")
        return str(policy) if policy else None

    def exchanges(self, vhost: str) -> set[str]:
        """The names of the exchanges of `vhost` (the default exchange's empty name left out)."""
        return {row["name"] for row in self.call("GET", f"/exchanges/{_segment(vhost)}") if row["name"]}

    def queue(self, vhost: str, name: str) -> dict[str, Any] | None:
        """The queue's state (`consumers`, `messages`, ...), None when it does not exist."""
        try:
            answer: dict[str, Any] = self.call("GET", f"/queues/{_segment(vhost)}/{_segment(name)}")
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return None
            raise
        return answer

    def delete_queue(self, vhost: str, name: str) -> None:
        """Delete the queue; a missing one is fine."""
        self._delete(f"/queues/{_segment(vhost)}/{_segment(name)}")

    def _delete(self, path: str) -> None:
        try:
            self.call("DELETE", path)
        except urllib.error.HTTPError as error:
            if error.code != 404:
                raise

    # per-test vhosts (async, for event-loop callers)

    async def create(self, vhost: str, user: str) -> None:
        """PUT the vhost, then full permissions on it for `user`."""
        await asyncio.to_thread(self.put_vhost, vhost)
        await asyncio.to_thread(self.set_permissions, vhost, user, FULL_PERMISSIONS)

    async def delete(self, vhost: str) -> None:
        """DELETE the vhost; 404 means it is already gone."""
        await asyncio.to_thread(self.delete_vhost, vhost)
