"""``worker``'s commands as a table: each command has its runner, and what it needs of its settings refuses
it in one line, with its exit code, before it reaches anything."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pytest

from tests.support.commands import run_timed
from worker.cli import RUNNERS, _parser

REPO = Path(__file__).resolve().parents[2]
#: an address nothing answers at: a command that got past its refusal would fail otherwise, and later
NOWHERE = {
    "LTM_POSTGRES_DSN": "postgresql://ltm@127.0.0.1:9/ltm",
    "LTM_RABBITMQ_URL": "amqp://guest:guest@127.0.0.1:9/",
    "LTM_REDIS_URL": "redis://127.0.0.1:9/0",
}


def worker(*args: str, **env: str) -> tuple[int, str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LTM_")}
    done, _ = run_timed(
        [sys.executable, "-m", "worker", *args], cwd=REPO, env={**clean, **NOWHERE, **env}, timeout=60
    )
    return done.returncode, done.stdout, done.stderr


def test_every_command_the_parser_knows_has_a_runner_and_no_other() -> None:
    [commands] = [a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)]
    assert set(commands.choices) == set(RUNNERS)


@pytest.mark.parametrize(
    ("args", "env", "code", "said"),
    [
        (
            ("shards",),
            {"LTM_POSTGRES_DSN": "mysql://ltm@127.0.0.1/ltm"},
            1,
            "worker shards: LTM_POSTGRES_DSN is not a valid connection URL",
        ),
        (
            ("demo", "send"),
            {"LTM_RABBITMQ_URL": "http://127.0.0.1/"},
            2,
            "worker demo: LTM_RABBITMQ_URL is not a valid connection URL",
        ),
        (
            ("dlq", "list"),
            {"LTM_SHARD_IDENTITY": "requried"},
            2,
            "worker dlq: LTM_SHARD_IDENTITY='requried' is not one of",
        ),
    ],
    ids=["shards-dsn", "demo-url", "dlq-identity"],
)
def test_a_command_is_refused_by_a_setting_it_needs_in_one_line(
    args: tuple[str, ...], env: dict[str, str], code: int, said: str
) -> None:
    returncode, stdout, stderr = worker(*args, **env)
    assert (returncode, stdout) == (code, "")
    assert stderr.startswith(said), stderr
    assert stderr.count("\n") == 1


def test_dlq_names_every_refused_setting_on_its_one_line() -> None:
    returncode, _, stderr = worker("dlq", "list", LTM_RABBITMQ_URL="http://x/", LTM_SHARD_IDENTITY="requried")
    assert returncode == 2
    [line] = stderr.splitlines()
    first, second = line.split("; ", 1)
    assert first.startswith("worker dlq: LTM_RABBITMQ_URL is not a valid connection URL")
    assert second.startswith("LTM_SHARD_IDENTITY='requried' is not one of")


def test_a_setting_a_command_does_not_need_does_not_refuse_it() -> None:
    """`worker shards` reads no identity setting: a misspelt one is not its refusal (it goes on, and fails
    to reach the dependencies it does need)."""
    returncode, _, stderr = worker("shards", LTM_SHARD_IDENTITY="requried")
    assert returncode == 1
    assert "LTM_SHARD_IDENTITY" not in stderr
