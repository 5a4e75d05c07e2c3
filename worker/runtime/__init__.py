"""The running worker: `worker run`'s lifecycle (`runner`), one connection's consume loop (`consumer`), one
delivery from body to ack (`handler`), carrying out an ack, retry, dead letter or hand-back (`delivery`), the
pure failure policy and its retry tiers (`policy`), at most N events at once (`slots`), reconnect delays
(`backoff`), the start-up collector freeze (`heap`) and small asyncio helpers (`aio`)."""

__all__ = ["aio", "backoff", "consumer", "delivery", "handler", "heap", "policy", "runner", "slots"]
