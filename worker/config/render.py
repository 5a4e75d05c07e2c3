"""The settings' declaration for people: the configuration table (docs/configuration.md) and the commands'
epilogs.

``python -m worker.config`` prints the table (worker/config/__main__.py).
"""

from __future__ import annotations

from worker.config.env import DeclaredSetting, declared


def table_row(setting: DeclaredSetting) -> str:
    """A setting's row of the configuration table: variable, default (`` `0` (off) ``), meaning."""
    env = setting.env
    default = f"`{setting.default}` ({env.note})" if env.note else f"`{setting.default}`"
    variable = f"`{env.var}` or `{env.file_var}`" if env.file else f"`{env.var}`"
    return f"| {variable} | {default} | {setting.description} |"


def configuration_table() -> str:
    """The configuration table of docs/configuration.md (variable, default, meaning), one row per declared
    setting."""
    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    rows += [table_row(s) for s in declared()]
    return "\n".join(rows)


def environment_help(*fields: str) -> str:
    """The epilog of a command: each variable it reads (every one when no ``fields`` are named) and its
    default, from the settings' declaration."""
    settings = tuple(s for s in declared() if not fields or s.path[-1] in fields)
    width = max(len(s.var) for s in settings) + 2
    lines = [
        "configuration comes from the environment (docs/configuration.md has the full table)"
        + (", this command reads:" if fields else ":")
    ]
    lines += [f"  {s.var:<{width}}default {s.shown_default}" for s in settings]
    files = [s for s in settings if s.env.file]
    lines += [
        "command-line options override the environment; a value a setting does not take falls back to its",
        "default with a warning, and a number with text after it (3O is 3) or a variable with the settings'",
        "prefix that no setting reads (a misspelt name) is warned about too (`worker check` lists them).",
    ]
    if files:
        lines += [
            f"{', '.join(s.var for s in files)} may be given as <VARIABLE>_FILE instead: the path",
            "of a file holding the value (a mounted secret; its trailing line break dropped); both is an "
            "error.",
        ]
    return "\n" + "\n".join(lines) + "\n"
