"""The service layer: process tool-call events against Postgres (read, decide with the pipeline, write),
alone or in batches; between the rules (``worker.pipeline``) and the adapters (``worker.store``, broker)."""

__all__ = ["batcher", "digest", "process"]
