"""``worker dlq``: list, show, replay and purge the dead letters in ``ltm.create_memory.dlq``.

``letters`` reads a dead letter, selects and groups (pure), ``sweep`` takes the queue's messages and puts
them back (``Reading``: the read-only pass with one consumer), ``operations`` browses, replays and purges,
``render`` prints, ``groups`` counts by kind, error or shard, ``audit`` records replays and purges in
Postgres, ``answer`` rebuilds the failure result a shard got, ``page`` is ``worker dlq ui``, ``commands`` are
what the CLI runs, ``cli`` their options and a Ctrl-C.
"""

from worker.ops.dlq.commands import (
    EXIT_CODES_HELP,
    EXIT_INTERRUPTED,
    Console,
    list_command,
    purge_command,
    replay_command,
    show_command,
)
from worker.ops.dlq.letters import Letter, Selection, describe_dead_letter, parse_duration, replay_headers
from worker.ops.dlq.operations import browse, purge, replay
from worker.ops.dlq.render import format_age
from worker.ops.dlq.sweep import DEFAULT_BATCH, open_dead_letters

__all__ = [
    "DEFAULT_BATCH",
    "EXIT_CODES_HELP",
    "EXIT_INTERRUPTED",
    "Console",
    "Letter",
    "Selection",
    "browse",
    "describe_dead_letter",
    "format_age",
    "list_command",
    "open_dead_letters",
    "parse_duration",
    "purge",
    "purge_command",
    "replay",
    "replay_command",
    "replay_headers",
    "show_command",
]
