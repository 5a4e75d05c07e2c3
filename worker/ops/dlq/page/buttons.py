"""The page's buttons: replay a letter, replay a group (at a rate), purge a group, cancel a running replay.

A button is a link to a confirmation page (``GET /confirm``: how many letters, what a replay can do for
their kinds) whose form is a ``POST /act`` carrying the session's form token (auth.py ``csrf``). No script
runs anywhere: the page's Content-Security-Policy allows none, and every confirmation is a page of its own. A
replay of letters a replay cannot help is refused unless the form says so again (``again``). What acts is the
command line itself, run as a process of its own with the page's settings and its user (``worker dlq ui
--by``): the same one-replay-per-DLQ rule, heartbeat, cancel and audit record as from a shell, and a replay
that outlives a closed browser tab. A cancel asks the running replay to stop (``worker dlq cancel`` without
the wait): the operations view shows when it has.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from worker.broker.dead_letters import Letter
from worker.ops.dlq.kinds import advice, replay_helps
from worker.ops.dlq.page.markup import esc, link, page
from worker.ops.dlq.replaying import DEFAULT_RATE
from worker.ops.dlq.selection import GROUP_FIELDS, Selection, parse_group

#: the largest form body a POST may carry
MAX_FORM_BYTES = 4096
#: the highest rate a form may ask for (letters a second)
MAX_RATE = 10_000.0
_ACTIONS = ("replay", "purge", "cancel")


class Refused(ValueError):
    """A form or a confirmation the page does not act on; the message says why."""


@dataclass(frozen=True, slots=True)
class Asked:
    """What a button asks for, as its query or form says it."""

    action: str
    #: a group (``FIELD=VALUE``), or one letter by event id, or (cancel) an operation id
    group: tuple[str, str] | None = None
    event_id: str | None = None
    operation: str | None = None
    rate: float = DEFAULT_RATE
    #: the second confirmation: replay them although a replay cannot help some of them
    again: bool = False

    @classmethod
    def of(cls, fields: Mapping[str, str]) -> Asked:
        action = fields.get("action", "")
        if action not in _ACTIONS:
            raise Refused(f"no such action: {action!r}")
        if action == "cancel":
            if not fields.get("operation"):
                raise Refused("a cancel names the operation")
            return cls(action, operation=fields["operation"])
        group = None
        if fields.get("by") in GROUP_FIELDS and "value" in fields:
            group = parse_group(f"{fields['by']}={fields['value']}")
        event_id = fields.get("id") or None
        if (group is None) == (event_id is None):
            raise Refused("a replay or purge names one group (by, value) or one letter (id)")
        if action == "purge" and group is None:
            raise Refused("the page purges groups, not single letters")
        try:
            rate = float(fields.get("rate", DEFAULT_RATE))
        except ValueError:
            raise Refused(f"not a rate: {fields.get('rate')!r}") from None
        if not 0 <= rate <= MAX_RATE or math.isnan(rate):
            raise Refused(f"the rate must be 0 (as fast as the broker confirms) to {MAX_RATE:g} a second")
        return cls(action, group, event_id, rate=rate, again=fields.get("again") == "yes")

    def selection(self) -> Selection:
        if self.group is not None:
            return Selection(groups=frozenset({self.group}))
        return Selection(event_ids=frozenset({self.event_id or ""}))

    @property
    def what(self) -> str:
        if self.group is not None:
            return f"the group {self.group[0]}={self.group[1]}"
        return f"the letter {self.event_id}"

    def fields(self) -> dict[str, str]:
        """The form's hidden fields that say the same again."""
        if self.operation is not None:
            return {"action": self.action, "operation": self.operation}
        found = {"by": self.group[0], "value": self.group[1]} if self.group else {"id": self.event_id or ""}
        return {"action": self.action, **found}

    def argv(self, actor: str) -> list[str]:
        """The command line that does it, as the page's user."""
        chosen = (
            ["--group", f"{self.group[0]}={self.group[1]}"]
            if self.group
            else ["--event-id", self.event_id or ""]
        )
        if self.action == "replay":
            return ["replay", *chosen, "--rate", f"{self.rate:g}", "--by", actor]
        return ["purge", "--yes", *chosen, "--by", actor]


def hopeless(letters: Sequence[Letter]) -> Counter[str]:
    """The letters a replay cannot help, counted by kind."""
    return Counter(letter.kind for letter in letters if not replay_helps(letter.kind))


def confirm_page(asked: Asked, letters: Sequence[Letter], csrf: str, *, refused: str | None = None) -> str:
    """The dialog: how many letters, what a replay can do for their kinds, and the form that acts."""
    kinds = Counter(letter.kind for letter in letters)
    failing = hopeless(letters)
    rows = "".join(
        f"<tr><td>{esc(kind)}</td><td class=n>{n}</td><td{'' if replay_helps(kind) else ' class=fails'}>"
        f"{esc(advice(kind).hint)}</td></tr>"
        for kind, n in kinds.most_common()
    )
    verb = "Replay" if asked.action == "replay" else "Delete for good"
    body = [f"<section id=confirm><h2>{verb} {len(letters)} dead letter(s) of {esc(asked.what)}?</h2>"]
    if refused:
        body.append(f"<p class=fails id=refused>{esc(refused)}</p>")
    if not letters:
        body.append("<p>Nothing matches now: nothing to do.</p></section>")
        return page("Nothing to do", "".join(body))
    body.append(
        "<table><tr><th>kind</th><th>letters</th><th>what a replay can do</th></tr>" + rows + "</table>"
    )
    inputs = _hidden({**asked.fields(), "csrf": csrf})
    if asked.action == "replay":
        inputs += (
            f"<p><label>letters a second <input name=rate type=number min=0 max={MAX_RATE:g} step=any "
            f"value='{asked.rate:g}'></label> <span class=muted>({DEFAULT_RATE:g} keeps a replay from "
            "crowding live traffic; 0: as fast as the broker confirms)</span></p>"
        )
        if failing:
            counted = ", ".join(f"{n} {kind}" for kind, n in failing.most_common())
            inputs += (
                f"<p class=fails>{sum(failing.values())} of them ({esc(counted)}) will fail again: the "
                "worker refuses them for what they are. <label><input type=checkbox name=again value=yes> "
                "replay them all the same</label></p>"
            )
    else:
        inputs += "<p class=fails>A purge cannot be undone; it is recorded with your name.</p>"
    body.append(
        f"<form method=post action='/act'>{inputs}<p><button type=submit>{verb}</button> "
        f"<a href='{link('/')}'>back</a></p></form>"
        "<p class=muted>It runs as its own process, on record in the audit with this page's user "
        "(<code>worker dlq ui --by</code>); the operations view shows it running and can cancel it.</p>"
        "</section>"
    )
    return page(f"{verb}?", "".join(body))


def operations_page(rows: Sequence[Mapping[str, Any]], csrf: str) -> str:
    """What runs now, each replay with its cancel button."""
    lines = []
    for row in rows:
        cancel = ""
        if row["action"] == "replay" and row["state"] in ("running", "lost"):
            fields = {"action": "cancel", "operation": row["operation_id"], "csrf": csrf}
            button = "<button type=submit>cancel</button>"
            cancel = f"<form method=post action='/act'>{_hidden(fields)}{button}</form>"
        rate = "-" if row["rate"] is None else f"{row['rate']:g}/s"
        asked = f" (cancel asked by {row['cancelled_by']})" if row["cancelled_by"] else ""
        lines.append(
            f"<tr data-operation='{esc(row['operation_id'])}' data-state='{esc(row['state'])}'>"
            f"<td><a href='{link('/history', operation=row['operation_id'])}'><code>"
            f"{esc(row['operation_id'][:8])}</code></a></td><td>{esc(row['action'])}</td>"
            f"<td class='state-{esc(row['state'])}'>{esc(row['state'])}{esc(asked)}</td><td>{esc(rate)}</td>"
            f"<td class=n>{row['moved']}/{row['selected']}</td><td class=n>{row['scanned']}/{row['expected']}"
            f"</td><td>{esc(row['actor'])}</td><td>{cancel}</td></tr>"
        )
    table = (
        "<table><tr><th>operation</th><th>action</th><th>state</th><th>rate</th><th>moved/selected</th>"
        "<th>scanned/in the DLQ</th><th>by</th><th></th></tr>" + "".join(lines) + "</table>"
        if lines
        else "<p class=muted>No replay or purge runs now; the audit history has the ones that ended.</p>"
    )
    return page("Operations", f"<section id=operations><h2>Running now</h2>{table}</section>")


def _hidden(fields: Mapping[str, str]) -> str:
    return "".join(f"<input type=hidden name='{esc(k)}' value='{esc(v)}'>" for k, v in fields.items())


@dataclass
class Launcher:
    """Runs what a button asks for as ``worker dlq ...`` processes with the page's settings."""

    url: str
    dsn: str
    actor: str
    children: list[subprocess.Popen[bytes]]

    def launch(self, asked: Asked) -> None:
        env = {k: v for k, v in os.environ.items() if k not in _SET_HERE}
        env.update(LTM_RABBITMQ_URL=self.url, LTM_POSTGRES_DSN=self.dsn)
        self.reap()
        self.children.append(
            subprocess.Popen(
                [sys.executable, "-m", "worker", "dlq", *asked.argv(self.actor)],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=2,  # what it says ("moved N, kept M") goes to the page's log, beside the requests
            )
        )

    def reap(self) -> None:
        """Forget the processes that ended (no zombie is left behind)."""
        self.children[:] = [child for child in self.children if child.poll() is None]


#: the settings the page passes on as it has them, not as its environment names them (a file or a value)
_SET_HERE = frozenset(
    {"LTM_RABBITMQ_URL", "LTM_RABBITMQ_URL_FILE", "LTM_POSTGRES_DSN", "LTM_POSTGRES_DSN_FILE"}
)
