"""What a bot team's own integration tests need to run the worker for real (containers, fixtures).

- `worker.testing.images`: the services' images, pinned, each overridable from `LTM_*_IMAGE`;
- `worker.testing.containers`: Postgres, RabbitMQ and Redis containers with a bounded start and readiness
  that means ready (testcontainers, imported only when a container starts: the `testing` extra);
- `worker.testing.engine`: one container started with a bounded start (the deadline, the published address);
- `worker.testing.management`: the RabbitMQ management API (vhosts, users, permissions), standard library;
- `worker.testing.stack`: `LtmStack`, the services plus `worker migrate` and `worker run` processes, and a
  confined shard user per test (`LtmShard.client()`: the Python shard kit `contracts.shard` as that shard);
- `worker.testing.permissions`: the worker's and a shard's RabbitMQ grants, the Redis users;
- `worker.testing.process`: a `python -m` child with its own log file (the repository's one process runner);
- `worker.testing.workers`: one `worker run` process (its probe port, its log, its stop);
- `worker.testing.seed`: bot rows as the bot would write them (`BotRows`), a try-out's guild and events that
  name it;
- `worker.testing.pytest_plugin`: the `ltm_stack` and `ltm_shard` fixtures (docs/testing-your-shard.md).
"""
