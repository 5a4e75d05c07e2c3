"""The container images of the worker's services: one place for their names and tags.

The official images, pinned to a release so a test run today and one next month start the same servers.
Each can be overridden from the environment (a registry mirror, a stand-in image, a newer release):

| image    | default                       | environment variable  |
| -------- | ----------------------------- | --------------------- |
| Postgres | postgres:16.6                 | `LTM_POSTGRES_IMAGE`  |
| RabbitMQ | rabbitmq:3.13.7-management    | `LTM_RABBITMQ_IMAGE`  |
| Redis    | redis:7.4.1                   | `LTM_REDIS_IMAGE`     |
| Python   | python:3.11.11-slim-bookworm  | `LTM_PYTHON_IMAGE`    |

The Python image is the worker image's base: compose passes it to deploy/Dockerfile as the `PYTHON_IMAGE`
build argument.

deploy/compose.yaml carries the same defaults (`${LTM_POSTGRES_IMAGE:-postgres:16.6}`, ...); a test keeps the
two in step.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["IMAGES", "POSTGRES", "PYTHON", "RABBITMQ", "REDIS", "Image", "image"]


@dataclass(frozen=True)
class Image:
    """A service's image: its pinned default and the variable that overrides it."""

    service: str
    default: str
    env_var: str

    def resolve(self, environ: Mapping[str, str] | None = None) -> str:
        """The image to run: the environment's override when set (and not blank), else the default."""
        value = (os.environ if environ is None else environ).get(self.env_var, "").strip()
        return value or self.default


POSTGRES = Image("Postgres", "postgres:16.6", "LTM_POSTGRES_IMAGE")
RABBITMQ = Image("RabbitMQ", "rabbitmq:3.13.7-management", "LTM_RABBITMQ_IMAGE")
REDIS = Image("Redis", "redis:7.4.1", "LTM_REDIS_IMAGE")
PYTHON = Image("Python", "python:3.11.11-slim-bookworm", "LTM_PYTHON_IMAGE")
IMAGES: tuple[Image, ...] = (POSTGRES, RABBITMQ, REDIS, PYTHON)


def image(which: Image, environ: Mapping[str, str] | None = None) -> str:
    """`which.resolve(environ)`, as a function."""
    return which.resolve(environ)
