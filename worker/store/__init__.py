"""Postgres: the asyncpg pool (`pool`), the numbered SQL migrations (`migrate`), the repository's SQL
(`repository`)."""

__all__ = ["migrate", "pool", "repository"]
