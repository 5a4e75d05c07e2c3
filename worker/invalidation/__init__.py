"""Cache invalidations: the Redis pub/sub publisher (`redis`) and the Postgres outbox that holds them while
Redis does not answer (`outbox`)."""

__all__ = ["outbox", "redis"]
