"""The page's views: the overview, a group's letters, a letter in full, the audit history (HTML strings)."""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from worker.broker.dead_letters import Letter
from worker.ops.dlq.answer import shard_answer
from worker.ops.dlq.groups import Group, Grouping
from worker.ops.dlq.history import CAME_BACK, Record, letters_text
from worker.ops.dlq.kinds import advice, replay_note
from worker.ops.dlq.page.charts import Timeline, sparkline, stacked_chart
from worker.ops.dlq.page.markup import esc, esc_lines, link, page, pairs, time_text
from worker.ops.dlq.page.reading import Snapshot
from worker.ops.dlq.reading import DELIVERY_COUNT, Seen
from worker.ops.dlq.render import body_lines, format_age, read_count, terminal_safe
from worker.ops.dlq.selection import GROUP_FIELDS, group_value

#: error groups charted one by one (the rest are in the table)
CHARTED_ERRORS = 8
#: letters listed on a group's page at most
GROUP_PAGE_LETTERS = 500
_GROUP_TITLES = {"kind": "By kind", "error": "By error (ids and numbers stripped)", "shard": "By shard"}


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
            f"<tr data-group='{esc(group.selector)}' data-count='{group.count}' "
            f"data-replay-helps='{group.replay_helps}'>"
            f"<td><a href='{link('/group', by=group.by, value=group.value)}'>{esc(group.value)}</a></td>"
            f"<td class=n>{group.count}</td><td>{esc(time_text(group.oldest))}</td>"
            f"<td>{esc(time_text(group.newest))}</td>"
            f"<td>{sparkline(timeline.counts(by_value.get(group.value, ())))}</td><td>{sample_cell}</td>"
            f"<td>{replay_cell(group)}</td></tr>"
        )
    return (
        "<table><tr><th>group</th><th>count</th><th>oldest failure</th><th>newest failure</th>"
        f"<th>over time ({esc(timeline.step_text)} a bar)</th><th>sample</th><th>what to do</th></tr>"
        + "".join(rows)
        + "</table>"
    )


def replay_cell(group: Group) -> str:
    """The group's advice: the replay command where a replay can help, else why not (the command folded)."""
    useful = group.useful_replay()
    if useful == group.replay_command():
        return (
            f"<code class=cmd>{esc(useful)}</code><br><span class=muted>try it first with --dry-run; "
            f"{esc(group.hint())}</span>"
        )
    advice = f"<p class=fails>{esc(group.hint())}</p>"
    if useful is not None:
        advice += (
            f"<p>Replay only the letters it can help: <code class=cmd>{esc(useful)}</code> (try it first "
            "with --dry-run)</p>"
        )
    return advice + (
        "<details><summary class=muted>the group's replay command all the same</summary>"
        f"<code class=cmd>{esc(group.replay_command())}</code></details>"
    )


def overview(snapshot: Snapshot, history: Record | str) -> str:
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
        "Replay or purge a group from its page (a confirmation first), or with the commands below; either "
        "way it is recorded with who did it."
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


def history_table(history: Record | str) -> str:
    if isinstance(history, str):
        return f"<p class=muted>the audit record cannot be read: {esc(history)}</p>"
    if not history.entries:
        return "<p class=muted>no replay or purge on record</p>"
    rows = []
    for entry in history.entries:
        filters = " ".join(
            f"{k}={','.join(map(str, v)) if isinstance(v, list) else v}" for k, v in entry["filters"].items()
        )
        back = " class=fails" if entry["came_back"] else ""
        rows.append(
            f"<tr data-operation='{esc(entry['operation_id'])}' data-came-back='{entry['came_back']}'><td>"
            f"<a href='{link('/history', operation=entry['operation_id'])}'><code>"
            f"{esc(entry['operation_id'][:8])}</code></a></td><td>{esc(time_text(_parse(entry['started_at'])))}"
            f"</td><td>{esc(entry['actor'])}</td><td>{esc(entry['action'])}</td>"
            f"<td class='state-{esc(entry['state'])}'>{esc(entry['state'])}</td>"
            f"<td{back}>{esc(letters_text(entry))}</td><td><code>{esc(filters or 'all')}</code></td>"
            f"<td>{esc(entry['detail'] or '')}</td></tr>"
        )
    unchecked = (
        ""
        if history.unchecked is None
        else f"<p class=muted>Could not read the DLQ to see which replayed letters came back "
        f"({esc(history.unchecked)}): only what later replays and purges recorded is counted.</p>"
    )
    return (
        "<table><tr><th>operation</th><th>started</th><th>by</th><th>action</th><th>state</th>"
        "<th>letters</th><th>filters</th><th>detail</th></tr>" + "".join(rows) + "</table>" + unchecked
    )


def _parse(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text.replace("Z", "+00:00"))


def history_page(history: Record | str, operation: str | None) -> str:
    body = "<section><h2>Replays and purges, newest first</h2>" + history_table(history) + "</section>"
    if operation and isinstance(history, Record) and history.entries:
        rows = "".join(
            f"<tr data-came-back='{str(bool(x['came_back'])).lower()}'><td class=n>{x['position']}</td>"
            f"<td><code>{esc(x['event_id'] or '-')}</code></td><td>{esc(x['kind'])}</td>"
            f"<td{' class=fails' if x['came_back'] else ''}>{esc(x['outcome'])}"
            f"{esc(', ' + CAME_BACK) if x['came_back'] else ''}</td><td>{esc(x['detail'] or '')}</td>"
            f"<td>{esc(time_text(_parse(x['recorded_at'])))}</td></tr>"
            for x in history.entries[0].get("letter_outcomes", ())
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
    group = Grouping(by).extend(letters).groups
    selector = f"{by}={value}"
    more = f" (the first {GROUP_PAGE_LETTERS} shown)" if len(letters) > GROUP_PAGE_LETTERS else ""
    replay = link("/confirm", action="replay", by=by, value=value)
    purge = link("/confirm", action="purge", by=by, value=value)
    buttons = (
        f"<p class=buttons><a class=button href='{replay}'>Replay this group…</a> "
        f"<a class=button href='{purge}'>Purge this group…</a></p>"
        if letters
        else ""
    )
    body = (
        f"<section><h2>{esc(selector)}: <span id=group-count>{len(letters)}</span> dead letters{more}</h2>"
        f"{buttons}{replay_cell(group[0]) if group else ''}"
        "<table><tr><th>event id</th><th>kind</th><th>attempts</th><th>failed at</th><th>shard</th>"
        f"<th>error</th></tr>{rows}</table></section>"
    )
    return page(selector, body)


def _letter_link(event_id: str | None) -> str:
    if not event_id:
        return "-"
    return f"<a href='{link('/letter', id=event_id)}'><code>{esc(event_id)}</code></a>"


def letter_page(
    event_id: str,
    found: list[tuple[Seen, datetime]],
    scanned: int,
    life: Sequence[dict[str, Any]] | str = (),
) -> str:
    """A dead letter in full, and its life (``life``: what the record knows of the event, history.py
    ``life``; a string: why the record could not be read)."""
    lived = life_section([seen.letter for seen, _ in found], life)
    if not found:
        return page(
            "No such dead letter",
            f"<section><h2>No dead letter with event id {esc(event_id)}</h2><p class=muted>{scanned} "
            f"scanned; it may have been replayed or purged.</p></section>{lived}",
        )
    sections = []
    for n, (seen, now) in enumerate(found, 1):
        heading = f"Dead letter {n} of {len(found)}" if len(found) > 1 else "Dead letter"
        sections.append(f"<section class=letter><h2>{heading}</h2>{_letter(seen, now, event_id)}</section>")
    return page(f"Dead letter {event_id}", lived + "".join(sections))


def life_section(letters: Sequence[Letter], life: Sequence[dict[str, Any]] | str) -> str:
    """Its life, oldest first: each time it failed (the letters in the DLQ now), each replay or purge that
    took it, and the worker's answer."""
    steps: list[tuple[str, str, str]] = [
        (
            time_text(letter.failed_at),
            "failed" if letter.replay_count == 0 else f"came back after replay {letter.replay_count}",
            f"{letter.kind} after {'?' if letter.attempts is None else letter.attempts} attempt(s): "
            f"{letter.error}; in the DLQ now",
        )
        for letter in letters
    ]
    if isinstance(life, str):
        note = f"<p class=muted>the audit record could not be read: {esc(life)}</p>"
    else:
        note = ""
        steps += [(time_text(_parse(step["at"])), *_step(step)) for step in life]
    rows = "".join(
        f"<tr><td>{esc(at)}</td><td>{esc(what)}</td><td>{esc(detail)}</td></tr>"
        for at, what, detail in sorted(steps)
    )
    return (
        "<section id=life><h2>Its life</h2>"
        + note
        + "<table><tr><th>when</th><th>what</th><th>detail</th></tr>"
        + rows
        + "</table></section>"
    )


def _step(step: dict[str, Any]) -> tuple[str, str]:
    """What one step of the record says: what happened, and the detail (who, how fast, which operation)."""
    if "answered" in step:
        return "answered by the worker", f"status {step['answered']}"
    rate = "as fast as the broker confirmed" if step["rate"] is None else f"at {step['rate']:g}/s"
    by = f"by {step['actor']}, operation {step['operation_id']}"
    what = {
        "replayed": f"replayed (as replay {(step['replay_count'] or 0) + 1})",
        "replayed_before": "removed: an earlier replay had sent it",
        "pending": "taken by a replay that was stopped at once: in doubt",
        "not_replayed": "not replayed",
        "deleted": "purged",
        "kept": "kept (purge not confirmed)",
    }.get(step["outcome"], step["outcome"])
    detail = f"{by}, {rate}" if step["action"] == "replay" else by
    if step["detail"]:
        detail += f": {step['detail']}"
    return what, detail


def _letter(seen: Seen, now: datetime, event_id: str) -> str:
    letter = seen.letter
    answer = shard_answer(letter, seen.body)
    summary: list[tuple[str, object]] = [
        ("event id", letter.event_id or "-"),
        ("kind", letter.kind),
        ("error", letter.error),
        ("attempts", "?" if letter.attempts is None else letter.attempts),
        ("failed at", f"{time_text(letter.failed_at)} ({format_age(letter.age(now))} ago)"),
        ("shard", "-" if letter.shard_id is None else letter.shard_id),
    ]
    summary.append(("published by", letter.published_by.describe()))
    summary += [
        ("replays to", f"{letter.replay_key or '?'} (replayed {letter.replay_count} time(s) so far)"),
        ("state", seen.state) if seen.state is not None else ("read from the DLQ", read_count(seen)),
        ("delivery", f"exchange {seen.exchange!r}, routing key {seen.routing_key!r}"),
    ]
    shown_body = body_lines(seen.body, seen.body_size)
    result = (
        "<pre id=result>"
        + esc_lines(
            [terminal_safe(x) for x in json.dumps(answer.result, indent=2, ensure_ascii=False).split("\n")]
        )
        + "</pre>"
        if answer.result is not None
        else ""
    )
    headers = [
        (key, f"{value} (times read from the DLQ)" if key == DELIVERY_COUNT else value)
        for key, value in sorted((str(k), v) for k, v in seen.headers.items())
    ]
    command = f"worker dlq replay --event-id {shlex.quote(event_id)}"
    found = advice(letter.kind, letter.errors)
    what = (
        f"<p id=advice>{esc(found.hint)}</p><p>Replay it: <code class=cmd>{esc(command)}</code></p>"
        if found.replay_helps
        else f"<p id=advice class=fails>{esc(replay_note(letter.kind, letter.errors))}</p><details>"
        f"<summary class=muted>the replay command all the same</summary>"
        f"<code class=cmd>{esc(command)}</code></details>"
    )
    button = f"<p class=buttons><a class=button href='{link('/confirm', action='replay', id=event_id)}'>"
    return (
        f"{pairs(summary)}<h3>What to do</h3>{what}{button}Replay this letter…</a></p>"
        f"<h3>The failure result the shard got</h3><p class=muted>{esc(answer.note)}</p>{result}"
        f"<h3>Headers</h3>{pairs(headers)}<h3>Properties</h3>{pairs(seen.properties)}"
        f"<h3>{esc(shown_body[0].rstrip(':'))}</h3><pre id=body>{esc_lines(shown_body[1:])}</pre>"
    )
