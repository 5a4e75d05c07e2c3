"""What a call of the Python shard kit can fail with; the same classes and words as the TypeScript kit's
(contracts/typescript/src/errors.ts)."""

from __future__ import annotations

__all__ = [
    "InvalidEventError",
    "LtmBacklogFullError",
    "LtmClientError",
    "LtmClosedError",
    "LtmEventTooLargeError",
    "LtmGuildBusyError",
    "LtmIdentityError",
    "LtmPublishRefusedError",
    "LtmPublishRejectedError",
    "LtmTimeoutError",
    "LtmUnroutableError",
]


class LtmClientError(Exception):
    """Base class of every error the kit raises."""


class InvalidEventError(LtmClientError, ValueError):
    """The event cannot be built: a context the contract does not allow, an ``event_id`` that is not a
    canonical UUID. Nothing was published."""


class LtmTimeoutError(LtmClientError, TimeoutError):
    """No result arrived within the call's timeout. The event was published (or is waiting for the broker), so
    the worker may still process it: the memory may already be saved or be saved later. A result that arrives
    afterwards goes to ``on_late_result``, never to this call."""

    def __init__(self, event_id: str, tool_call_id: str, timeout: float) -> None:
        self.event_id, self.tool_call_id, self.timeout = event_id, tool_call_id, timeout
        super().__init__(
            f"no result for event {event_id} (tool call {tool_call_id}) within {timeout:g} s; the memory may "
            "still have been saved, a late result goes to on_late_result"
        )


class LtmUnroutableError(LtmClientError):
    """The broker returned the event: nothing is bound to ``tomori.tool_calls`` for its routing key."""

    def __init__(self, event_id: str, routing_key: str, reply_text: str) -> None:
        self.event_id, self.routing_key = event_id, routing_key
        super().__init__(
            f"event {event_id} could not be routed from tomori.tool_calls with {routing_key} ({reply_text}): "
            "is the worker's topology declared (worker run, or deploy/rabbitmq/definitions.json)?"
        )


class LtmPublishRejectedError(LtmClientError):
    """The broker refused the event (a nack); the kit raises the subclass :class:`LtmBacklogFullError`."""

    def __init__(self, event_id: str, message: str | None = None) -> None:
        self.event_id = event_id
        super().__init__(
            message
            or f"the broker refused event {event_id} (nack); nothing was saved, the call may be retried"
        )


class LtmBacklogFullError(LtmPublishRejectedError):
    """The broker refused the event (``basic.nack``) because the queue it was routed to is at its bound
    (``x-overflow: reject-publish``): nothing was enqueued, nothing saved. With the per-shard key that queue
    is the shard's own ``ltm.create_memory.shard.<id>`` (the shard has its share waiting: it sends faster
    than the workers answer, or no worker runs); with ``tool.<name>`` it is the common ``ltm.create_memory``.
    Retry later with the same ``event_id``, more slowly."""

    code = "backlog_full"

    def __init__(self, event_id: str, shard_id: int, routing_key: str, queue: str, per_shard: bool) -> None:
        self.shard_id, self.routing_key, self.queue, self.per_shard = shard_id, routing_key, queue, per_shard
        if per_shard:
            why = (
                f"RabbitMQ refused event {event_id} (nack): shard {shard_id}'s own queue {queue} is at its "
                "bound, so this shard has as many events waiting as it may (it sends faster than the workers "
                "answer, or no worker runs). "
            )
        else:
            why = (
                f"RabbitMQ refused event {event_id} (nack): the common work queue {queue} is at its bound "
                "(every shard's events wait there: the workers are behind, or none runs). "
            )
        super().__init__(
            event_id,
            why
            + "Nothing was saved. Slow down and retry later with the same event_id; check that workers run "
            f"(worker check; the consumers of {queue}) and the queue's depth against its bound "
            "(rabbitmqctl list_queues name messages consumers; its x-max-length or policy).",
        )


class LtmIdentityError(LtmClientError):
    """RabbitMQ refused the event's AMQP ``user_id``: it must be the user the connection logged in as (the
    channel is closed with ``PRECONDITION_FAILED``). The kit sets it to the URL's user unless ``user_id`` says
    otherwise, so that option names another user, or the broker authenticated the connection under another
    name. Nothing was enqueued; every later call of this client fails the same way, at once."""

    code = "identity_refused"

    def __init__(self, event_id: str, user_id: str, broker_text: str) -> None:
        self.event_id, self.user_id = event_id, user_id
        super().__init__(
            f'RabbitMQ refused event {event_id}: its user_id "{user_id}" is not the user this connection '
            f"logged in as ({broker_text}). Set the client's user_id option to the user the broker "
            "authenticates (or False to send none, which a worker with LTM_SHARD_IDENTITY=required refuses); "
            "nothing was published"
        )


class LtmPublishRefusedError(LtmClientError):
    """RabbitMQ refused this shard's user the event's routing key (its topic permission on
    ``tomori.tool_calls``)."""

    code = "publish_refused"

    def __init__(self, event_id: str, routing_key: str, broker_text: str) -> None:
        self.event_id, self.routing_key = event_id, routing_key
        super().__init__(
            f"RabbitMQ refused event {event_id} with routing key {routing_key} ({broker_text}): the shard's "
            "user may not publish it to tomori.tool_calls. Give it the topic permission "
            "deploy/rabbitmq/shard_users.py writes; nothing was published"
        )


class LtmEventTooLargeError(LtmClientError):
    """The event's body is over the worker's 256 KiB limit: it would be dead-lettered without an answer."""

    def __init__(self, event_id: str, size: int) -> None:
        self.event_id, self.size = event_id, size
        super().__init__(
            f"event {event_id} is {size} bytes, over the contract's 256 KiB: not published (the worker "
            "answers no such event)"
        )


class LtmGuildBusyError(LtmClientError):
    """One guild (a direct message: its channel) already has ``guild_in_flight_max`` calls of this client
    waiting for their results: this one was not published, nothing was saved. The usual cause is a loop in
    the bot calling the memory tool over and over in that guild; the shard's other guilds are not held up by
    it. Tell the model the tool is busy and to try again later; retry with the same ``event_id``."""

    code = "guild_busy"

    def __init__(self, event_id: str, guild: str, waiting: int) -> None:
        self.event_id, self.guild, self.waiting = event_id, guild, waiting
        super().__init__(
            f"event {event_id} was not published: guild {guild} already has {waiting} calls waiting for "
            "their results (guild_in_flight_max), so one guild cannot fill its shard's queue ahead of the "
            "others. Nothing was saved; retry later with the same event_id"
        )


class LtmClosedError(LtmClientError):
    """The client was closed while the call waited for its result (or before the call)."""

    def __init__(self, event_id: str | None) -> None:
        self.event_id = event_id
        super().__init__(
            "the LTM client is closed"
            if event_id is None
            else f"the LTM client was closed while event {event_id} waited for its result; the memory may "
            "still be saved"
        )
