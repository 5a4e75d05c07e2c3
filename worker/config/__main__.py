"""``python -m worker.config``: the README's configuration table, rendered from the settings' declaration."""

from worker.config.render import configuration_table

print(configuration_table())
