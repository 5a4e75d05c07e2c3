"""The running worker: `worker run`'s lifecycle (`runner`), one connection's consume loop (`consumer`), one
delivery from body to ack (`handler`), carrying out how a delivery ends (`delivery`), the pure failure policy
and in-flight slots (`settle`), reconnect delays (`backoff`), the start-up collector freeze (`heap`) and small
asyncio helpers (`aio`)."""

__all__ = ["aio", "backoff", "consumer", "delivery", "handler", "heap", "runner", "settle"]
