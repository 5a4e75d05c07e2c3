"""``worker dlq``'s options, declared as data: one :class:`~worker.ops.subcommands.Action` per action, built
from shared groups (the connection, the database, the filters, who runs it)."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta

from worker.config import environment_help
from worker.ops.dlq.console import EXIT_CODES_HELP
from worker.ops.dlq.kinds import WORKER_KINDS
from worker.ops.dlq.live import DEFAULT_WAIT
from worker.ops.dlq.page.auth import MIN_DISTINCT, MIN_TOKEN
from worker.ops.dlq.replaying import DEFAULT_RATE
from worker.ops.dlq.selection import GROUP_FIELDS, parse_duration, parse_group, parse_moment
from worker.ops.dlq.sweep import DEFAULT_BATCH
from worker.ops.subcommands import Action, Command, Setting, option


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of letters a second: {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be 0 (no limit) or more: {text!r}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be 0 or more: {text!r}")
    return value


def _duration(text: str) -> timedelta:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _moment(text: str) -> datetime:
    try:
        return parse_moment(text, datetime.now(UTC))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _shard(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a shard id: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"a shard id is 0 or more: {text!r}")
    return value


def _group(text: str) -> tuple[str, str]:
    try:
        return parse_group(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


#: the log settings: every command logs
_LOGS = ("log_format", "log_level")

_CONNECTION = (
    Setting("rabbitmq_url"),
    option(
        "--batch",
        type=_positive_int,
        default=DEFAULT_BATCH,
        help=f"messages taken from the DLQ per round (default {DEFAULT_BATCH})",
    ),
)
_DATABASE = (Setting("postgres_dsn"),)
#: who may vouch for a letter's sender (``worker.broker.published_by``): ``show``, the page, ``replay``
_SENDERS = (Setting("trusted_publishers"),)
_AUDITED = (
    option(
        "--by",
        metavar="NAME",
        help="who runs it, for the audit record (default: the OS user and host, user@host)",
    ),
)
_FILTERS = (
    option(
        "--kind",
        action="append",
        metavar="KIND",
        help=f"only this error kind ({', '.join(WORKER_KINDS)}, or a broker reason such as delivery_limit); "
        "repeat or comma-separate for several",
    ),
    option("--event-id", action="append", metavar="ID", help="only this event id; repeat for several"),
    option(
        "--older-than",
        type=_duration,
        metavar="DURATION",
        help="only dead letters that failed at least this long ago (30s, 10m, 2h, 1d, 1h30m)",
    ),
    option(
        "--group",
        action="append",
        type=_group,
        metavar="FIELD=VALUE",
        help="only this group, as `list --group-by FIELD` prints it: kind=schema, shard=3 (shard=none: no "
        "shard_id in the body), error='unknown schema_version <n>' (the error with ids as <id> and numbers "
        "as <n>); repeat for several (same field: either, different fields: both)",
    ),
    option(
        "--shard",
        action="append",
        type=_shard,
        metavar="N",
        help="only letters whose body names this shard_id; repeat for several",
    ),
    option(
        "--guild",
        action="append",
        metavar="ID",
        help="only letters whose body names this guild (context.guild_disc_id); repeat for several",
    ),
    option(
        "--error",
        metavar="TEXT",
        help="only letters whose error (or first attempt's error) contains TEXT, in any case",
    ),
    option(
        "--since",
        type=_moment,
        metavar="WHEN",
        help="only letters that failed at or after WHEN: 2026-12-06, 2026-12-06T08:00:00Z, or a duration "
        "ago (2h)",
    ),
    option("--until", type=_moment, metavar="WHEN", help="only letters that failed before WHEN (as --since)"),
)
#: list and show read the kept letters in Postgres unless told to read the queue
_FROM_QUEUE = option(
    "--from-queue",
    action="store_true",
    help="read the DLQ itself instead of the letters kept in Postgres: every letter is taken and put back "
    "(its x-delivery-count rises); for a DLQ whose letters are not kept (`worker dlq check` says so) or "
    "while Postgres is down",
)
_PROGRESS = option(
    "--progress", action="store_true", help="print progress to stderr even when it is not a terminal"
)

DLQ = Command(
    "dlq",
    help="inspect, replay and purge dead letters (ltm.create_memory.dlq)",
    description="Inspect, replay and purge the dead letters in ltm.create_memory.dlq. The workers keep a "
    "copy of every dead letter in Postgres (ltm_dead_letters): list and show read those, without taking "
    "anything from the queue. Replay, purge, expire and check read the queue in one pass, holding each "
    "message unacked until it is settled, so a crash loses nothing: what was not settled returns to the "
    "queue. Every replay, purge, expire and repair is recorded in Postgres (`worker dlq history`).",
    dest="dlq_command",
    metavar="ACTION",
    actions=(
        Action(
            "list",
            "one line per dead letter, or per group",
            "One line per dead letter: event id, kind, attempts, failed at, shard, age, error; or with "
            "--group-by, one line per group: count, oldest and newest failure, a sample event id, and the "
            "FIELD=VALUE that --group takes. A count goes to stderr. Reads the letters kept in Postgres "
            "(ltm_dead_letters, the ones waiting in the DLQ): the broker delivers nothing, the queue is not "
            "touched; a DLQ that holds more or fewer letters than the table says so on stderr. The filters "
            "search them: --kind, --event-id, --shard, --guild, --error, --since, --until, --older-than, "
            "--group.",
            (
                *_CONNECTION,
                *_DATABASE,
                *_FILTERS,
                _FROM_QUEUE,
                option(
                    "--json",
                    action="store_true",
                    help="one JSON object per line: event_id, kind, error, attempts, failed_at, shard_id, "
                    "routing_key (with --group-by: group_by, group, selector, count, oldest_failed_at, "
                    "newest_failed_at, sample_event_id, kinds, replay)",
                ),
                option(
                    "--group-by",
                    choices=GROUP_FIELDS,
                    help="one line per group: the kind, the error (ids and numbers stripped), or the "
                    "shard_id the event names; largest group first",
                ),
            ),
        ),
        Action(
            "show",
            "print a dead letter in full",
            "Print every dead letter with this event id in full: properties, headers, body (as JSON "
            "when it parses), and who published it and how that is known (recorded by the worker, the "
            "message's user_id as RabbitMQ checked it, or unknown), and its state: waiting in the DLQ, "
            "replayed (answered, or came back), purged or expired, by which operation. Reads the letters "
            "kept in Postgres, those that left the DLQ too; the queue is not touched.",
            (*_CONNECTION, *_DATABASE, *_SENDERS, option("event_id", metavar="EVENT_ID"), _FROM_QUEUE),
        ),
        Action(
            "replay",
            "send dead letters back to the work exchange (all by default; no prompt: replay is safe)",
            "Republish the selected dead letters (all by default) to tomori.tool_calls with their "
            "original routing key, body and properties, without the x-ltm-error/-error-kind/-failed-at/"
            "-attempts and x-death headers, with x-ltm-replayed-at and x-ltm-replay-count added. Each DLQ "
            "copy is removed only after the broker confirmed the republished one, so an interrupted replay "
            "loses nothing (at worst an event is in both queues; the worker's idempotency makes that "
            "harmless, and running the replay again finishes it without sending any letter twice). "
            f"Letters go at --rate a second ({DEFAULT_RATE:g} by default), with a progress line; the "
            "replay is on record as running (`worker dlq operations`, from any machine), and `worker dlq "
            "cancel ID` or a first Ctrl-C stops it once the letters in flight are settled: each letter is "
            "then replayed or still in the DLQ, never both. One replay per DLQ at a time: a second is "
            "refused and names the first. Each carries as x-ltm-user-id the sender `show` names (the "
            "worker's record, else the "
            "letter's user_id as RabbitMQ checked it), never a header the worker did not write; under "
            "LTM_SHARD_IDENTITY=required a letter with no known sender is not replayed unless "
            "--as-trusted-publisher says so. Recorded in the audit tables (worker dlq history) before "
            "anything moves: no record, no replay. A dry run reads only the queue and records nothing.",
            (
                *_CONNECTION,
                *_DATABASE,
                Setting("shard_identity"),
                *_SENDERS,
                *_FILTERS,
                *_AUDITED,
                option("--limit", type=_positive_int, metavar="N", help="move at most N dead letters"),
                option(
                    "--rate",
                    type=_rate,
                    default=DEFAULT_RATE,
                    metavar="N",
                    help=f"letters a second (default {DEFAULT_RATE:g}: a small share of one worker beside "
                    "the shards' live traffic; 3,000 letters take a minute); 0: as fast as the broker "
                    "confirms",
                ),
                option("--dry-run", action="store_true", help="list what would move; move nothing"),
                option(
                    "--as-trusted-publisher",
                    action="store_true",
                    help="replay the letters that have no known sender (no user_id, none recorded by the "
                    "worker) as your own events: your RabbitMQ user, a trusted publisher, may speak for any "
                    "shard, so you vouch for each of them. Without it, under LTM_SHARD_IDENTITY=required "
                    "they stay in the DLQ (not_replayed). Recorded in the audit (worker dlq history)",
                ),
                _PROGRESS,
            ),
        ),
        Action(
            "purge",
            "delete dead letters for good (asks first unless --yes)",
            "Delete the selected dead letters (all by default). Scans the whole queue first, then "
            "asks 'Delete N dead letters? [y/N]'; exactly the N counted are deleted. Without a terminal on "
            "stdin, --yes is required. Recorded in the audit tables (worker dlq history) before anything is "
            "deleted, a refusal too: no record, no purge.",
            (
                *_CONNECTION,
                *_DATABASE,
                *_FILTERS,
                *_AUDITED,
                option("--yes", action="store_true", help="do not ask for confirmation"),
                _PROGRESS,
            ),
        ),
        Action(
            "expire",
            "remove the dead letters older than the retention (LTM_DLQ_RETENTION), on record",
            "Remove from the DLQ every dead letter that failed longer ago than the retention (--retention, "
            "else LTM_DLQ_RETENTION, 14d by default), as `purge --older-than` would but on record as "
            "`expired`, then delete from ltm_dead_letters the rows of letters that failed longer ago and "
            "are no longer waiting (replayed, came back, purged, expired). What the workers' retention sweep "
            "runs every LTM_DLQ_RETENTION_SWEEP (as --by retention). Runs alone on its DLQ: refused (exit 6) "
            "while a replay, purge or repair runs, and they while it does. A letter whose failure time is "
            "unknown is never expired. Recorded in the audit tables before anything is deleted.",
            (
                *_CONNECTION,
                *_DATABASE,
                Setting("dlq_retention"),
                *_AUDITED,
                _PROGRESS,
            ),
        ),
        Action(
            "check",
            "whether the DLQ and the kept letters (ltm_dead_letters) agree",
            "Read the DLQ once (as `list` does: every letter put back, in order) and compare it with the "
            "kept letters' waiting rows: letters in the DLQ not kept (their copy never reached the table: "
            "dead-lettered before the copies queue existed, or the copies queue purged), letters in the DLQ "
            "kept as another state (replayed, purged, expired: a removal the broker lost), and rows waiting "
            "whose letter is gone from the DLQ (taken outside the worker's tools: a queue purged in "
            "RabbitMQ's UI). Says how many copies the keepers have not kept yet (then the difference may "
            "pass on its own) and which operation runs on the DLQ (then it may be transient). Exit 0 when "
            "they agree, 1 when not; `worker dlq repair` makes them agree. Reads only.",
            (
                *_CONNECTION,
                *_DATABASE,
                option(
                    "--json",
                    action="store_true",
                    help="one JSON object: agree, dlq, in_dlq, scanned, waiting, not_kept, not_waiting, gone "
                    "(event ids), copies_waiting, running (operation ids)",
                ),
            ),
        ),
        Action(
            "repair",
            "make the kept letters agree with the DLQ, on record",
            "Compare as `check` does, then, in one transaction: keep the letters in the DLQ that have no "
            "row, set the rows of letters still in the DLQ back to waiting, and mark the waiting rows whose "
            "letter is gone from the DLQ purged (`gone from the DLQ outside the worker's tools`; not when "
            "the pass saw fewer letters than the DLQ held: another client held some). Recorded in the audit "
            "tables (action repair, what it changed in its detail); runs alone on its DLQ: refused (exit 6) "
            "while a replay, purge or expire runs, and they while it does. Changes nothing in the DLQ.",
            (*_CONNECTION, *_DATABASE, *_AUDITED),
        ),
        Action(
            "history",
            "who replayed or purged what, newest first",
            "The audit record of replays and purges, newest first: operation id, when, who, what, its state "
            "(started: running, or cut short; done; refused; failed; interrupted; cancelled), the filters, "
            "how many letters ended how (pending: in doubt, the operation was stopped at once there; "
            "replayed_before: sent by an earlier replay that was stopped at once, removed, not sent again), "
            "how many replayed letters came back to the DLQ (the replay failed again: a later replay or "
            "purge took them, or they are in the DLQ now, which it reads when the record does not tell) and "
            "how many are in the DLQ twice (the original beside its copy: replaying again removes the "
            "original). With --operation, each letter of that operation.",
            (
                *_DATABASE,
                Setting("rabbitmq_url"),
                option("--json", action="store_true", help="one JSON object per line"),
                option(
                    "--limit",
                    type=_positive_int,
                    default=50,
                    metavar="N",
                    help="the latest N operations (50)",
                ),
                option("--operation", metavar="ID", help="one operation, with each of its letters"),
            ),
        ),
        Action(
            "operations",
            "the replays, purges, expires and repairs running now, from any machine",
            "Every replay and purge whose audit record is open, oldest first: operation id, action, state "
            "(running: its command wrote a heartbeat in the last 15 s; lost: it stopped without closing its "
            "record, killed or cut off from Postgres, and its letters in doubt are what `history --operation "
            "ID` lists as pending), the rate, letters moved of those selected so far, letters scanned of "
            "those in the DLQ at its start, when it started, its last heartbeat, and who runs it. Reads "
            "Postgres only.",
            (
                *_DATABASE,
                option(
                    "--json",
                    action="store_true",
                    help="one JSON object per line: operation_id, action, actor, state, rate, moved, "
                    "selected, scanned, expected, started_at, heartbeat_at, finished_at, "
                    "cancel_requested_at, cancelled_by, detail, filters, vhost, queue",
                ),
            ),
        ),
        Action(
            "cancel",
            "stop a running replay from any terminal",
            "Ask a running replay to stop and wait until it has: it settles the letters in flight (their "
            "copies confirmed and originals removed, or none of it) and puts the rest back, so each letter "
            "is replayed or still in the DLQ, never both; its record says `cancelled by NAME` and its own "
            "terminal exits 130. A replay whose process is gone (lost) has its record closed as interrupted "
            "at once. Exit 0 once it stopped (also when it had already ended), 1 when there is no such "
            "replay, 6 when it still runs after --wait.",
            (
                *_DATABASE,
                *_AUDITED,
                option("operation_id", metavar="OPERATION_ID", help="as `worker dlq operations` lists it"),
                option(
                    "--wait",
                    type=_seconds,
                    default=DEFAULT_WAIT,
                    metavar="SECONDS",
                    help=f"how long to wait for it to stop (default {DEFAULT_WAIT:g}; 0: ask, do not wait)",
                ),
            ),
        ),
        Action(
            "ui",
            "a web page: counts, groups, letters, the audit history, and buttons that replay, purge, cancel",
            "Serve the dead-letter page: dead letters per kind and per error over time, the groups with "
            "what to do about each, any letter in full with its life, the audit history, and what runs now."
            " Every view reads the letters the workers keep in Postgres, as `list` does: the broker delivers"
            " nothing to the page. Its buttons (replay a letter, replay or purge a group, cancel a "
            "running replay) each open a confirmation that says how many letters and what a replay can do "
            "for their kinds; what they confirm runs as `worker dlq replay` or `purge` in a process of its "
            "own, on record in the audit as --by, with this command's settings. A form acts only with the "
            "session's form token, from the page's own origin. Bound to 127.0.0.1 unless --host says "
            "otherwise. Every request needs the page's token: given once as ?token=... (a cookie keeps it) "
            "or as Authorization: Bearer; without --token-file or --token a random one is made and printed "
            "in the URL (on loopback only: any other address needs one given).",
            (
                *_CONNECTION,
                *_DATABASE,
                *_SENDERS,
                *_AUDITED,
                option("--host", default="127.0.0.1", help="the address to listen on (127.0.0.1)"),
                option("--port", type=int, default=8089, help="the port (8089; 0: any free one, printed)"),
                option(
                    "--token",
                    help="the token the page asks for (shows in the process list: prefer --token-file); at "
                    f"least {MIN_TOKEN} characters, {MIN_DISTINCT} of them different, no blanks. Neither "
                    "given: a random one, printed in the page's URL",
                ),
                option("--token-file", metavar="PATH", help="a file holding the token (a mounted secret)"),
                option(
                    "--allow-host",
                    action="append",
                    default=[],
                    metavar="NAME",
                    help="a name the page may be reached by besides its address and localhost (a proxy's, a "
                    "tunnel's); repeat for several. Any other Host header is refused (421)",
                ),
            ),
        ),
    ),
)


def epilog(action: Action | None) -> str:
    """The exit codes and the environment variables the action reads (all of them for ``worker dlq``)."""
    settings = (
        action.settings
        if action
        else ("rabbitmq_url", "postgres_dsn", "shard_identity", "trusted_publishers")
    )
    return EXIT_CODES_HELP + environment_help(*settings, *_LOGS)
