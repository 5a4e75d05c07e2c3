"""``worker demo``'s options, declared as data (its steps: :mod:`worker.ops.demo`)."""

from __future__ import annotations

import argparse

from worker.ops.demo.example import (
    AUTHOR,
    DEFAULT_SHARD,
    GUILD,
    PERSONA_ID,
    PERSONA_NICKNAME,
    SPARROW,
    TOOL_CALL_PREFIX,
    shard_id_argument,
)
from worker.ops.subcommands import Action, AddSettings, Command, Option, Setting, add_command, option


def _shard_option(what: str) -> Option:
    return option(
        "--shard",
        type=shard_id_argument,
        default=DEFAULT_SHARD,
        metavar="N",
        help=f"{what} ({DEFAULT_SHARD} unless given); with a broker whose shards have users of their own "
        "(deploy/README.md), shard N with user shard-N's URL: --shard 0 --rabbitmq-url "
        "amqp://shard-0:...@host:5672/",
    )


DEMO = Command(
    "demo",
    help="a first save on a development machine: seed the example's rows, send its event, clean up",
    description="Seed the bot rows of CONTRACT.md's example event, send that event as a shard does and "
    'print its result and notice, then remove what the demo made (README, "Try it locally"). For a '
    "scratch database and a development broker.",
    dest="demo_command",
    metavar="STEP",
    actions=(
        Action(
            "seed",
            f"add the rows the example event needs (guild {GUILD}, persona {PERSONA_ID}, its users)",
            f"Add, where missing, the servers row of guild {GUILD}, personas row {PERSONA_ID} "
            f"({PERSONA_NICKNAME}) on it, and users rows for the author {AUTHOR} and Sparrow {SPARROW}. "
            "Exit 0 when they are there, 1 when the database refuses (not migrated, persona 7 on another "
            "server), 3 when Postgres cannot be reached.",
            (Setting("postgres_dsn"),),
        ),
        Action(
            "send",
            f"send the example event as shard {DEFAULT_SHARD} (--shard) and print its result and notice",
            "Declare and bind the shard's queues (tomori.shard.N.results and .notifications), publish "
            "CONTRACT.md's example event (a fresh event_id; user_id the user of the URL, as a shard with a "
            "user of its own sends it) and print its result and, after a save, its notice. Waits for a "
            "worker to consume ltm.create_memory first. Exit 0 for memory_saved_successfully, 1 for any "
            "other status, 3 when RabbitMQ cannot be reached or nothing answers within --timeout.",
            (
                option(
                    "--scope",
                    choices=("server_wide", "target_user"),
                    default="server_wide",
                    help="server_wide (the contract's example) or target_user (a personal memory about "
                    "Sparrow)",
                ),
                option("--content", help="the memory_content to send ({user} is the author, or the target)"),
                _shard_option("the shard to send as"),
                option(
                    "--timeout",
                    type=float,
                    default=60.0,
                    help="seconds to wait for a worker and for the answer (60)",
                ),
                Setting("rabbitmq_url"),
            ),
        ),
        Action(
            "clean",
            "remove the demo's rows, memories, ledger rows and queues (--topology: the worker's too)",
            f"Delete the demo's ledger rows (tool_call_id {TOOL_CALL_PREFIX}...), the users rows "
            f"of {AUTHOR} and {SPARROW} and the servers row of guild {GUILD} with what hangs on them "
            f"(persona {PERSONA_ID}, memories), and the shard's two queues (--shard) when empty and "
            "unused. --topology: also the worker's exchanges and queues on the vhost, each only when empty "
            "and unused.",
            (
                option(
                    "--topology",
                    action="store_true",
                    help="also delete the worker's queues and exchanges (only those empty and unused)",
                ),
                _shard_option("the shard whose queues to delete (the one `send` spoke as)"),
                Setting("postgres_dsn"),
                Setting("rabbitmq_url"),
            ),
        ),
    ),
)


def add_demo_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], epilog: str, add_options: AddSettings
) -> None:
    """``worker demo seed | send | clean``; ``add_options`` adds the connection options (worker/cli.py
    ``add_setting_options``)."""
    add_command(commands, DEMO, add_options, lambda _action: epilog)
