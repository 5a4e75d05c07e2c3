"""AsyncAPI 3 document of the whole contract (CONTRACT.md), generated beside the JSON Schemas.

The payloads point at the schema files in the same folder (``tool_call_event.v1.json`` …), so the
document and the schemas cannot disagree; ``python -m contracts.schemas`` writes both and ``--check``
fails when either drifts from the models.

It targets AsyncAPI 3.0.0, which every 3.x tool reads (3.1.0 adds nothing this document needs), and
the AMQP bindings 0.3.0: ``deliveryMode`` and ``mandatory`` are operation bindings there, the message
binding carries only ``messageType``. ``@asyncapi/parser`` 3.x parses it without errors.
"""

from __future__ import annotations

from typing import Any

from contracts.models import EVENT_TYPE, NOTIFICATION_TYPE, RESULT_TYPE, TOOL_NAMES
from contracts.names import (
    DEAD_LETTER_EXCHANGE,
    INVALIDATION_CHANNEL,
    NOTIFICATIONS_EXCHANGE,
    SHARD_ROUTING_KEY,
    TOOL_CALLS_EXCHANGE,
    TOOL_RESULTS_EXCHANGE,
    TOOL_ROUTING_KEY,
    TRACEPARENT_HEADER,
)

ASYNCAPI_FILE = "asyncapi.v3.json"
#: the channels' addresses, with AsyncAPI's parameters in them
_TOOL_ADDRESS = TOOL_ROUTING_KEY.format(tool_name="{toolName}")
_SHARD_ADDRESS = SHARD_ROUTING_KEY.format(shard_id="{shardId}")
_AMQP = "0.3.0"  # AMQP bindings version


def _exchange(name: str) -> dict[str, Any]:
    return {
        "amqp": {
            "is": "routingKey",
            "exchange": {"name": name, "type": "topic", "durable": True, "autoDelete": False, "vhost": "/"},
            "bindingVersion": _AMQP,
        }
    }


def _message(
    name: str, schema_file: str, summary: str, amqp_type: str | None, id_prefix: str
) -> dict[str, Any]:
    message: dict[str, Any] = {
        "name": name,
        "title": name,
        "summary": summary,
        "contentType": "application/json",
        "payload": {"$ref": schema_file},
    }
    if amqp_type is not None:
        message["correlationId"] = {
            "description": "AMQP correlation_id: the model's tool_call_id",
            "location": "$message.header#/correlation_id",
        }
        message["headers"] = {
            "type": "object",
            "properties": {
                TRACEPARENT_HEADER: {"type": "string", "description": "W3C trace context, carried through"}
            },
        }
        message["bindings"] = {"amqp": {"messageType": amqp_type, "bindingVersion": _AMQP}}
        message["description"] = (
            f"AMQP properties: content_type=application/json, delivery_mode=2, type={amqp_type}, "
        )
        message["description"] += f"message_id={id_prefix}<event_id>."
    return message


def asyncapi_document() -> dict[str, Any]:
    """The AsyncAPI 3.0 document describing every channel, message and operation of the worker."""
    shard_parameter = {"shardId": {"description": "the event's shard_id: integer >= 0"}}
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "TomoriBot LTM worker",
            "version": "1.0.0",
            "description": "Long-term memory creation for TomoriBot: shards publish create_long_term_memory "
            "tool calls, the worker answers each with one result (and a notice after a save) and "
            "invalidates the shards' caches over Redis. Wire contract version 1.",
        },
        "defaultContentType": "application/json",
        "servers": {
            "rabbitmq": {"host": "localhost:5672", "protocol": "amqp", "protocolVersion": "0-9-1"},
            "redis": {"host": "localhost:6379", "protocol": "redis"},
        },
        "channels": {
            "toolCalls": {
                "address": _TOOL_ADDRESS,
                "title": TOOL_CALLS_EXCHANGE,
                "description": "Shards publish tool-call events here; queue ltm.create_memory (quorum) "
                "is bound with both tool names.",
                "parameters": {
                    "toolName": {"enum": list(TOOL_NAMES), "description": "the tool, or its alias"}
                },
                "servers": [{"$ref": "#/servers/rabbitmq"}],
                "messages": {"toolCall": {"$ref": "#/components/messages/toolCall"}},
                "bindings": _exchange(TOOL_CALLS_EXCHANGE),
            },
            "toolResults": {
                "address": _SHARD_ADDRESS,
                "title": TOOL_RESULTS_EXCHANGE,
                "description": "Exactly one logical result per event; may be re-emitted with replayed=true. "
                "Each shard declares and binds its own durable queue tomori.shard.{shardId}.results with "
                "shard.{shardId} (contracts/CONTRACT.md).",
                "parameters": shard_parameter,
                "servers": [{"$ref": "#/servers/rabbitmq"}],
                "messages": {"toolResult": {"$ref": "#/components/messages/toolResult"}},
                "bindings": _exchange(TOOL_RESULTS_EXCHANGE),
            },
            "notifications": {
                "address": _SHARD_ADDRESS,
                "title": NOTIFICATIONS_EXCHANGE,
                "description": "The notice to show in the channel, after a successful save only. Each "
                "shard declares and binds its own durable queue tomori.shard.{shardId}.notifications with "
                "shard.{shardId} (contracts/CONTRACT.md).",
                "parameters": shard_parameter,
                "servers": [{"$ref": "#/servers/rabbitmq"}],
                "messages": {"notification": {"$ref": "#/components/messages/notification"}},
                "bindings": _exchange(NOTIFICATIONS_EXCHANGE),
            },
            "deadLetters": {
                "address": _TOOL_ADDRESS,
                "title": DEAD_LETTER_EXCHANGE,
                "description": "Messages that could not be processed, body and properties unchanged, with "
                "x-ltm-* headers; queue ltm.create_memory.dlq (bound with #). `worker dlq` inspects and "
                "replays them.",
                "parameters": {"toolName": {"enum": list(TOOL_NAMES)}},
                "servers": [{"$ref": "#/servers/rabbitmq"}],
                "messages": {"deadLetter": {"$ref": "#/components/messages/deadLetter"}},
                "bindings": _exchange(DEAD_LETTER_EXCHANGE),
            },
            "cacheInvalidation": {
                "address": INVALIDATION_CHANNEL,
                "title": "Redis pub/sub channel",
                "description": "Published after the transaction commits, once per successful save.",
                "servers": [{"$ref": "#/servers/redis"}],
                "messages": {"cacheInvalidation": {"$ref": "#/components/messages/cacheInvalidation"}},
            },
        },
        "operations": {
            # the worker acks an event only once its outputs are confirmed
            "receiveToolCall": _operation("receive", "toolCalls", "toolCall", {"ack": True}),
            # persistent, mandatory (an unroutable output is a transient fault) and publisher-confirmed
            "sendToolResult": _operation("send", "toolResults", "toolResult", _PUBLISH),
            "sendNotification": _operation("send", "notifications", "notification", _PUBLISH),
            "sendDeadLetter": _operation("send", "deadLetters", "deadLetter", _PUBLISH),
            "sendCacheInvalidation": _operation("send", "cacheInvalidation", "cacheInvalidation"),
        },
        "components": {
            "messages": {
                "toolCall": _message(
                    EVENT_TYPE,
                    "tool_call_event.v1.json",
                    "A create_long_term_memory tool call",
                    EVENT_TYPE,
                    "",
                ),
                "toolResult": _message(
                    RESULT_TYPE,
                    "tool_result.v1.json",
                    "The result handed back to the model",
                    RESULT_TYPE,
                    "result:",
                ),
                "notification": _message(
                    NOTIFICATION_TYPE,
                    "notification.v1.json",
                    "The notice to show after a save",
                    NOTIFICATION_TYPE,
                    "notice:",
                ),
                "deadLetter": {
                    "name": "dead_letter",
                    "title": "dead letter",
                    "summary": "The original message with the worker's diagnosis in its headers",
                    "headers": {"$ref": "dead_letter_headers.v1.json"},
                    "payload": {"description": "the original body, unchanged (may not be JSON)"},
                },
                "cacheInvalidation": _message(
                    "cache_invalidation.v1", "cache_invalidation.v1.json", "Drop a cached state", None, ""
                ),
            }
        },
    }


_PUBLISH = {"deliveryMode": 2, "mandatory": True}


def _operation(action: str, channel: str, message: str, amqp: dict[str, Any] | None = None) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "action": action,
        "channel": {"$ref": f"#/channels/{channel}"},
        "messages": [{"$ref": f"#/channels/{channel}/messages/{message}"}],
    }
    if amqp is not None:
        operation["bindings"] = {"amqp": {**amqp, "bindingVersion": _AMQP}}
    return operation
