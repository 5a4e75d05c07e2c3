"""What every test tier shares: the poller with a deadline (wait.py), worker processes, the test shard, the
Redis listener and a free port (harness.py), a cuttable TCP proxy (proxy.py), servers of the test's own and
the faults put on them (outages.py), RabbitMQ users of a test's own, a shard's or an operator (users.py). No
tier imports another tier's files; they all import these."""
