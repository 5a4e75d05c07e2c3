"""Settings that fall back: every one is recorded, with what it takes, and nothing valid is."""

from __future__ import annotations

import pytest

from worker.config import DEFAULT_HTTP_HOST, Settings, expected_value, load_settings


@pytest.mark.parametrize(
    ("raw", "port", "fell_back"),
    [
        ("", 0, False),
        ("0", 0, False),
        ("  ", 0, False),
        ("8080", 8080, False),
        (" 9109 ", 9109, False),
        ("65535", 65535, False),
        ("65536", 0, True),
        ("notaport", 0, True),
        ("-1", 0, True),
        ("80abc", 0, True),
        ("²", 0, True),
    ],
)
def test_ltm_http_port_is_a_port_or_falls_back_to_off(raw: str, port: int, fell_back: bool) -> None:
    settings = load_settings({"LTM_HTTP_PORT": raw})

    assert settings.http_port == port
    assert settings.fallbacks == ((("LTM_HTTP_PORT", raw, 0),) if fell_back else ())


@pytest.mark.parametrize(
    ("var", "raw", "field", "value", "default"),
    [
        ("LTM_LOG_FORMAT", "xml", "log_format", "auto", "auto"),
        ("LTM_LOG_FORMAT", " JSON ", "log_format", "json", None),
        ("LTM_LOG_FORMAT", "", "log_format", "auto", None),
        ("LTM_LOG_LEVEL", "verbose", "log_level", "info", "info"),
        ("LTM_LOG_LEVEL", "Debug", "log_level", "debug", None),
        ("LTM_LOG_LEVEL", "warning", "log_level", "warning", None),
        ("LTM_TRACING", "jaeger", "tracing", "off", "off"),
        ("MAX_SERVER_MEMORIES", "abc", "limits", None, 100),
        ("LTM_PREFETCH", "0", "prefetch", Settings().prefetch, Settings().prefetch),
    ],
)
def test_a_value_a_setting_does_not_take_falls_back_with_a_record(
    var: str, raw: str, field: str, value: object, default: object
) -> None:
    settings = load_settings({var: raw})

    if value is not None:
        assert getattr(settings, field) == value
    assert settings.fallbacks == (((var, raw, default),) if default is not None else ())


def test_every_fallback_is_recorded_and_says_what_the_setting_takes() -> None:
    env = {
        "MAX_MEMORY_LENGTH": "long",
        "LTM_HTTP_PORT": "notaport",
        "LTM_LOG_FORMAT": "xml",
        "LTM_LOG_LEVEL": "verbose",
        "LTM_TRACING": "jaeger",
    }
    settings = load_settings(env)

    assert {var: raw for var, raw, _ in settings.fallbacks} == env
    assert expected_value("LTM_HTTP_PORT") == "a port number 0..65535 (0 or empty: off)"
    assert expected_value("LTM_LOG_FORMAT") == "one of auto, json, console"
    assert expected_value("LTM_LOG_LEVEL") == "one of debug, info, warning, error"
    assert expected_value("MAX_MEMORY_LENGTH") == "an integer > 0"


@pytest.mark.parametrize(
    ("raw", "host"), [(None, DEFAULT_HTTP_HOST), ("", DEFAULT_HTTP_HOST), ("0.0.0.0", "0.0.0.0")]
)
def test_the_probe_endpoint_listens_on_this_host_only_unless_told(raw: str | None, host: str) -> None:
    settings = load_settings({} if raw is None else {"LTM_HTTP_HOST": raw})

    assert (settings.http_host, settings.fallbacks) == (host, ())
    assert DEFAULT_HTTP_HOST == "127.0.0.1"
