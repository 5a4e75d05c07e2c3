"""``python -m worker.config``: docs/configuration.md's table, rendered from the settings' declaration."""

from worker.config.render import configuration_table

print(configuration_table())
