"""JavaScript text rules: trim, alias normalisation, placeholder sanitising, UTF-16 length."""

from __future__ import annotations

import json

import pytest

from worker.pipeline.text import (
    js_trim,
    normalize_alias,
    sanitize_placeholders,
    utf16_length,
    utf16_slice,
)

# --- js_trim -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "char",
    ["\t", "\n", "\v", "\f", "\r", " ", "\u00a0", "\u1680", "\u2000", "\u200a", "\u2028", "\u2029",
     "\u202f", "\u205f", "\u3000", "\ufeff"],
)  # fmt: skip
def test_js_trim_strips_every_js_whitespace_and_line_terminator(char: str) -> None:
    assert js_trim(f"{char}{char}Sparrow{char}") == "Sparrow"


@pytest.mark.parametrize("char", ["\x1c", "\x1d", "\x1e", "\x1f", "\x85", "\u200b", "\u180e"])
def test_js_trim_keeps_characters_python_strip_would_drop_or_js_does_not_count(char: str) -> None:
    assert js_trim(f"{char}Sparrow{char}") == f"{char}Sparrow{char}"


def test_js_trim_keeps_inner_whitespace() -> None:
    assert js_trim("  Master  Sparrow  ") == "Master  Sparrow"


# --- normalize_alias ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("Sparrow", "sparrow"),
        ("  Sparrow  ", "sparrow"),
        ("@Sparrow", "sparrow"),
        ("@@@Sparrow", "sparrow"),
        ("  @  Sparrow ", "sparrow"),
        ("Master   Sparrow", "master sparrow"),
        ("Master\t\nSparrow", "master sparrow"),
        ("Master\u3000\u00a0Sparrow", "master sparrow"),
        ("\ufeffSparrow\ufeff", "sparrow"),
        ("ÉLODIE", "élodie"),
        ("ΟΔΥΣΣΕΥΣ", "οδυσσευς"),
        ("さくら", "さくら"),
        ("Spar@row", "spar@row"),
        ("<@1150000000000000201>", "<@1150000000000000201>"),
        ("", ""),
        ("   ", ""),
        ("@@@", ""),
    ],
)
def test_normalize_alias_trims_drops_leading_at_lowercases_and_collapses(value: str, expected: str) -> None:
    assert normalize_alias(value) == expected


def test_normalize_alias_drops_only_the_first_run_of_at_signs_like_the_original() -> None:
    assert normalize_alias("@ @Sparrow") == "@sparrow"


def test_normalize_alias_does_not_collapse_characters_outside_js_whitespace() -> None:
    assert normalize_alias("a\x85\x85b") == "a\x85\x85b"


# --- sanitize_placeholders: every example of reference section 3 -------------------------------


@pytest.mark.parametrize(
    "content",
    [
        "{user}",
        "{bot}",
        "{char}",
        "{user_formatted}",
        "{user_term}",
        "{User}",
        "{BOT}",
        "{{user}}",
        "{{BOT}}",
        "{{{user}}}",
        "{ user }",
        "{user name}",
        "{123}",
        "{_x}",
        "{foo-bar}",
        "{名前}",
        "{}",
        "{{user}",
        "{user} likes {bot}",
        "no braces at all",
    ],
)
def test_sanitize_keeps_allowlisted_and_malformed_placeholders(content: str) -> None:
    assert sanitize_placeholders(content) == content


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("{username}", "username"),
        ("{{name}}", "name"),
        ("{obonya}", "obonya"),
        ("{first} and {last}", "first and last"),
        ("Hello {user}, your name is {username}", "Hello {user}, your name is username"),
        ("{{{name}}}", "name"),
        ("{Username}", "Username"),
        ("{users}", "users"),
        ("{USERNAME} met {Bot}", "USERNAME met {Bot}"),
        ("{a1_b2}", "a1_b2"),
    ],
)
def test_sanitize_strips_braces_of_unknown_placeholders(content: str, expected: str) -> None:
    assert sanitize_placeholders(content) == expected


def test_sanitize_keeps_original_casing_of_allowlisted_words() -> None:
    assert sanitize_placeholders("{uSeR_FoRmAtTeD} and {{ChAr}}") == "{uSeR_FoRmAtTeD} and {{ChAr}}"


def test_sanitize_runs_each_pass_once_so_deep_nesting_keeps_one_brace_pair() -> None:
    # Same as the original: pass 1 strips the inner {{name}}, pass 2 the next pair, and no third pass.
    assert sanitize_placeholders("{{{{name}}}}") == "{name}"
    assert sanitize_placeholders("{a{b}}") == "{ab}"


# --- utf16_length / utf16_slice ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 0),
        ("abc", 3),
        ("é", 1),
        ("e\u0301", 2),
        ("名前", 2),
        ("😀", 2),
        ("a😀b", 4),
        ("𝓜aster", 7),
        ("👨‍👩‍👧", 8),
        ("\U0010ffff", 2),
    ],
)
def test_utf16_length_counts_code_units_like_javascript(text: str, expected: int) -> None:
    assert utf16_length(text) == expected


def test_utf16_length_counts_a_lone_surrogate_from_json_as_one_unit() -> None:
    lone = json.loads('"x\\ud83d"')
    assert utf16_length(lone) == 2


def test_utf16_length_counts_a_json_surrogate_pair_as_two_units() -> None:
    assert utf16_length(json.loads('"\\ud83d\\ude00"')) == 2


def test_utf16_slice_counts_offsets_in_code_units() -> None:
    assert utf16_slice("😀abc", 2) == "abc"
    assert utf16_slice("ab😀", 0, 2) == "ab"


def test_utf16_slice_through_a_surrogate_pair_leaves_a_lone_surrogate() -> None:
    assert utf16_slice("😀x", 1) == "\ude00x"
