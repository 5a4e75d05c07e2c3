"""The running worker: one connection's consume loop (`consumer`), what it runs on (`services`), one delivery
from body to ack (`handler`), carrying out an ack, retry, dead letter or hand-back (`delivery`), at most N
events at once (`slots`), a shard's share (`hand`, `shard_queue_set`), reconnect delays (`backoff`) and the
start-up collector freeze (`heap`). The process's lifecycle (`worker run`) is worker/runner.py, beside the
composition root (worker/bootstrap.py) it calls; the failure policy is worker/service/policy.py."""

__all__ = [
    "backoff",
    "consumer",
    "delivery",
    "hand",
    "handler",
    "heap",
    "services",
    "shard_queue_set",
    "slots",
]
