"""Simulators shared by the end-to-end tests and the bench: child processes and bot shards.

``process`` runs ``python -m <module>`` children (worker processes, the bench's echo consumers) in the
checkout, each in a session of its own with its output in a log file; ``shard`` is a bot shard's AMQP side
as contracts/CONTRACT.md has it. The tests (tests/support/harness.py) put a recording face on them, the bench
(bench/fleet.py, bench/shards.py) a fast one for many shards. Not shipped: the wheel and the image hold
``contracts`` and ``worker`` only.
"""
