"""Whether a repeated ``event_id`` is the same event: the digest the ledger keeps beside each outcome.

The ledger answers an ``event_id`` it has seen from the stored outcome (a redelivery, a retry copy, a
``worker dlq replay``). It must do so only for the event that outcome belongs to: another shard that
learnt the id (every shard used to read it from the invalidation channel) and sends its own event under it
would otherwise be handed the stored result and notice (security review 3, section 4). So every outcome is
stored with :func:`event_digest` of the event it answers, and :func:`same_event` decides.

What the digest covers, and why (docs/decisions.md):

- ``tool_call_id``, ``tool_name``, ``shard_id``: the tool call, and the shard the answer goes to;
- the context's ``guild_disc_id``, ``channel_disc_id``, ``thread_id``, ``triggering_user_disc_id``,
  ``bot_user_disc_id``, ``persona_id`` and ``reply_via``: the scope the memory is written in and where the
  notice is shown;
- ``arguments``, whole: what the model asked to remember.

Not covered: ``event_id`` (the key itself), ``schema_version`` (always 1), ``issued_at`` (when the shard
sent it: a shard that publishes the same tool call again may stamp it anew), and ``participants`` and
``guild_members`` (the shard's view of the guild when it sent the event, which it may see changed when it
rebuilds the event; they help resolve the target but do not say what is asked). A genuine redelivery, the
worker's retry copy and a dead-letter replay carry the very bytes of the first delivery, so they match
whatever is covered; a shard's own re-send of the same tool call matches as long as it says the same thing.

The serialisation is canonical: a JSON object with sorted keys and no whitespace (orjson), of the values
as parsed (so key order and spacing in the body do not matter, and what the JSON parser read is what is
hashed), prefixed by a version so the field list can change without old digests colliding with new ones.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any

import orjson

from contracts.models import ToolCallEvent

#: the version of the canonical form (the first key hashed): bump it when the covered fields change
DIGEST_VERSION = 1


def event_digest(event: ToolCallEvent) -> bytes:
    """SHA-256 (32 bytes) of the canonical form of what ``event`` says (see the module's docstring)."""
    ctx = event.context
    canonical = {
        "digest_version": DIGEST_VERSION,
        "tool_call_id": event.tool_call_id,
        "tool_name": event.tool_name,
        "shard_id": event.shard_id,
        "guild_disc_id": ctx.guild_disc_id,
        "channel_disc_id": ctx.channel_disc_id,
        "thread_id": ctx.thread_id,
        "triggering_user_disc_id": ctx.triggering_user_disc_id,
        "bot_user_disc_id": ctx.bot_user_disc_id,
        "persona_id": ctx.persona_id,
        "reply_via": ctx.reply_via.model_dump(mode="json") if ctx.reply_via is not None else None,
        "arguments": event.arguments,
    }
    return hashlib.sha256(_canonical_bytes(canonical)).digest()


def _canonical_bytes(canonical: dict[str, Any]) -> bytes:
    """The canonical JSON; arguments orjson cannot write (a lone surrogate, nesting past its 255 levels,
    arguments read around as unreadable) fall back to the standard library's escaping writer, and past that
    to their type: such arguments are answered as invalid, and the same bytes give the same digest."""
    try:
        return orjson.dumps(canonical, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        pass
    try:
        return json.dumps(canonical, sort_keys=True, separators=(",", ":"), default=repr).encode()
    except (RecursionError, ValueError, TypeError):
        marker = {"unserialisable": type(canonical["arguments"]).__name__}
        return orjson.dumps({**canonical, "arguments": marker}, option=orjson.OPT_SORT_KEYS)


def same_event(stored: Mapping[str, Any], event: ToolCallEvent, digest: bytes) -> bool:
    """True when the ledger row ``stored`` answers ``event`` (whose :func:`event_digest` is ``digest``).

    ``stored`` holds the row's ``digest`` (hex, ``None`` for a row written before migration 0006) and
    the columns every row has always had: ``tool_call_id``, ``tool_name``, ``shard_id``, and the stored
    ``notice`` (a save's). A row with a digest matches only the same digest. A legacy row (no digest: its
    event's arguments were never stored, so none can be computed) matches an event with the same
    ``tool_call_id``, ``tool_name`` and ``shard_id`` and, for a save, the same guild, channel and thread as
    its notice: a genuine redelivery or replay of an event from before the upgrade is still answered, while
    an event that knows only the ``event_id`` (all the invalidation channel ever carried) is refused.
    """
    stored_digest = stored.get("digest")
    if stored_digest is not None:
        return hmac.compare_digest(str(stored_digest), digest.hex())
    if (
        stored.get("tool_call_id") != event.tool_call_id
        or stored.get("tool_name") != event.tool_name
        or stored.get("shard_id") != event.shard_id
    ):
        return False
    notice = stored.get("notice")
    if not isinstance(notice, Mapping):
        return True
    ctx = event.context
    return (
        notice.get("guild_disc_id") == ctx.guild_disc_id
        and notice.get("channel_disc_id") == ctx.channel_disc_id
        and notice.get("thread_id") == ctx.thread_id
    )
