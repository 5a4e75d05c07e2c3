"""Where a test container's ports are published and where they answer from here.

**Ports** are published on 127.0.0.1 when the engine runs on this machine (testcontainers reaches it at a
loopback address): a stock engine would publish them on every interface of the host. A remote engine, or tests
inside a container, need the engine's default instead, which they get; `LTM_STACK_PUBLISH_ADDRESS` decides
when set (an address, or empty for the engine's default).
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Mapping
from typing import Any

__all__ = ["PUBLISH_ADDRESS_ENV", "bound_address", "publish_address", "published_host"]

PUBLISH_ADDRESS_ENV = "LTM_STACK_PUBLISH_ADDRESS"


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def publish_address(environ: Mapping[str, str] | None = None) -> str:
    """The host address to publish the containers' ports on: `LTM_STACK_PUBLISH_ADDRESS` when set (empty: the
    engine's default); else 127.0.0.1 when testcontainers reaches the engine at a loopback address (TC_HOST,
    TESTCONTAINERS_HOST_OVERRIDE, else its Docker client's host, which may also be an address of this
    machine's own interfaces), else the engine's default (every interface of the engine's host, where a
    remote engine's ports, or those seen from a container, are reached)."""
    env = os.environ if environ is None else environ
    if PUBLISH_ADDRESS_ENV in env:
        return env[PUBLISH_ADDRESS_ENV].strip()
    host = env.get("TC_HOST") or env.get("TESTCONTAINERS_HOST_OVERRIDE") or ""
    if host:  # an override names where the ports must answer
        return "127.0.0.1" if _is_loopback(host) else ""
    try:
        from testcontainers.core.docker_client import DockerClient

        host = str(DockerClient().host())
    except Exception:
        return ""
    return "127.0.0.1" if _is_loopback(host) or _is_own_address(host) else ""


def _is_own_address(host: str) -> bool:
    """Whether `host` is an address of this machine's own interfaces (a socket binds to it). testcontainers,
    inside a container, guesses the engine's bridge gateway for its host; when that gateway is ours (the
    engine runs in this network namespace, as a CI container's own dockerd does), its loopback is ours too."""
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((str(address), 0))
        except OSError:
            return False
    return True


def bound_address(ports: dict[str, list[dict[str, str]] | None]) -> str | None:
    """The one IPv4 address an engine published `ports` on (dockerd's `--ip`); None: wildcards or several."""
    addresses = {
        binding.get("HostIp", "")
        for bindings in ports.values()
        for binding in bindings or []
        if binding.get("HostIp", "") not in {"", "0.0.0.0"} and ":" not in binding.get("HostIp", "")
    }
    return addresses.pop() if len(addresses) == 1 else None


def published_host(handle: Any) -> str:
    """Where the container's published ports answer from here.

    TC_HOST or TESTCONTAINERS_HOST_OVERRIDE, when set, decides (testcontainers reads them). Otherwise
    ports the engine published on one address (`dockerd --ip 127.0.0.1`) are reached at that address:
    testcontainers' own guess is a gateway wherever it thinks it runs in a container (/.dockerenv), and a
    loopback-bound port does not answer there.
    """
    guessed = str(handle.get_container_host_ip())
    if os.environ.get("TC_HOST") or os.environ.get("TESTCONTAINERS_HOST_OVERRIDE"):
        return guessed
    try:
        wrapped = handle.get_wrapped_container()
        wrapped.reload()
        bound = bound_address(wrapped.attrs["NetworkSettings"]["Ports"] or {})
    except Exception:
        bound = None
    return bound or guessed
