"""Operator commands declared as data: ``worker dlq`` and ``worker demo`` each list their actions (name, help,
description, options) and :func:`add_command` builds the argparse parsers from the list.

An action's options are :class:`Option` (an ``add_argument`` call) and :class:`Setting` (the command-line
option of a setting, added by ``worker/cli.py``'s ``add_setting_options``, so its help, default and
environment variable come from the one settings declaration), in the order ``--help`` shows them.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Option:
    """``parser.add_argument(*flags, **arguments)``."""

    flags: tuple[str, ...]
    arguments: dict[str, Any]


def option(*flags: str, **arguments: Any) -> Option:
    return Option(flags, arguments)


@dataclass(frozen=True, slots=True)
class Setting:
    """The command-line option of the setting ``name`` (a field of :class:`worker.config.Settings`)."""

    name: str


@dataclass(frozen=True, slots=True)
class AllSettings:
    """The command-line options of every setting that has one (``worker run``'s)."""


@dataclass(frozen=True, slots=True)
class Action:
    """One subcommand: ``worker COMMAND NAME``."""

    name: str
    help: str
    description: str
    options: Sequence[Option | Setting | AllSettings] = ()

    @property
    def settings(self) -> tuple[str, ...]:
        """The settings it takes options for (what it reads from the environment)."""
        return tuple(item.name for item in self.options if isinstance(item, Setting))


@dataclass(frozen=True, slots=True)
class Command:
    """``worker NAME ACTION``: a command made of actions."""

    name: str
    help: str
    description: str
    #: the attribute of the parsed arguments that names the action, and how ``--help`` calls it
    dest: str
    metavar: str
    actions: Sequence[Action] = field(default_factory=tuple)


#: ``add_setting_options(parser, *names)`` of worker/cli.py
AddSettings = Callable[..., None]


def add_command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    command: Command,
    add_settings: AddSettings,
    epilog: Callable[[Action | None], str],
) -> argparse.ArgumentParser:
    """Add ``command`` and its actions to the ``worker`` parser; ``epilog(action)`` is the text under each
    ``--help`` (``None``: the command's own)."""
    parser = commands.add_parser(
        command.name,
        help=command.help,
        description=command.description,
        epilog=epilog(None),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest=command.dest, required=True, metavar=command.metavar)
    for action in command.actions:
        add_action(actions, action, add_settings, epilog(action))
    return parser


def add_action(
    actions: argparse._SubParsersAction[argparse.ArgumentParser],
    action: Action,
    add_settings: AddSettings,
    epilog: str,
) -> argparse.ArgumentParser:
    """Add ``action``'s parser, its options in order, ``epilog`` under its ``--help``."""
    sub = actions.add_parser(
        action.name,
        help=action.help,
        description=action.description,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for item in action.options:
        if isinstance(item, AllSettings):
            add_settings(sub)
        elif isinstance(item, Setting):
            add_settings(sub, item.name)
        else:
            sub.add_argument(*item.flags, **item.arguments)
    return sub
