"""The operator's commands beside `worker run`: `worker check` (`check`), `worker dlq` (`dlq`) and
`worker demo` (`demo`)."""

__all__ = ["check", "demo", "dlq"]
