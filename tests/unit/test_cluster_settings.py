"""Several RabbitMQ nodes in one setting, passwords masked wherever a setting is shown, pooler settings."""

from __future__ import annotations

import pytest

from worker.broker.urls import split_urls
from worker.config import load_settings
from worker.redact import redact_url


def test_a_comma_separated_list_is_split_in_order() -> None:
    value = " amqp://w:p@rmq-1:5672/ltm , amqp://w:p@rmq-2:5672/ltm,amqp://w:p@rmq-3:5672/ltm,"
    assert split_urls(value) == [
        "amqp://w:p@rmq-1:5672/ltm",
        "amqp://w:p@rmq-2:5672/ltm",
        "amqp://w:p@rmq-3:5672/ltm",
    ]
    assert split_urls("amqp://guest:guest@127.0.0.1:5672/") == ["amqp://guest:guest@127.0.0.1:5672/"]


def test_an_empty_list_is_refused() -> None:
    with pytest.raises(ValueError, match="LTM_RABBITMQ_URL"):
        split_urls(" , ")


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("amqp://w:s3cret@a/v,amqp://w:s3cret@b/v", "amqp://w:***@a/v,amqp://w:***@b/v"),
        ("amqp://a/v,amqp://w:s3cret@b/v", "amqp://a/v,amqp://w:***@b/v"),
        (
            "postgresql://ltm:s3cret@pg-a:5432,pg-b:5432/bot?target_session_attrs=read-write",
            "postgresql://ltm:***@pg-a:5432,pg-b:5432/bot?target_session_attrs=read-write",
        ),
        ("host=pg-a,pg-b password=s3cret dbname=bot", "host=pg-a,pg-b password=*** dbname=bot"),
        ("host=pg-a password='s3 cret' user=ltm", "host=pg-a password=*** user=ltm"),
    ],
)
def test_every_password_is_masked(value: str, shown: str) -> None:
    assert redact_url(value) == shown


@pytest.mark.parametrize(
    ("raw", "size", "fell_back"),
    [(None, 0, False), ("", 0, False), ("0", 0, False), ("100", 100, False), ("-1", 0, True), ("x", 0, True)],
)
def test_the_statement_cache_is_off_unless_set(raw: str | None, size: int, fell_back: bool) -> None:
    env = {} if raw is None else {"LTM_POSTGRES_STATEMENT_CACHE_SIZE": raw}
    settings = load_settings(env)
    assert settings.postgres_statement_cache_size == size
    assert any(var == "LTM_POSTGRES_STATEMENT_CACHE_SIZE" for var, _, _ in settings.fallbacks) is fell_back
