"""``worker dlq ui``'s guard: the tokens it takes, the names it answers to, what its log never shows."""

from __future__ import annotations

import pytest

from worker.ops.dlq.page.auth import Guard, UiError, host_name, read_token, token_problem, without_token

GOOD = "0123456789abcdef-token"


@pytest.mark.parametrize(
    ("token", "problem"),
    [
        (" " * 16, "holds a blank"),  # security review 4, N5: accepted before
        ("\t" * 20, "holds a blank"),
        ("a" * 16, "at least 8 different characters"),
        ("abababababababababab", "at least 8 different characters"),
        ("short-token", "at least 16 characters"),
        ("a token with spaces inside", "holds a blank"),
        ("0123456789abcdef\x1b[2J", "control character"),
    ],
)
def test_weak_tokens_are_refused_with_what_to_use(token: str, problem: str) -> None:
    found = token_problem(token)
    assert found is not None
    assert problem in found
    assert "openssl rand -hex 24" in found
    with pytest.raises(UiError, match="the token"):
        read_token(token, None, "127.0.0.1")


def test_a_token_is_made_on_loopback_and_required_elsewhere() -> None:
    made, generated = read_token(None, None, "127.0.0.1")
    assert generated
    assert token_problem(made) is None
    assert read_token(None, None, "localhost")[0] != made  # a new one each start
    assert read_token(GOOD, None, "0.0.0.0") == (GOOD, False)
    with pytest.raises(UiError, match="is not a loopback address: give a token"):
        read_token(None, None, "0.0.0.0")


@pytest.mark.parametrize(
    ("header", "name"),
    [
        ("127.0.0.1:8089", "127.0.0.1"),
        ("LocalHost:8089", "localhost"),
        ("localhost", "localhost"),
        ("[::1]:8089", "::1"),
        ("dlq.example.org.:443", "dlq.example.org"),
    ],
)
def test_host_names(header: str, name: str) -> None:
    assert host_name(header) == name


def test_the_page_answers_only_to_its_own_names() -> None:
    loopback = Guard.of(GOOD, "127.0.0.1", "127.0.0.1", ["dlq.tunnel.example"])
    assert loopback.answers_to("127.0.0.1:8089")
    assert loopback.answers_to("localhost:8089")
    assert loopback.answers_to("dlq.tunnel.example:8089")
    # security review 4, N3: a name rebound to 127.0.0.1 is not this page's
    assert not loopback.answers_to("rebind.attacker.example:8089")
    assert not loopback.answers_to("10.0.0.5:8089")
    assert not loopback.answers_to(None)
    assert not loopback.answers_to("")
    # listening on every address: any address may be the Host (an address cannot be rebound), names may not
    everywhere = Guard.of(GOOD, "0.0.0.0", "0.0.0.0")
    assert everywhere.answers_to("10.0.0.5:8089")
    assert everywhere.answers_to("[fe80::1]:8089")
    assert not everywhere.answers_to("rebind.attacker.example:8089")


def test_the_cookie_is_not_the_token() -> None:
    guard = Guard.of(GOOD, "127.0.0.1", "127.0.0.1")
    assert GOOD not in guard.cookie
    assert guard.is_cookie(guard.cookie)
    assert not guard.is_cookie(GOOD)
    assert guard.is_token(GOOD)
    assert not guard.is_token(guard.cookie)
    other = Guard.of("another-token-0123456789", "127.0.0.1", "127.0.0.1")
    assert not other.is_cookie(guard.cookie)  # a cookie of another page's (another token) is not this one's


def test_each_session_has_its_own_cookie_and_form_token() -> None:
    guard = Guard.of(GOOD, "127.0.0.1", "127.0.0.1")
    first, second = guard.cookie, guard.cookie
    assert first != second
    one, two = guard.session_of(first), guard.session_of(second)
    assert one is not None
    assert two is not None
    assert one != two
    assert guard.is_csrf(one, guard.csrf(one))
    assert not guard.is_csrf(two, guard.csrf(one))  # a form of one session does not act for another
    forged = f"{one}.{'0' * 64}"
    assert guard.session_of(forged) is None
    assert guard.session_of("") is None
    assert GOOD not in guard.csrf(one)


@pytest.mark.parametrize(
    ("line", "logged"),
    [
        ('"GET /?token=s3cret-0123456789ab&x=1 HTTP/1.1" 303 -', '"GET /?token=***&x=1 HTTP/1.1" 303 -'),
        ('"GET /letter?id=e&TOKEN=s3cret HTTP/1.1" 401 -', '"GET /letter?id=e&TOKEN=*** HTTP/1.1" 401 -'),
        (
            "code 400, message Bad request syntax ('GET /?%74oken=s3cret')",
            "code 400, message Bad request syntax ('GET /?%74oken=***')",
        ),
        ('"GET /letter?id=e HTTP/1.1" 200 -', '"GET /letter?id=e HTTP/1.1" 200 -'),
    ],
)
def test_the_access_log_never_shows_a_token(line: str, logged: str) -> None:
    assert without_token(line) == logged


def test_a_form_of_another_origin_is_not_the_pages_own() -> None:
    guard = Guard.of(GOOD, "127.0.0.1", "127.0.0.1", port=8089)
    assert guard.is_origin("http://127.0.0.1:8089")
    assert guard.is_origin("http://localhost:8089")
    assert not guard.is_origin("http://localhost:3000")  # the same site, another service: not this page
    assert not guard.is_origin("http://evil.example:8089")
    assert not guard.is_origin("https://localhost:8089")
    assert not guard.is_origin("null")
    assert not guard.is_origin("http://localhost:99999")
