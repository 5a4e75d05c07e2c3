"""worker.testing without an engine: it imports without testcontainers, its grants are the deploy file's, the
events it builds are the contract's, and the pytest header says where each service comes from."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

from contracts.models import ToolCallEvent
from tests.services import describe_sources
from worker.testing import containers, stack
from worker.testing.seed import TryOut, discord_id

REPO = Path(__file__).resolve().parents[2]
DEFINITIONS = REPO / "deploy" / "rabbitmq" / "definitions.json"


def test_the_plugin_and_the_stack_import_without_testcontainers_or_docker() -> None:
    code = (
        "import sys\n"
        "import worker.testing.pytest_plugin, worker.testing.stack, worker.testing.containers\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in {'testcontainers', 'docker'})\n"
        "print(loaded)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"


def _grants(user: str) -> tuple[dict[str, str], list[dict[str, str]]]:
    definitions = json.loads(DEFINITIONS.read_text())
    (permission,) = [p for p in definitions["permissions"] if p["user"] == user]
    topics = [t for t in definitions["topic_permissions"] if t["user"] == user]
    strip = ("user", "vhost")
    return (
        {k: v for k, v in permission.items() if k not in strip},
        [{k: v for k, v in t.items() if k not in strip} for t in topics],
    )


def test_the_stack_grants_the_users_of_the_deploy_definitions() -> None:
    permissions, topics = _grants("worker")
    assert permissions == stack.WORKER_PERMISSIONS
    assert topics == list(stack.WORKER_TOPIC_PERMISSIONS)
    for shard_id in (0, 1):
        permissions, topics = _grants(f"shard-{shard_id}")
        assert permissions == stack.shard_permissions(shard_id)
        assert topics == stack.shard_topic_permissions(shard_id)


def test_the_stack_waits_for_the_contract_exchanges() -> None:
    definitions = json.loads(DEFINITIONS.read_text())
    assert set(stack.EXCHANGES) == {e["name"] for e in definitions["exchanges"]}


def test_both_stacks_name_their_database_as_deploy_does() -> None:
    typescript = (REPO / "contracts/typescript/src/testing/stack.ts").read_text()
    named = re.search(r'^const DATABASE = "([a-z_]+)";$', typescript, re.M)
    compose = (REPO / "deploy/compose.yaml").read_text()
    deployed = re.search(r"^ *LTM_POSTGRES_DSN: postgresql://[^/\s]+/([a-z_]+)\?", compose, re.M)
    assert named is not None
    assert deployed is not None
    assert named[1] == deployed[1] == stack.DATABASE == "tomoribot"


def test_a_try_out_event_is_a_contract_event() -> None:
    try_out = TryOut(1, discord_id(), 2, 3, 4, discord_id(), discord_id(), discord_id(), 5, discord_id())
    body = try_out.event({"memory_content": "{user} likes dogs", "memory_scope": "server_wide"}, shard_id=7)
    parsed = ToolCallEvent.model_validate_json(json.dumps(body))
    assert parsed.shard_id == 7
    assert parsed.context.guild_disc_id == try_out.guild_disc_id
    assert parsed.context.persona_id == 2
    assert len({discord_id() for _ in range(50)}) == 50
    assert all(len(discord_id()) == 19 for _ in range(50))


def test_a_container_start_is_bounded_under_a_minute_by_default() -> None:
    assert containers.start_timeout({}) == containers.DEFAULT_START_TIMEOUT < 60
    assert containers.start_timeout({containers.START_TIMEOUT_ENV: "7.5"}) == 7.5
    assert (
        containers.start_timeout({containers.START_TIMEOUT_ENV: "soon"}) == containers.DEFAULT_START_TIMEOUT
    )
    assert stack.stack_timeout({stack.TIMEOUT_ENV: "30"}) == 30.0


def test_the_header_says_where_each_service_comes_from_without_starting_anything() -> None:
    pings: list[bool] = []

    def engine() -> bool:
        pings.append(True)
        return True

    environ = {
        "LTM_TEST_POSTGRES_DSN": "postgresql://postgres:s3cret@db:5432/postgres",
        "LTM_RABBITMQ_IMAGE": "mirror.example/rabbitmq:3.13.7-management",
    }
    lines = describe_sources(environ, engine)
    assert lines[0] == "Postgres: postgresql://postgres:***@db:5432/postgres (from LTM_TEST_POSTGRES_DSN)"
    assert lines[1].startswith("RabbitMQ: container, image mirror.example/rabbitmq:3.13.7-management ")
    assert "LTM_RABBITMQ_IMAGE overrides it" in lines[1]
    assert lines[2].startswith("Redis: container, image redis:7.4.1 ")
    assert pings == [True]  # asked once, and only because a service had no URL

    every_url = {
        "LTM_TEST_POSTGRES_DSN": "postgresql://db/postgres",
        "LTM_TEST_RABBITMQ_URL": "amqp://mq/",
        "LTM_TEST_REDIS_URL": "redis://cache/0",
    }
    assert len(describe_sources(every_url, engine)) == 3
    assert pings == [True]

    local = describe_sources({}, lambda: False)
    assert local[2] == (
        "Redis: local default redis://127.0.0.1:6379/0 (LTM_TEST_REDIS_URL not set, no Docker engine answers)"
    )


def _acl_rules(text: str) -> dict[str, str]:
    """`user NAME on <password> RULES` lines of an ACL file: NAME -> RULES."""
    rules = {}
    for line in text.splitlines():
        words = line.split(maxsplit=4)
        if len(words) == 5 and words[0] == "user" and words[2] == "on":
            rules[words[1]] = words[4]
    return rules


def test_the_redis_users_are_those_of_deploy_and_the_k8s_secret() -> None:
    """deploy/redis/users.acl (compose), the Kubernetes Secret's users.acl and the stacks' users: one set of
    rules (security review 4, N10). The TypeScript stack's are checked against the file by its own test."""
    acl = (REPO / "deploy" / "redis" / "users.acl").read_text()
    assert acl.splitlines()[0] == "user default off"
    assert _acl_rules(acl) == stack.REDIS_USER_RULES
    secrets_file = (REPO / "deploy" / "k8s" / "secret.yaml").read_text()
    (users_acl,) = [
        document["stringData"]["users.acl"]
        for document in yaml.safe_load_all(secrets_file)
        if document["metadata"]["name"] == "ltm-redis-users"
    ]
    assert _acl_rules(users_acl) == stack.REDIS_USER_RULES
    assert "user default off" in users_acl
    # the worker publishes, a shard subscribes; neither has keys
    assert "+publish" in stack.REDIS_USER_RULES["worker"]
    assert "+subscribe" not in stack.REDIS_USER_RULES["worker"]
    assert "+publish" not in stack.REDIS_USER_RULES["shard"]
    assert all("resetkeys -@all" in rules for rules in stack.REDIS_USER_RULES.values())


def test_the_redis_command_names_hashed_passwords_only() -> None:
    command = containers.redis_command({"worker": ("s3cret-w", "resetchannels -@all +ping")})
    assert "s3cret-w" not in " ".join(command)
    digest = hashlib.sha256(b"s3cret-w").hexdigest()
    assert command[-7:] == ["--user", "worker", "on", f"#{digest}", "resetchannels", "-@all", "+ping"]
    at = command.index("default")
    assert command[at - 1 : at + 2] == ["--user", "default", "off"]


def test_ports_are_published_on_loopback_for_an_engine_on_this_machine() -> None:
    env = containers.PUBLISH_ADDRESS_ENV
    assert containers.publish_address({env: "10.0.0.5"}) == "10.0.0.5"
    assert containers.publish_address({env: ""}) == ""  # the engine's default, on purpose
    assert containers.publish_address({"TC_HOST": "localhost"}) == "127.0.0.1"
    assert containers.publish_address({"TESTCONTAINERS_HOST_OVERRIDE": "127.0.0.1"}) == "127.0.0.1"
    assert containers.publish_address({"TC_HOST": "::1"}) == "127.0.0.1"
    # a remote engine, or the bridge's gateway seen from a container: the engine's default
    assert containers.publish_address({"TC_HOST": "docker.example"}) == ""
    assert containers.publish_address({"TC_HOST": "172.17.0.1"}) == ""


def test_a_guessed_host_counts_as_this_machine_only_when_a_socket_binds_to_it() -> None:
    # testcontainers' guess inside a container is the bridge gateway: ours when this namespace runs the engine
    from worker.testing import ports

    assert ports._is_own_address("127.0.0.1")
    assert not ports._is_own_address("203.0.113.7")  # TEST-NET-3: no interface here has it
    assert not ports._is_own_address("docker.example")
