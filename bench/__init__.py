"""The load generator and measuring instrument: ``python -m bench`` from a checkout.

Not part of the shipped worker: the wheel and the image hold ``contracts`` and ``worker`` only, and nothing
in ``worker`` imports this package (tests/unit/test_bench_packaging.py).

``world`` (who exists) and ``workload`` (what happens, and how each event must end) are plain data;
``seed`` writes the world into a fresh database of the ``sandbox``; ``shards`` play the events against a
``fleet`` of workers; ``ceilings`` measure RabbitMQ alone and Postgres alone for the same work; ``cpu``
reads where the time went; ``report`` prints it; ``run`` ties them together.
"""
