"""``worker demo``: a first successful save on a development machine, and back (README "Try it locally").

- ``seed``: the bot rows CONTRACT.md section 3's example event needs: a ``servers`` row for its guild, the
  ``personas`` row ``persona_id`` 7 on that server, ``users`` rows for its author and for Sparrow (a member).
  The worker reads these from the bot's database; without them it answers ``internal_error``.
- ``send``: the example event, published as a shard does (its two queues declared and bound first, the event
  persistent and confirmed, ``user_id`` the URL's user), then its result and, after a save, its notice,
  printed. ``--shard N`` (3 unless told) is the shard it speaks as: with a broker's confined shard users
  (deploy/README.md), shard ``N`` with user ``shard-N``'s URL.
- ``clean``: what ``seed`` and ``send`` left: the rows, the demo's memories and ledger rows, the shard's
  queues; with ``--topology`` also the worker's exchanges and queues on the vhost, each only when it is
  empty and nobody uses it.

For a scratch database and a development broker: the ids are the contract's made-up ones, and ``seed``
refuses a database whose ``personas`` row 7 belongs to another server. Nothing here imports the tests,
``sim`` or ``bench``: it ships with the worker.

example.py: the event and its ids; rows.py: seed and the rows' clean-up (Postgres); send.py: send
(RabbitMQ); command.py: the command and ``clean``; cli.py: its options, declared as data.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from worker.ops.demo.example import (
    AUTHOR,
    BOT,
    CHANNEL,
    DEFAULT_SHARD,
    GUILD,
    PERSONA_ID,
    PERSONA_NICKNAME,
    SPARROW,
    TOOL_CALL_PREFIX,
    example_event,
)

if TYPE_CHECKING:
    from worker.ops.demo.command import clean, run_demo
    from worker.ops.demo.rows import seed
    from worker.ops.demo.send import send, user_of

#: the steps, imported when first asked for: they bring Postgres, RabbitMQ and the shard kit (redis), which
#: every other command of ``worker`` (whose parser imports this package for the demo's options) would pay for
_STEPS = {"clean": "command", "run_demo": "command", "seed": "rows", "send": "send", "user_of": "send"}


def __getattr__(name: str) -> Any:
    if name in _STEPS:
        return getattr(importlib.import_module(f"worker.ops.demo.{_STEPS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AUTHOR",
    "BOT",
    "CHANNEL",
    "DEFAULT_SHARD",
    "GUILD",
    "PERSONA_ID",
    "PERSONA_NICKNAME",
    "SPARROW",
    "TOOL_CALL_PREFIX",
    "clean",
    "example_event",
    "run_demo",
    "seed",
    "send",
    "user_of",
]
