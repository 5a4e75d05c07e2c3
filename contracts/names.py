"""The names of the wire contract (contracts/CONTRACT.md), each written once: exchanges, queues, routing keys,
the Redis channel, the shard's RabbitMQ user and the AMQP headers.

The worker's ``Topology`` (worker/config/settings.py) takes its defaults from here, and a deployment may
rename what it names; a shard uses these. A name with parts is a template (``{shard_id}``, ``{kind}``, ...)
and a function that fills it in: ``shard_queue(3, "results")`` is ``tomori.shard.3.results``.

``python -m contracts.names --typescript`` prints the TypeScript kit's ``src/names.ts`` from this module, so
the two kits cannot name a queue differently (tests/unit/test_contract_names.py fails when the committed file
differs from what it prints).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Literal

# --- RabbitMQ: exchanges and queues (CONTRACT.md section 1) -------------------------------------------

#: shards publish their tool-call events here, routing key ``tool.<name>`` or ``tool.<name>.shard.<id>``
TOOL_CALLS_EXCHANGE = "tomori.tool_calls"
#: the worker publishes one result per event here, routing key ``shard.<id>``
TOOL_RESULTS_EXCHANGE = "tomori.tool_results"
#: the worker publishes the notice of a save here, routing key ``shard.<id>``
NOTIFICATIONS_EXCHANGE = "tomori.notifications"
#: the dead-letter exchange of the work queues
DEAD_LETTER_EXCHANGE = "tomori.dead_letter"
#: every exchange of the contract
EXCHANGES = (TOOL_CALLS_EXCHANGE, TOOL_RESULTS_EXCHANGE, NOTIFICATIONS_EXCHANGE, DEAD_LETTER_EXCHANGE)
#: the common work queue, bound to ``tomori.tool_calls`` with each tool's ``tool.<name>``
WORK_QUEUE = "ltm.create_memory"
#: what could not be processed, bound to ``tomori.dead_letter`` with ``#``
DEAD_LETTER_QUEUE = "ltm.create_memory.dlq"
#: a copy of every dead letter, also bound to ``tomori.dead_letter`` with ``#``: the workers drain it into
#: Postgres (``ltm_dead_letters``), where the letters are read without taking them from the DLQ
DEAD_LETTER_COPIES_QUEUE = "ltm.create_memory.dlq.copies"
#: the worker's retry queues, ``ltm.create_memory.retry.<ms>``: one per backoff delay
RETRY_QUEUE_PREFIX = "ltm.create_memory.retry"
#: each shard's own work queue, ``ltm.create_memory.shard.<id>``
SHARD_WORK_QUEUE_PREFIX = "ltm.create_memory.shard"

# --- Redis (section 6) --------------------------------------------------------------------------------

#: the pub/sub channel of cache invalidations
INVALIDATION_CHANNEL = "tomori:cache-invalidation"

# --- AMQP headers (sections 3 and 7) ------------------------------------------------------------------

#: the W3C trace context a shard may send with its event
TRACEPARENT_HEADER = "traceparent"
#: a dead letter's error, one line
ERROR_HEADER = "x-ltm-error"
#: a dead letter's kind (``malformed``, ``schema``, ``transient_exhausted``, ...)
ERROR_KIND_HEADER = "x-ltm-error-kind"
#: processing attempts made
ATTEMPTS_HEADER = "x-ltm-attempts"
#: RFC 3339 time of the failure
FAILED_AT_HEADER = "x-ltm-failed-at"
#: the routing key the shard published with, kept on the worker's retry copies
ROUTING_KEY_HEADER = "x-ltm-routing-key"
#: what a copy left out: a list of one-line notes
DROPPED_HEADER = "x-ltm-dropped"
#: the error of an event's first attempt, when its attempts failed differently
FIRST_ERROR_HEADER = "x-ltm-first-error"
#: on a ``shard_backlog_full`` letter: how many events of its shard were turned away since its previous one
TURNED_AWAY_HEADER = "x-ltm-turned-away"
#: the RabbitMQ user that published the event, as the worker recorded it (``""``: none)
USER_ID_HEADER = "x-ltm-user-id"
#: what ``worker dlq replay`` adds
REPLAYED_AT_HEADER = "x-ltm-replayed-at"
REPLAY_COUNT_HEADER = "x-ltm-replay-count"

# --- names with parts ---------------------------------------------------------------------------------

ShardQueueKind = Literal["results", "notifications"]

#: the routing key of a tool's events on ``tomori.tool_calls`` (version 1: the common work queue)
TOOL_ROUTING_KEY = "tool.{tool_name}"
#: a tool's routing key as one shard's own: the broker routes it into that shard's work queue
SHARD_TOOL_ROUTING_KEY = "{routing_key}.shard.{shard_id}"
#: a shard's own work queue, under the work queues' shard prefix
SHARD_WORK_QUEUE = "{prefix}.{shard_id}"
#: a retry queue, under the retry queues' prefix
RETRY_QUEUE = "{prefix}.{delay_ms}"
#: the routing key of a shard's results and notices
SHARD_ROUTING_KEY = "shard.{shard_id}"
#: the durable queue a shard declares for its results or its notices, bound with ``shard.<id>``
SHARD_QUEUE = "tomori.shard.{shard_id}.{kind}"
#: the RabbitMQ user of shard ``<id>`` (deploy/rabbitmq/shard_users.py)
SHARD_USER = "shard-{shard_id}"

#: a shard's own tool routing key, ``tool.<name>.shard.<id>``: group 1 is the tool's common key
_SHARD_TOOL_ROUTING_KEY = re.compile(r"^(tool\..+)\.shard\.([0-9]+)$")


def tool_routing_key(tool_name: str) -> str:
    """``tool.<name>``: a tool's events for the common work queue."""
    return TOOL_ROUTING_KEY.format(tool_name=tool_name)


def shard_tool_routing_key(routing_key: str, shard_id: int) -> str:
    """``tool.<name>.shard.<id>`` of a tool's ``tool.<name>``: the shard's own key, routed into its queue."""
    return SHARD_TOOL_ROUTING_KEY.format(routing_key=routing_key, shard_id=shard_id)


def common_routing_key(routing_key: str) -> str:
    """``tool.<name>`` of a shard's own ``tool.<name>.shard.<id>``; any other key as it is."""
    found = _SHARD_TOOL_ROUTING_KEY.match(routing_key)
    return found.group(1) if found else routing_key


def shard_work_queue(shard_id: int, prefix: str = SHARD_WORK_QUEUE_PREFIX) -> str:
    """``ltm.create_memory.shard.<id>``: shard ``shard_id``'s own work queue (``prefix``: a renamed one's)."""
    return SHARD_WORK_QUEUE.format(prefix=prefix, shard_id=shard_id)


def shard_of_work_queue(name: str, prefix: str = SHARD_WORK_QUEUE_PREFIX) -> int | None:
    """The shard whose own work queue ``name`` is, or None when it is no shard's."""
    head = prefix + "."
    number = name[len(head) :] if name.startswith(head) else ""
    return int(number) if number.isascii() and number.isdigit() else None


def retry_queue(delay_ms: int, prefix: str = RETRY_QUEUE_PREFIX) -> str:
    """``ltm.create_memory.retry.<ms>``: the retry queue of one backoff delay."""
    return RETRY_QUEUE.format(prefix=prefix, delay_ms=delay_ms)


def shard_routing_key(shard_id: int) -> str:
    """``shard.<id>``: the routing key of a shard's results and notices."""
    return SHARD_ROUTING_KEY.format(shard_id=shard_id)


def shard_of_routing_key(routing_key: str) -> int | None:
    """The shard a result's or notice's routing key ``shard.<id>`` names, or None for any other key."""
    number = routing_key.removeprefix("shard.") if routing_key.startswith("shard.") else ""
    return int(number) if number.isascii() and number.isdigit() else None


def shard_queue(shard_id: int, kind: ShardQueueKind) -> str:
    """``tomori.shard.<id>.results`` or ``.notifications``: the durable queue shard ``shard_id`` declares and
    binds with ``shard.<id>``, to ``tomori.tool_results`` or ``tomori.notifications``."""
    return SHARD_QUEUE.format(shard_id=shard_id, kind=kind)


def shard_user(shard_id: int) -> str:
    """``shard-<id>``: the RabbitMQ user shard ``shard_id`` connects as."""
    return SHARD_USER.format(shard_id=shard_id)


# --- the TypeScript kit's names.ts ----------------------------------------------------------------------

#: what names.ts says it is
TYPESCRIPT_HEADER = (
    "// Generated by `python -m contracts.names --typescript` from contracts/names.py: do not edit.\n"
    "// The names of the wire contract (contracts/CONTRACT.md), each written once for both kits.\n\n"
)
#: the constants of names.ts, in this order
TYPESCRIPT_CONSTANTS = (
    "TOOL_CALLS_EXCHANGE",
    "TOOL_RESULTS_EXCHANGE",
    "NOTIFICATIONS_EXCHANGE",
    "DEAD_LETTER_EXCHANGE",
    "WORK_QUEUE",
    "DEAD_LETTER_QUEUE",
    "DEAD_LETTER_COPIES_QUEUE",
    "RETRY_QUEUE_PREFIX",
    "SHARD_WORK_QUEUE_PREFIX",
    "INVALIDATION_CHANNEL",
    "TRACEPARENT_HEADER",
    "ERROR_HEADER",
    "ERROR_KIND_HEADER",
    "ATTEMPTS_HEADER",
    "FAILED_AT_HEADER",
    "ROUTING_KEY_HEADER",
    "DROPPED_HEADER",
    "FIRST_ERROR_HEADER",
    "TURNED_AWAY_HEADER",
    "USER_ID_HEADER",
    "REPLAYED_AT_HEADER",
    "REPLAY_COUNT_HEADER",
)
#: the TypeScript type of each part of a template
_PART_TYPES = {
    "shard_id": "number",
    "delay_ms": "number",
    "tool_name": "string",
    "routing_key": "string",
    "prefix": "string",
    "kind": "ShardQueueKind",
}


@dataclass(frozen=True, slots=True)
class TypeScriptFunction:
    """A function of names.ts: the template it fills in, its parameters in order (a part of the template),
    and the constant a part defaults to, where it has one."""

    name: str
    template: str
    parameters: tuple[str, ...]
    doc: str
    defaults: tuple[tuple[str, str], ...] = ()


TYPESCRIPT_FUNCTIONS = (
    TypeScriptFunction(
        "toolRoutingKey",
        TOOL_ROUTING_KEY,
        ("tool_name",),
        "`tool.<name>`: a tool's events for the common work queue.",
    ),
    TypeScriptFunction(
        "shardToolRoutingKey",
        SHARD_TOOL_ROUTING_KEY,
        ("routing_key", "shard_id"),
        "`tool.<name>.shard.<id>` of a tool's `tool.<name>`: the shard's own key, routed into its own queue.",
    ),
    TypeScriptFunction(
        "shardWorkQueue",
        SHARD_WORK_QUEUE,
        ("shard_id", "prefix"),
        "`ltm.create_memory.shard.<id>`: the shard's own work queue (the workers declare it).",
        (("prefix", "SHARD_WORK_QUEUE_PREFIX"),),
    ),
    TypeScriptFunction(
        "retryQueue",
        RETRY_QUEUE,
        ("delay_ms", "prefix"),
        "`ltm.create_memory.retry.<ms>`: the worker's retry queue of one backoff delay.",
        (("prefix", "RETRY_QUEUE_PREFIX"),),
    ),
    TypeScriptFunction(
        "shardRoutingKey",
        SHARD_ROUTING_KEY,
        ("shard_id",),
        "`shard.<id>`: the routing key of a shard's results and notices.",
    ),
    TypeScriptFunction(
        "shardQueue",
        SHARD_QUEUE,
        ("shard_id", "kind"),
        "`tomori.shard.<id>.results` or `.notifications`: the shard's own queue, bound with `shard.<id>`.",
    ),
    TypeScriptFunction(
        "shardUser", SHARD_USER, ("shard_id",), "`shard-<id>`: the RabbitMQ user the shard connects as."
    ),
)

_FIELD = re.compile(r"\{(\w+)\}")


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _typescript_function(function: TypeScriptFunction) -> str:
    defaults = dict(function.defaults)
    fields = set(_FIELD.findall(function.template))
    if fields != set(function.parameters):
        raise ValueError(
            f"{function.name}: parameters {function.parameters} are not the parts of {function.template!r}"
        )
    parameters = ", ".join(
        f"{_camel(p)}: {_PART_TYPES[p]}" + (f" = {defaults[p]}" if p in defaults else "")
        for p in function.parameters
    )
    body = _FIELD.sub(lambda m: "${" + _camel(m.group(1)) + "}", function.template.replace("`", "\\`"))
    signature = f"export function {function.name}({parameters}): string"
    return f"/** {function.doc} */\n{signature} {{\n  return `{body}`;\n}}\n"


def typescript() -> str:
    """The text of contracts/typescript/src/names.ts."""
    values = globals()
    lines = [TYPESCRIPT_HEADER]
    for name in TYPESCRIPT_CONSTANTS:
        value = values[name]
        assert isinstance(value, str)
        lines.append(f"export const {name} = {_quoted(value)};\n")
    lines.append(
        f"export const EXCHANGES = [{', '.join(_constant_of(value) for value in EXCHANGES)}] as const;\n"
    )
    lines.append('\nexport type ShardQueueKind = "results" | "notifications";\n')
    lines.extend(f"\n{_typescript_function(function)}" for function in TYPESCRIPT_FUNCTIONS)
    return "".join(lines)


def _quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _constant_of(value: str) -> str:
    values = globals()
    return next(name for name in TYPESCRIPT_CONSTANTS if values[name] == value)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args != ["--typescript"]:
        print(
            "usage: python -m contracts.names --typescript > contracts/typescript/src/names.ts",
            file=sys.stderr,
        )
        return 2
    sys.stdout.write(typescript())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
