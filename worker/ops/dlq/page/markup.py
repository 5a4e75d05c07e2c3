"""The page's HTML building blocks: escaping, links, the frame of every page and its CSS, key-value tables.

Every piece of a letter is escaped (``html.escape`` after :func:`terminal_safe`, so a control character shows
as ``\\x1b``); the page is served under a Content-Security-Policy that allows no script."""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from datetime import datetime
from urllib.parse import urlencode

from worker.broker.headers import rfc3339
from worker.ops.dlq.render import terminal_safe


def esc(text: object) -> str:
    """Text of a dead letter (or anything) made safe for HTML: controls shown as escapes, then escaped."""
    return html.escape(terminal_safe(str(text)), quote=True)


def link(path: str, **query: str) -> str:
    return html.escape(path + ("?" + urlencode(query) if query else ""), quote=True)


_STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:10px 24px;display:flex;gap:24px;align-items:baseline}
header a{color:#cfd8ea;text-decoration:none}header h1{font-size:17px;margin:0}
main{padding:16px 24px;max-width:1400px}
section{background:#fff;border:1px solid #dde1e8;border-radius:6px;padding:12px 16px;margin-bottom:16px}
h2{font-size:15px;margin:0 0 8px}h3{font-size:14px;margin:12px 0 6px}
table{border-collapse:collapse;width:100%}
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #eceef2;vertical-align:top}
th{font-weight:600;color:#4b5468;font-size:12px;text-transform:uppercase}
td.n{text-align:right;font-variant-numeric:tabular-nums}
code,pre{font:12.5px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
pre{background:#f3f4f7;padding:8px 10px;border-radius:4px;overflow-x:auto;white-space:pre-wrap;
word-break:break-all;margin:4px 0}
code.cmd{background:#eef2fb;padding:2px 6px;border-radius:3px;user-select:all;display:inline-block;
max-width:100%;overflow-x:auto;white-space:pre;vertical-align:bottom}
.fails{color:#8a4b00;margin:2px 0}details{margin-top:4px}
th.k{text-transform:none;font-size:13px;width:180px}
.muted{color:#69728a}.tiles{display:flex;gap:12px;flex-wrap:wrap}
.tile{border:1px solid #dde1e8;border-radius:6px;padding:8px 14px;min-width:120px;background:#fff}
.tile b{display:block;font-size:22px}.legend span{display:inline-block;margin-right:14px}
.legend i{display:inline-block;width:10px;height:10px;margin-right:4px;border-radius:2px}
.state-done{color:#2a7d3f}.state-failed,.state-interrupted{color:#b3261e}.state-started{color:#a36a00}
.state-refused{color:#69728a}.state-running{color:#2456a6}.state-lost{color:#b3261e}
a.button,button{display:inline-block;border:1px solid #2456a6;border-radius:4px;padding:4px 12px;
background:#eef2fb;color:#2456a6;text-decoration:none;font:inherit;cursor:pointer}
"""


def page(title: str, body: str, *, note: str = "") -> str:
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>{esc(title)}</title><meta name=viewport content='width=device-width'>"
        f"<style>{_STYLE}</style></head><body>"
        "<header><h1>Dead letters</h1><a href='/'>overview</a><a href='/operations'>running now</a>"
        "<a href='/history'>audit history</a>"
        f"<span class=muted>{esc(note)}</span></header>"
        f"<main>{body}</main></body></html>"
    )


def time_text(moment: datetime | None) -> str:
    return "-" if moment is None else rfc3339(moment)[:19].replace("T", " ") + "Z"


def esc_lines(lines: Sequence[str]) -> str:
    """Lines already made terminal-safe (the body as ``show`` prints it): only HTML-escaped."""
    return html.escape("\n".join(lines), quote=False)


def pairs(pairs: Sequence[tuple[str, object]]) -> str:
    rows = "".join(
        f"<tr><th class=k>{esc(key)}</th><td><code>{esc(_value(value))}</code></td></tr>"
        for key, value in pairs
    )
    return f"<table>{rows}</table>" if rows else "<p class=muted>none</p>"


def _value(value: object) -> str:
    if isinstance(value, datetime):
        return rfc3339(value)
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, (dict, list)):
        try:
            return json.dumps(value, ensure_ascii=False, default=str, sort_keys=True)
        except (TypeError, ValueError, RecursionError):
            return f"<{type(value).__name__} too deep or irregular to show>"
    return str(value)
