"""The service layer: process tool-call events against Postgres (read, decide with the pipeline, write),
alone or in batches; between the rules (``worker.pipeline``) and the adapters (``worker.store``, broker).

- policy.py: the pure failure policy (retry or dead letter, what the shard is told) and its retry tiers.
  No I/O: it sits with the pipeline at the bottom of the house and may be imported from anywhere;
- process.py: a batch of events against Postgres; batcher.py: the batches; digest.py: an event's digest;
- identity.py: who may speak for a shard.
"""

__all__ = ["batcher", "digest", "identity", "policy", "process"]
