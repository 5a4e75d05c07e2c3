"""Postgres: the asyncpg pool (`pool`), the numbered SQL migrations (`migrate`), the SQL of the pipeline, its
ledger and its invalidation outbox (`repository`), of the shards' own queues (`shard_queues`) and of what the
workers saw of each shard (`activity`)."""

__all__ = ["activity", "migrate", "pool", "repository", "shard_queues"]
