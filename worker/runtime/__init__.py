"""The running worker: `worker run`'s lifecycle (`runner`), one connection's consume loop (`consumer`), one
delivery from body to ack (`handler`), the pure failure policy and in-flight slots (`settle`), reconnect
delays (`backoff`), the start-up collector freeze (`heap`) and small asyncio helpers (`aio`)."""

__all__ = ["aio", "backoff", "consumer", "handler", "heap", "runner", "settle"]
