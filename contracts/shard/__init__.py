"""The shard side of the wire contract in Python: the kit for a Python shard (docs/python-shard.md).

What the TypeScript kit (contracts/typescript) gives a TypeScript shard, on aio-pika and redis-py, both
dependencies of this package already:

- :class:`LtmClient`: ``await LtmClient.connect(url, shard_id, on_notice=...)``, then
  ``await client.create_memory(tool_call_id=..., arguments=..., context=...)`` returns the typed
  :class:`contracts.models.ToolResult`; notices, late and duplicate results, the AMQP ``user_id`` and the
  shard's own routing key with its fallback, the typed refusals of :mod:`contracts.shard.errors`;
- :class:`InvalidationSubscriber` and :func:`invalidation_id_of`: the Redis invalidations by kind;
- :func:`build_context` (with :class:`MemberInput`, :class:`ParticipantInput`, :class:`ReplyViaInput`): the
  event's ``context`` from plain data, the TypeScript kit's ``buildContext``;
- the message models themselves are :mod:`contracts.models` (``ToolResult``, ``Notification``,
  ``EventContext``, ``Status``).
"""

from contracts.shard.client import (
    DEFAULT_TIMEOUT,
    GUILD_IN_FLIGHT_MAX,
    PER_SHARD_RETRY,
    LateResultInfo,
    LateResultReason,
    LtmClient,
    shard_work_queue,
    tool_routing_keys,
    user_of_url,
)
from contracts.shard.context import MemberInput, ParticipantInput, ReplyViaInput, build_context
from contracts.shard.errors import (
    InvalidEventError,
    LtmBacklogFullError,
    LtmClientError,
    LtmClosedError,
    LtmEventTooLargeError,
    LtmGuildBusyError,
    LtmIdentityError,
    LtmPublishRefusedError,
    LtmPublishRejectedError,
    LtmTimeoutError,
    LtmUnroutableError,
)
from contracts.shard.invalidation import INVALIDATION_CHANNEL, InvalidationSubscriber, invalidation_id_of

__all__ = [
    "DEFAULT_TIMEOUT",
    "GUILD_IN_FLIGHT_MAX",
    "INVALIDATION_CHANNEL",
    "PER_SHARD_RETRY",
    "InvalidEventError",
    "InvalidationSubscriber",
    "LateResultInfo",
    "LateResultReason",
    "LtmBacklogFullError",
    "LtmClient",
    "LtmClientError",
    "LtmClosedError",
    "LtmEventTooLargeError",
    "LtmGuildBusyError",
    "LtmIdentityError",
    "LtmPublishRefusedError",
    "LtmPublishRejectedError",
    "LtmTimeoutError",
    "LtmUnroutableError",
    "MemberInput",
    "ParticipantInput",
    "ReplyViaInput",
    "build_context",
    "invalidation_id_of",
    "shard_work_queue",
    "tool_routing_keys",
    "user_of_url",
]
