"""``worker dlq ui``: a read-only page over the DLQ and the audit record.

Standard library only: ``http.server`` in a thread, one request at a time (two views at once would each
see only the letters the other does not hold), every view a fresh pass over the queue the way ``list``
makes it (each message held unacked only while the page is built, then put back in order), run on the
command's event loop. Nothing here acks a message: the page never replays or deletes.

The HTML is built here, every piece of a letter escaped (``html.escape`` after :func:`terminal_safe`, so a
control character shows as ``\\x1b``), under a Content-Security-Policy that allows no script and no
request to anywhere but this page.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import html
import ipaddress
import json
import shlex
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http import HTTPStatus
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import parse_qs, urlencode, urlsplit

from worker.broker.headers import rfc3339
from worker.broker.urls import vhost_of
from worker.config import Topology
from worker.ops.dlq.answer import shard_answer
from worker.ops.dlq.audit import Audit, AuditUnavailable
from worker.ops.dlq.groups import Group, Grouping
from worker.ops.dlq.letters import GROUP_FIELDS, Letter, Selection, group_value
from worker.ops.dlq.operations import browse
from worker.ops.dlq.render import _body_lines, format_age, message_properties, terminal_safe
from worker.ops.dlq.sweep import DEFAULT_BATCH, Found, error_text, open_dead_letters

#: how long one view may take (a pass over the queue, the audit query) before the page says so
VIEW_TIMEOUT = 120.0
COOKIE = "ltm_dlq_ui"
#: bars in an over-time chart at most
BUCKETS = 24
#: error groups charted one by one (the rest are in the table)
CHARTED_ERRORS = 8
#: letters listed on a group's page at most
GROUP_PAGE_LETTERS = 500
_STEPS = (60, 300, 900, 3600, 3 * 3600, 6 * 3600, 86400, 7 * 86400, 30 * 86400)
_COLOURS = ("#4269d0", "#efb118", "#ff725c", "#6cc5b0", "#3ca951", "#ff8ab7", "#a463f2", "#97bbf5", "#9c6b4e")
_GROUP_TITLES = {"kind": "By kind", "error": "By error (ids and numbers stripped)", "shard": "By shard"}


# --- what a view reads ---------------------------------------------------------------------------------


@dataclass
class Snapshot:
    """Every dead letter of one pass (described, not kept), and what the pass saw."""

    taken_at: datetime
    letters: list[Letter]
    scanned: int
    queue: str
    vhost: str
    seconds: float


@dataclass
class Reader:
    """What the page reads from: the broker and, for the history, Postgres."""

    url: str
    dsn: str
    topology: Topology
    batch: int = DEFAULT_BATCH

    async def snapshot(self, selection: Selection = Selection(), limit: int | None = None) -> Snapshot:
        started = time.monotonic()
        letters: list[Letter] = []
        async with open_dead_letters(self.url, self.topology) as dlq:
            totals = await browse(
                dlq,
                selection,
                lambda found, _now: letters.append(found.letter),
                batch=self.batch,
                limit=limit,
            )
            return Snapshot(
                datetime.now(UTC),
                letters,
                totals.scanned,
                dlq.name,
                vhost_of(dlq.url),
                time.monotonic() - started,
            )

    async def letter(self, event_id: str) -> tuple[list[tuple[Found, datetime]], int]:
        """Every dead letter with this event id, as ``show`` finds them (bodies kept), and how many were
        scanned."""
        found: list[tuple[Found, datetime]] = []
        async with open_dead_letters(self.url, self.topology) as dlq:
            totals = await browse(
                dlq,
                Selection(event_ids=frozenset({event_id})),
                lambda item, now: found.append((item, now)),
                batch=self.batch,
            )
        return found, totals.scanned

    async def history(self, limit: int, operation: str | None = None) -> list[dict[str, Any]]:
        import uuid

        operation_id = uuid.UUID(operation) if operation else None
        audit = await Audit.open(self.dsn)
        try:
            entries = await audit.history(limit=limit, operation_id=operation_id)
            if operation_id is not None and entries:
                entries[0]["letter_outcomes"] = await audit.letters(operation_id)
            return entries
        finally:
            await audit.close()


# --- HTML pieces ----------------------------------------------------------------------------------------


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
code.cmd{background:#eef2fb;padding:2px 6px;border-radius:3px;user-select:all;word-break:break-all}
th.k{text-transform:none;font-size:13px;width:180px}
.muted{color:#69728a}.tiles{display:flex;gap:12px;flex-wrap:wrap}
.tile{border:1px solid #dde1e8;border-radius:6px;padding:8px 14px;min-width:120px;background:#fff}
.tile b{display:block;font-size:22px}.legend span{display:inline-block;margin-right:14px}
.legend i{display:inline-block;width:10px;height:10px;margin-right:4px;border-radius:2px}
.state-done{color:#2a7d3f}.state-failed,.state-interrupted{color:#b3261e}.state-started{color:#a36a00}
.state-refused{color:#69728a}
"""


def page(title: str, body: str, *, note: str = "") -> str:
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>{esc(title)}</title><meta name=viewport content='width=device-width'>"
        f"<style>{_STYLE}</style></head><body>"
        "<header><h1>Dead letters</h1><a href='/'>overview</a><a href='/history'>audit history</a>"
        f"<span class=muted>{esc(note)}</span></header>"
        f"<main>{body}</main></body></html>"
    )


def time_text(moment: datetime | None) -> str:
    return "-" if moment is None else rfc3339(moment)[:19].replace("T", " ") + "Z"


def _step(span: float) -> int:
    for step in _STEPS:
        if span / step <= BUCKETS:
            return step
    return _STEPS[-1]


@dataclass
class Timeline:
    """Failure times in fixed buckets (a nice step: 1m, 5m, 15m, 1h, ... 30d) ending now."""

    now: datetime
    start: datetime
    step: int
    count: int = field(init=False)

    def __post_init__(self) -> None:
        self.count = max(1, int((self.now - self.start).total_seconds() // self.step) + 1)

    @classmethod
    def over(cls, letters: Iterable[Letter], now: datetime) -> Timeline:
        times = [letter.failed_at for letter in letters if letter.failed_at is not None]
        oldest = min(times, default=now - timedelta(hours=1))
        step = _step(max(60.0, (now - oldest).total_seconds()))
        start = datetime.fromtimestamp(oldest.timestamp() // step * step, UTC)
        return cls(now, start, step)

    def index(self, moment: datetime | None) -> int | None:
        if moment is None:
            return None
        return min(self.count - 1, max(0, int((moment - self.start).total_seconds() // self.step)))

    def counts(self, letters: Iterable[Letter]) -> list[int]:
        counts = [0] * self.count
        for letter in letters:
            i = self.index(letter.failed_at)
            if i is not None:
                counts[i] += 1
        return counts

    @property
    def step_text(self) -> str:
        return format_age(timedelta(seconds=self.step))


def stacked_chart(series: Sequence[tuple[str, list[int]]], timeline: Timeline, *, label: str) -> str:
    """An SVG of stacked bars, one colour per series, with the time axis's ends written under it."""
    width, height, pad = 760, 160, 28
    totals = [sum(values[i] for _, values in series) for i in range(timeline.count)]
    top = max(totals, default=0) or 1
    bar = (width - pad) / timeline.count
    parts = [
        f"<svg role=img aria-label='{esc(label)}' width={width} height={height + 30} "
        f"viewBox='0 0 {width} {height + 30}' xmlns='http://www.w3.org/2000/svg'>",
        f"<text x=0 y=12 font-size=11 fill='#69728a'>{top}</text>",
        f"<line x1={pad} y1={height} x2={width} y2={height} stroke='#c9ced8'/>",
    ]
    for i in range(timeline.count):
        y = float(height)
        for n, (name, values) in enumerate(series):
            if not values[i]:
                continue
            h = values[i] / top * (height - 16)
            y -= h
            parts.append(
                f"<rect x={pad + i * bar + 1:.1f} y={y:.1f} width={max(1.0, bar - 2):.1f} height={h:.1f} "
                f"fill='{_COLOURS[n % len(_COLOURS)]}'><title>{esc(name)}: {values[i]}</title></rect>"
            )
    parts.append(
        f"<text x={pad} y={height + 16} font-size=11 fill='#69728a'>{esc(time_text(timeline.start))}</text>"
        f"<text x={width} y={height + 16} font-size=11 fill='#69728a' text-anchor=end>now "
        f"({esc(time_text(timeline.now))}), one bar = {esc(timeline.step_text)}</text></svg>"
    )
    legend = "".join(
        f"<span><i style='background:{_COLOURS[n % len(_COLOURS)]}'></i>{esc(name)} ({sum(values)})</span>"
        for n, (name, values) in enumerate(series)
    )
    return "".join(parts) + f"<div class=legend>{legend}</div>"


def sparkline(values: list[int]) -> str:
    width, height = 160, 24
    top = max(values, default=0) or 1
    bar = width / max(1, len(values))
    rects = "".join(
        f"<rect x={i * bar:.1f} y={height - v / top * height:.1f} width={max(1.0, bar - 1):.1f} "
        f"height={v / top * height:.1f} fill='#4269d0'/>"
        for i, v in enumerate(values)
        if v
    )
    return f"<svg width={width} height={height} xmlns='http://www.w3.org/2000/svg'>{rects}</svg>"


def group_table(groups: Sequence[Group], timeline: Timeline, letters: Sequence[Letter]) -> str:
    by_value: dict[str, list[Letter]] = {}
    if groups:
        for letter in letters:
            by_value.setdefault(group_value(letter, groups[0].by), []).append(letter)
    rows = []
    for group in groups:
        sample = group.sample_event_id
        sample_cell = (
            f"<a href='{link('/letter', id=sample)}'><code>{esc(sample)}</code></a>" if sample else "-"
        )
        rows.append(
            f"<tr data-group='{esc(group.selector)}' data-count='{group.count}'>"
            f"<td><a href='{link('/group', by=group.by, value=group.value)}'>{esc(group.value)}</a></td>"
            f"<td class=n>{group.count}</td><td>{esc(time_text(group.oldest))}</td>"
            f"<td>{esc(time_text(group.newest))}</td>"
            f"<td>{sparkline(timeline.counts(by_value.get(group.value, ())))}</td><td>{sample_cell}</td>"
            f"<td><code class=cmd>{esc(group.replay_command())}</code><br>"
            "<span class=muted>try it first with --dry-run</span></td></tr>"
        )
    return (
        "<table><tr><th>group</th><th>count</th><th>oldest failure</th><th>newest failure</th>"
        f"<th>over time ({esc(timeline.step_text)} a bar)</th><th>sample</th><th>replay it</th></tr>"
        + "".join(rows)
        + "</table>"
    )


def overview(snapshot: Snapshot, history: list[dict[str, Any]] | str) -> str:
    letters = snapshot.letters
    timeline = Timeline.over(letters, snapshot.taken_at)
    groupings = {by: Grouping(by).extend(letters).groups for by in GROUP_FIELDS}
    kinds = groupings["kind"]
    tiles = "".join(
        f"<div class=tile data-kind='{esc(group.value)}'><b>{group.count}</b>{esc(group.value)}</div>"
        for group in kinds
    )
    kind_series = [(g.value, timeline.counts(x for x in letters if x.kind == g.value)) for g in kinds]
    errors = groupings["error"][:CHARTED_ERRORS]
    error_series = [
        (g.value, timeline.counts(x for x in letters if group_value(x, "error") == g.value)) for g in errors
    ]
    oldest = min((x.failed_at for x in letters if x.failed_at is not None), default=None)
    body = [
        "<section><h2>Now</h2><div class=tiles>"
        f"<div class=tile id=total data-count='{len(letters)}'><b>{len(letters)}</b>dead letters</div>"
        f"{tiles}<div class=tile><b>{esc(format_age(None if oldest is None else snapshot.taken_at - oldest))}"
        "</b>oldest waiting</div></div>"
        f"<p class=muted>{esc(snapshot.queue)} on vhost {esc(snapshot.vhost)}, read at "
        f"{esc(time_text(snapshot.taken_at))} in {snapshot.seconds:.2f} s (every message put back). "
        "This page only reads: replay or purge with the commands below, which record who did it."
        "</p></section>",
        "<section><h2>Per kind over time</h2>"
        + stacked_chart(kind_series, timeline, label="dead letters per kind over time")
        + "</section>",
        f"<section><h2>Per error over time (the {len(errors)} largest)</h2>"
        + stacked_chart(error_series, timeline, label="dead letters per error over time")
        + "</section>",
    ]
    for by in GROUP_FIELDS:
        body.append(
            f"<section id='groups-{by}'><h2>{_GROUP_TITLES[by]}</h2>"
            + group_table(groupings[by], timeline, letters)
            + "</section>"
        )
    body.append(
        "<section id=history><h2>Latest replays and purges</h2>" + history_table(history) + "</section>"
    )
    return page("Dead letters", "".join(body), note=f"{len(letters)} in {snapshot.queue}")


def history_table(history: list[dict[str, Any]] | str) -> str:
    if isinstance(history, str):
        return f"<p class=muted>the audit record cannot be read: {esc(history)}</p>"
    if not history:
        return "<p class=muted>no replay or purge on record</p>"
    rows = []
    for entry in history:
        letters = ", ".join(f"{k} {v}" for k, v in entry["letters"].items()) or "none"
        filters = " ".join(
            f"{k}={','.join(map(str, v)) if isinstance(v, list) else v}" for k, v in entry["filters"].items()
        )
        rows.append(
            f"<tr data-operation='{esc(entry['operation_id'])}'><td><a href='"
            f"{link('/history', operation=entry['operation_id'])}'><code>{esc(entry['operation_id'][:8])}"
            f"</code></a></td><td>{esc(time_text(_parse(entry['started_at'])))}</td>"
            f"<td>{esc(entry['actor'])}</td><td>{esc(entry['action'])}</td>"
            f"<td class='state-{esc(entry['state'])}'>{esc(entry['state'])}</td>"
            f"<td>{esc(letters)}</td><td><code>{esc(filters or 'all')}</code></td>"
            f"<td>{esc(entry['detail'] or '')}</td></tr>"
        )
    return (
        "<table><tr><th>operation</th><th>started</th><th>by</th><th>action</th><th>state</th>"
        "<th>letters</th><th>filters</th><th>detail</th></tr>" + "".join(rows) + "</table>"
    )


def _parse(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text.replace("Z", "+00:00"))


def history_page(history: list[dict[str, Any]] | str, operation: str | None) -> str:
    body = "<section><h2>Replays and purges, newest first</h2>" + history_table(history) + "</section>"
    if operation and isinstance(history, list) and history:
        rows = "".join(
            f"<tr><td class=n>{x['position']}</td><td><code>{esc(x['event_id'] or '-')}</code></td>"
            f"<td>{esc(x['kind'])}</td><td>{esc(x['outcome'])}</td><td>{esc(x['detail'] or '')}</td>"
            f"<td>{esc(time_text(_parse(x['recorded_at'])))}</td></tr>"
            for x in history[0].get("letter_outcomes", ())
        )
        body += (
            f"<section id=letters><h2>Letters of {esc(operation)}</h2><table><tr><th>#</th><th>event id</th>"
            "<th>kind</th><th>outcome</th><th>detail</th><th>recorded</th></tr>" + rows + "</table></section>"
        )
    return page("Audit history", body)


def group_page(by: str, value: str, snapshot: Snapshot) -> str:
    letters = snapshot.letters
    rows = "".join(
        f"<tr><td>{_letter_link(x.event_id)}</td>"
        f"<td>{esc(x.kind)}</td><td class=n>{'-' if x.attempts is None else x.attempts}</td>"
        f"<td>{esc(time_text(x.failed_at))}</td><td>{'-' if x.shard_id is None else x.shard_id}</td>"
        f"<td>{esc(x.error)}</td></tr>"
        for x in letters[:GROUP_PAGE_LETTERS]
    )
    selector = f"{by}={value}"
    more = f" (the first {GROUP_PAGE_LETTERS} shown)" if len(letters) > GROUP_PAGE_LETTERS else ""
    body = (
        f"<section><h2>{esc(selector)}: <span id=group-count>{len(letters)}</span> dead letters{more}</h2>"
        f"<p>Replay: <code class=cmd>worker dlq replay --group {esc(shlex.quote(selector))}</code> (see "
        f"first: <code class=cmd>worker dlq replay --group {esc(shlex.quote(selector))} --dry-run</code>)"
        "</p><table><tr><th>event id</th><th>kind</th><th>attempts</th><th>failed at</th><th>shard</th>"
        f"<th>error</th></tr>{rows}</table></section>"
    )
    return page(selector, body)


def _letter_link(event_id: str | None) -> str:
    if not event_id:
        return "-"
    return f"<a href='{link('/letter', id=event_id)}'><code>{esc(event_id)}</code></a>"


def letter_page(event_id: str, found: list[tuple[Found, datetime]], scanned: int) -> str:
    if not found:
        return page(
            "No such dead letter",
            f"<section><h2>No dead letter with event id {esc(event_id)}</h2><p class=muted>{scanned} "
            "scanned; it may have been replayed or purged.</p></section>",
        )
    sections = []
    for n, (item, now) in enumerate(found, 1):
        message, letter = item.message, item.letter
        answer = shard_answer(letter, message.body)
        summary = [
            ("event id", letter.event_id or "-"),
            ("kind", letter.kind),
            ("error", letter.error),
            ("attempts", "?" if letter.attempts is None else letter.attempts),
            ("failed at", f"{time_text(letter.failed_at)} ({format_age(letter.age(now))} ago)"),
            ("shard", "-" if letter.shard_id is None else letter.shard_id),
            ("replays to", f"{letter.routing_key or '?'} (replayed {letter.replay_count} time(s) so far)"),
            ("delivery", f"exchange {message.exchange!r}, routing key {message.routing_key!r}"),
        ]
        properties = message_properties(message)
        body_lines = _body_lines(message.body)
        result = (
            "<pre id=result>"
            + esc_lines(
                [
                    terminal_safe(x)
                    for x in json.dumps(answer.result, indent=2, ensure_ascii=False).split("\n")
                ]
            )
            + "</pre>"
            if answer.result is not None
            else ""
        )
        heading = f"Dead letter {n} of {len(found)}" if len(found) > 1 else "Dead letter"
        sections.append(
            f"<section class=letter><h2>{heading}</h2>{_pairs(summary)}"
            f"<h3>The failure result the shard got</h3><p class=muted>{esc(answer.note)}</p>{result}"
            f"<h3>Headers</h3>{_pairs(sorted((str(k), v) for k, v in (message.headers or {}).items()))}"
            f"<h3>Properties</h3>{_pairs(properties)}"
            f"<h3>{esc(body_lines[0].rstrip(':'))}</h3><pre id=body>{esc_lines(body_lines[1:])}</pre>"
            "<p>Replay it: <code class=cmd>worker dlq replay --event-id "
            f"{esc(shlex.quote(event_id))}</code></p>"
            "</section>"
        )
    return page(f"Dead letter {event_id}", "".join(sections))


def esc_lines(lines: Sequence[str]) -> str:
    """Lines already made terminal-safe (the body as ``show`` prints it): only HTML-escaped."""
    return html.escape("\n".join(lines), quote=False)


def _pairs(pairs: Sequence[tuple[str, object]]) -> str:
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


# --- serving ---------------------------------------------------------------------------------------------


class UiError(Exception):
    """The page cannot start: the message says why."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_token(token: str | None, token_file: str | None, host: str) -> str | None:
    if token_file is not None:
        try:
            token = Path(token_file).read_text(encoding="utf-8").rstrip("\r\n")
        except OSError as exc:
            raise UiError(f"cannot read --token-file {token_file}: {error_text(exc)}") from None
    if token is not None and len(token) < 16:
        raise UiError("the token must be at least 16 characters")
    if token is None and not is_loopback(host):
        raise UiError(
            f"--host {host} is not a loopback address: give a token (--token-file PATH, or --token) so only "
            "people who know it can read the dead letters"
        )
    return token


Runner = Callable[[Coroutine[Any, Any, Any]], Any]


class Handler(BaseHTTPRequestHandler):
    """GET and HEAD only; every view rendered on the command's event loop."""

    server: UiServer
    server_version = "worker-dlq-ui"
    sys_version = ""

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        if not self._authorised(parts.path, query):
            return
        try:
            status, text = self.server.view(parts.path, query)
        except Exception as exc:  # the broker or the database failed this view: say so, keep serving
            status, text = HTTPStatus.SERVICE_UNAVAILABLE, page("Unavailable", _problem(exc))
        self._send(status, text)

    def _authorised(self, path: str, query: dict[str, str]) -> bool:
        token = self.server.token
        if token is None:
            return True
        given = query.get("token")
        if given is not None and hmac.compare_digest(given.encode(), token.encode()):
            rest = {k: v for k, v in query.items() if k != "token"}
            self.send_response(HTTPStatus.SEE_OTHER)
            self.send_header("Location", path + ("?" + urlencode(rest) if rest else ""))
            self.send_header("Set-Cookie", f"{COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return False
        cookie = SimpleCookie(self.headers.get("Cookie", ""))
        candidates = [cookie[COOKIE].value] if COOKIE in cookie else []
        bearer = self.headers.get("Authorization", "")
        if bearer.startswith("Bearer "):
            candidates.append(bearer[7:])
        if any(hmac.compare_digest(c.encode(), token.encode()) for c in candidates):
            return True
        self._send(
            HTTPStatus.UNAUTHORIZED,
            page(
                "Token needed",
                "<section><h2>This page needs its token</h2><p>Open it once as "
                "<code>/?token=...</code> (a cookie keeps it for the session).</p></section>",
            ),
        )
        return False

    def _send(self, status: int, text: str) -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header(
            "Content-Security-Policy",
            "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'none'; "
            "frame-ancestors 'none'; base-uri 'none'",
        )
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        self.server.log.write(f"{self.address_string()} {format % args}\n")
        self.server.log.flush()


def _problem(exc: BaseException) -> str:
    return f"<section><h2>The page cannot be built now</h2><p>{esc(error_text(exc))}</p></section>"


class UiServer(HTTPServer):
    """One request at a time (see the module's note); views run on ``run`` (the command's loop)."""

    def __init__(
        self, address: tuple[str, int], reader: Reader, run: Runner, token: str | None, log: TextIO
    ) -> None:
        super().__init__(address, Handler)
        self.reader = reader
        self.run = run
        self.token = token
        self.log = log

    def view(self, path: str, query: dict[str, str]) -> tuple[int, str]:
        reader = self.reader
        if path == "/":
            snapshot = self.run(reader.snapshot())
            return HTTPStatus.OK, overview(snapshot, self._history(10))
        if path == "/letter" and query.get("id"):
            found, scanned = self.run(reader.letter(query["id"]))
            return (HTTPStatus.OK if found else HTTPStatus.NOT_FOUND), letter_page(
                query["id"], found, scanned
            )
        if path == "/group" and query.get("by") in GROUP_FIELDS and "value" in query:
            by, value = query["by"], query["value"]
            snapshot = self.run(reader.snapshot(Selection(groups=frozenset({(by, value)}))))
            return HTTPStatus.OK, group_page(by, value, snapshot)
        if path == "/history":
            operation = query.get("operation")
            return HTTPStatus.OK, history_page(self._history(200, operation), operation)
        return HTTPStatus.NOT_FOUND, page("Not found", "<section><h2>Nothing here</h2></section>")

    def _history(self, limit: int, operation: str | None = None) -> list[dict[str, Any]] | str:
        try:
            return self.run(self.reader.history(limit, operation))  # type: ignore[no-any-return]
        except (AuditUnavailable, ValueError) as exc:
            return str(exc)
        except Exception as exc:
            return error_text(exc)


async def ui_command(
    url: str,
    dsn: str,
    topology: Topology,
    *,
    host: str = "127.0.0.1",
    port: int = 8089,
    token: str | None = None,
    token_file: str | None = None,
    batch: int = DEFAULT_BATCH,
    out: TextIO | None = None,
) -> int:
    """Serve the page until interrupted. Exit 2 when it cannot start (no token off loopback, the port)."""
    out = out or sys.stdout
    try:
        secret = read_token(token, token_file, host)
    except UiError as exc:
        print(f"worker dlq ui: {exc}", file=sys.stderr)
        return 2
    loop = asyncio.get_running_loop()

    def run(coroutine: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(asyncio.wait_for(coroutine, VIEW_TIMEOUT), loop).result()

    try:
        server = UiServer((host, port), Reader(url, dsn, topology, batch), run, secret, sys.stderr)
    except OSError as exc:
        print(f"worker dlq ui: cannot listen on {host}:{port}: {error_text(exc)}", file=sys.stderr)
        return 2
    bound_host, bound_port = str(server.server_address[0]), int(server.server_address[1])
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    out.write(f"serving the dead-letter page on http://{shown}:{bound_port}/ (read-only; Ctrl-C stops it)\n")
    out.flush()
    thread = threading.Thread(target=server.serve_forever, name="dlq-ui", daemon=True)
    thread.start()
    try:
        await asyncio.to_thread(thread.join)
    finally:
        with contextlib.suppress(Exception):
            await asyncio.to_thread(server.shutdown)
        server.server_close()
    return 0
