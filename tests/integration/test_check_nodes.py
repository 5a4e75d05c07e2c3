"""``worker check`` answers "can this worker run?": with several RabbitMQ nodes listed, one that answers is
enough (the worker connects to the first that does), every node that does not is a warning, and
``--all-nodes`` asks for every one. An unreachable node is a closed port on loopback."""

from __future__ import annotations

import json
import re
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.integration.test_cli import worker
from worker.config import env_of
from worker.testing.workers import free_port

pytestmark = pytest.mark.integration

SECRET = "n0de-S3cret"


def closed_node(url: str) -> str:
    """``url`` on a loopback port nobody listens on, with a password that must never be shown."""
    return urlunsplit(urlsplit(url)._replace(netloc=f"ltm:{SECRET}@127.0.0.1:{free_port()}"))


@pytest.fixture
def services(migrated_dsn: str, redis_url: str) -> dict[str, str]:
    return env_of(postgres_dsn=migrated_dsn, redis_url=redis_url)


def test_one_answering_node_is_enough_and_the_others_are_warnings(
    services: dict[str, str], rabbitmq_url: str
) -> None:
    nodes = f"{closed_node(rabbitmq_url)},{rabbitmq_url},{closed_node(rabbitmq_url)}"

    done = worker("check", **services, LTM_RABBITMQ_URL=nodes)

    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert SECRET not in output
    marks = re.findall(r"^(ok|warn|FAIL)\s+rabbitmq\s+(\S+)", done.stdout, re.M)
    assert [mark for mark, _ in marks] == ["warn", "ok", "warn"]
    assert all(target.startswith("amqp://ltm:***@127.0.0.1:") for mark, target in marks if mark == "warn")
    assert "FAIL" not in done.stdout
    assert done.stdout.splitlines()[-1] == (
        "all dependencies work (2 of 3 RabbitMQ nodes did not answer; the worker runs on the others, "
        "--all-nodes fails on it)"
    )

    report = worker("check", "--json", **services, LTM_RABBITMQ_URL=nodes)
    assert report.returncode == 0
    assert SECRET not in report.stdout + report.stderr
    parsed = json.loads(report.stdout)
    assert parsed["ok"] is True
    rabbitmq = parsed["dependencies"]["rabbitmq"]
    assert (rabbitmq["ok"], rabbitmq["problem"]) == (True, None)
    assert [node["ok"] for node in rabbitmq["nodes"]] == [False, True, False]
    assert [w["dependency"] for w in parsed["warnings"]] == ["rabbitmq", "rabbitmq"]
    assert [w["target"] for w in parsed["warnings"]] == [
        node["target"] for node in rabbitmq["nodes"] if not node["ok"]
    ]
    assert all("Connect call failed" in w["problem"] for w in parsed["warnings"])


def test_all_nodes_fails_on_a_node_that_does_not_answer(services: dict[str, str], rabbitmq_url: str) -> None:
    nodes = f"{rabbitmq_url},{closed_node(rabbitmq_url)}"

    done = worker("check", "--all-nodes", **services, LTM_RABBITMQ_URL=nodes)

    assert done.returncode == 1, done.stdout + done.stderr
    assert SECRET not in done.stdout + done.stderr
    assert [mark for mark in re.findall(r"^(ok|warn|FAIL)\s+rabbitmq", done.stdout, re.M)] == ["ok", "FAIL"]
    assert done.stdout.splitlines()[-1] == "not working: rabbitmq"

    report = json.loads(worker("check", "--json", "--all-nodes", **services, LTM_RABBITMQ_URL=nodes).stdout)
    assert (report["ok"], report["warnings"]) == (False, [])
    rabbitmq = report["dependencies"]["rabbitmq"]
    assert rabbitmq["ok"] is False
    assert rabbitmq["problem"].startswith("amqp://ltm:***@127.0.0.1:")

    every = worker("check", "--all-nodes", **services, LTM_RABBITMQ_URL=f"{rabbitmq_url},{rabbitmq_url}")
    assert every.returncode == 0, every.stdout


def test_no_answering_node_fails_either_way(services: dict[str, str], rabbitmq_url: str) -> None:
    nodes = f"{closed_node(rabbitmq_url)},{closed_node(rabbitmq_url)}"
    for flags in ((), ("--all-nodes",)):
        done = worker("check", *flags, **services, LTM_RABBITMQ_URL=nodes)

        assert done.returncode == 1, done.stdout
        assert SECRET not in done.stdout + done.stderr
        assert re.findall(r"^(ok|warn|FAIL)\s+rabbitmq", done.stdout, re.M) == ["FAIL", "FAIL"]
        assert done.stdout.splitlines()[-1] == "not working: rabbitmq"


def test_a_single_node_that_does_not_answer_fails(services: dict[str, str], rabbitmq_url: str) -> None:
    done = worker("check", **services, LTM_RABBITMQ_URL=closed_node(rabbitmq_url))

    assert done.returncode == 1
    assert re.findall(r"^(ok|warn|FAIL)\s+rabbitmq", done.stdout, re.M) == ["FAIL"]
