"""``worker dlq``: list, show, replay, purge and expire the dead letters in ``ltm.create_memory.dlq``.

``worker.broker.dead_letters`` reads a dead letter (and keys it) and the key and headers its replay sends,
``worker.broker.published_by`` who published it, ``selection`` which letters a command acts on and their
groups (the three pure), ``kinds`` says what each kind means and whether a replay can help, ``sweep`` connects
and takes the queue's messages once, putting back what it does not remove, ``reading`` is the read-only pass
and what it keeps of each letter (``Seen``), ``kept`` reads the letters the workers keep in Postgres,
``listing`` is ``list`` and ``show`` (from the table, or the queue), ``operations`` browses and purges,
``replaying`` replays, ``render`` prints, ``groups`` counts by kind, error or shard, ``audit`` records replays
and purges in Postgres and ``audited`` is how the commands use it, ``answer`` rebuilds the failure result a
shard got, ``retention`` is ``worker dlq expire`` and the workers' retention sweep, ``agreement`` is ``check``
and ``repair``, ``history`` is ``worker dlq history``, ``page`` is ``worker dlq ui``, ``commands`` are the
other actions, ``console`` where they write and their exit codes, ``options`` the actions' options (data),
``cli`` what each action runs and a Ctrl-C.
"""

from worker.broker.dead_letters import Letter, describe_dead_letter, replay_headers
from worker.broker.published_by import PublishedBy, published_by
from worker.ops.dlq.commands import purge_command, replay_command
from worker.ops.dlq.console import EXIT_CODES_HELP, EXIT_INTERRUPTED, Console
from worker.ops.dlq.history import history_command
from worker.ops.dlq.listing import list_command, show_command
from worker.ops.dlq.operations import browse, purge
from worker.ops.dlq.render import format_age
from worker.ops.dlq.replaying import replay
from worker.ops.dlq.selection import Selection, parse_duration
from worker.ops.dlq.sweep import DEFAULT_BATCH, open_dead_letters

__all__ = [
    "DEFAULT_BATCH",
    "EXIT_CODES_HELP",
    "EXIT_INTERRUPTED",
    "Console",
    "Letter",
    "PublishedBy",
    "Selection",
    "browse",
    "describe_dead_letter",
    "format_age",
    "history_command",
    "list_command",
    "open_dead_letters",
    "parse_duration",
    "published_by",
    "purge",
    "purge_command",
    "replay",
    "replay_command",
    "replay_headers",
    "show_command",
]
