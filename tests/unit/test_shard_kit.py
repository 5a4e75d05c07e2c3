"""The Python shard kit's parts that need no broker: the duplicate filter's cap and age, the user of a URL,
the routing keys, the refusal sentences, the errors' words (the TypeScript kit's), and the package's names."""

from __future__ import annotations

import aiormq.exceptions

import contracts.shard
from contracts.shard import (
    LtmBacklogFullError,
    LtmIdentityError,
    LtmPublishRejectedError,
    LtmTimeoutError,
    shard_work_queue,
    tool_routing_keys,
    user_of_url,
)
from contracts.shard.client import SeenSet, refusal_of


def test_the_duplicate_filter_forgets_the_oldest_and_the_expired() -> None:
    now = [0.0]
    seen: SeenSet[str] = SeenSet(2, 10.0, clock=lambda: now[0])
    seen.set("a", "1")
    seen.set("b", "2")
    seen.set("c", "3")  # over the cap: a goes
    assert ("a" in seen, seen.get("b"), seen.get("c")) == (False, "2", "3")
    now[0] = 10.0
    assert "b" not in seen
    seen.set("d", "4")
    assert len(seen) == 1


def test_the_user_of_a_url_is_what_aio_pika_logs_in_as() -> None:
    assert user_of_url("amqp://shard-3:pw@rabbitmq:5672/") == "shard-3"
    assert user_of_url("amqp://shard%2D3:pw@rabbitmq/") == "shard-3"
    assert user_of_url("amqp://rabbitmq:5672/") == "guest"


def test_routing_keys_and_the_shards_own_queue() -> None:
    assert tool_routing_keys("create_long_term_memory", 3) == (
        "tool.create_long_term_memory",
        "tool.create_long_term_memory.shard.3",
    )
    assert shard_work_queue(12) == "ltm.create_memory.shard.12"


def test_refusals_are_said_in_plain_words() -> None:
    login = aiormq.exceptions.ProbableAuthenticationError("ACCESS_REFUSED - Login was refused")
    assert refusal_of(login, "amqp://bot:x@h/") == (
        'RabbitMQ refused the login of user "bot" (ACCESS_REFUSED): check the user and password in the URL '
        "(ACCESS_REFUSED - Login was refused)"
    )
    vhost = Exception("Expected one of ['Connection.OpenOk'], got <Connection.Close object at 0x1>")
    assert refusal_of(vhost, "amqp://bot:x@h/ltm%2Dx") == (
        'RabbitMQ refused vhost "ltm-x" to user "bot": the vhost does not exist or the user has no '
        "permissions on it (rabbitmqctl list_vhosts; rabbitmqctl list_user_permissions bot)"
    )
    assert refusal_of(ConnectionRefusedError(111, "refused"), "amqp://h/") is None


def test_the_errors_say_what_to_do_and_are_caught_as_their_kinds() -> None:
    full = LtmBacklogFullError("e", 3, "tool.x.shard.3", "ltm.create_memory.shard.3", True)
    assert isinstance(full, LtmPublishRejectedError)
    assert full.code == "backlog_full"
    assert "slow down" in str(full).lower()
    assert "worker check" in str(full)
    assert isinstance(LtmTimeoutError("e", "c", 1.5), TimeoutError)
    identity = LtmIdentityError("e", "shard-4", "PRECONDITION_FAILED - user_id property set to 'shard-4'")
    assert identity.code == "identity_refused"
    assert "user_id option" in str(identity)


def test_every_exported_name_is_there() -> None:
    missing = [name for name in contracts.shard.__all__ if not hasattr(contracts.shard, name)]
    assert missing == []
    assert {"LtmClient", "InvalidationSubscriber", "invalidation_id_of"} <= set(contracts.shard.__all__)
