"""Text rules of the original that JavaScript defines: trimming, alias normalisation, placeholders, length.

The bot is TypeScript, so "trim", "\\s" and "length" mean what JavaScript means by them. Python's
built-ins differ at the edges (``str.strip`` also strips ``\\x1c``-``\\x1f`` and ``\\x85`` but keeps
U+FEFF; ``len`` counts code points, not UTF-16 code units), so these helpers spell the JS rules out.
"""

from __future__ import annotations

import re

#: JS ``WhiteSpace`` + ``LineTerminator``: what ``String.prototype.trim`` strips and ``\s`` matches.
JS_WHITESPACE = (
    "\t\n\v\f\r \u00a0\u1680"
    + "".join(chr(code) for code in range(0x2000, 0x200B))
    + "\u2028\u2029\u202f\u205f\u3000\ufeff"
)

_JS_WHITESPACE_RUN = re.compile(f"[{re.escape(JS_WHITESPACE)}]+")

#: A placeholder word: one ASCII letter, then ASCII letters, digits or ``_`` (never ``\w``: Unicode).
_DOUBLE_BRACE_PLACEHOLDER = re.compile(r"\{\{([A-Za-z][A-Za-z0-9_]*)\}\}")
_SINGLE_BRACE_PLACEHOLDER = re.compile(r"\{([A-Za-z][A-Za-z0-9_]*)\}")
_KNOWN_PLACEHOLDER = re.compile("user|user_formatted|user_term|bot|char", re.IGNORECASE)


def js_trim(text: str) -> str:
    """JavaScript ``String.prototype.trim``: strip JS whitespace and line terminators from both ends."""
    return text.strip(JS_WHITESPACE)


def normalize_alias(value: str) -> str:
    """``normalizeParticipantAlias``: the key every name comparison of the resolver uses.

    Trim, drop every leading ``@``, trim again, lower-case, collapse each whitespace run to one space.
    Like the original, ``"@ @x"`` keeps its second ``@`` (``"@x"``): only one run is dropped.
    """
    without_at = js_trim(js_trim(value).lstrip("@"))
    return _JS_WHITESPACE_RUN.sub(" ", without_at.lower())


def _keep_known_placeholder(match: re.Match[str]) -> str:
    word = match.group(1)
    return match.group(0) if _KNOWN_PLACEHOLDER.fullmatch(word) else word


def sanitize_placeholders(content: str) -> str:
    """``sanitizeUnknownTemplatePlaceholders``: unknown ``{word}``/``{{word}}`` lose their braces.

    ``user``, ``user_formatted``, ``user_term``, ``bot`` and ``char`` (any casing) keep theirs. One
    double-brace pass, then one single-brace pass over its output, exactly as the original: nested
    braces such as ``{{{{name}}}}`` therefore come out as ``{name}``, not fully stripped.
    """
    double_pass = _DOUBLE_BRACE_PLACEHOLDER.sub(_keep_known_placeholder, content)
    return _SINGLE_BRACE_PLACEHOLDER.sub(_keep_known_placeholder, double_pass)


def utf16_length(text: str) -> int:
    """JavaScript ``length``: UTF-16 code units (a character outside the BMP counts 2, a lone surrogate 1)."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def utf16_slice(text: str, start: int, end: int | None = None) -> str:
    """JavaScript ``slice`` for non-negative offsets counted in UTF-16 code units.

    A cut through a surrogate pair leaves a lone surrogate, as in JavaScript.
    """
    units = text.encode("utf-16-le", "surrogatepass")
    stop = None if end is None else 2 * end
    return units[2 * start : stop].decode("utf-16-le", "surrogatepass")
