"""What the client reads of RabbitMQ and its URL: a tool's routing keys, the user a URL logs in as, and a
refusal (a login, a vhost, a ``user_id``, a topic permission) said in plain words."""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit

import aiormq.exceptions

from contracts.names import TOOL_CALLS_EXCHANGE, shard_tool_routing_key, tool_routing_key


def tool_routing_keys(tool_name: str, shard_id: int) -> tuple[str, str]:
    """The routing keys of a tool's events: ``tool.<name>`` (version 1, the common work queue) and the shard's
    own ``tool.<name>.shard.<id>`` (its queue ``ltm.create_memory.shard.<id>``, once the workers bound it)."""
    common = tool_routing_key(tool_name)
    return common, shard_tool_routing_key(common, shard_id)


def user_of_url(url: str) -> str:
    """The user aio-pika logs in as for ``url``: the URL's, percent-decoded; ``guest`` when it has none."""
    return unquote(urlsplit(url).username or "") or "guest"


def refusal_of(error: BaseException, url: str) -> str | None:
    """The plain sentence for a connection RabbitMQ refused while opening (a login it does not accept, a vhost
    that does not exist or the user may not use), or None for any other failure."""
    parts = urlsplit(url)
    user = unquote(parts.username or "") or "guest"
    vhost = unquote(parts.path[1:]) or "/"
    text = str(error)
    if isinstance(error, aiormq.exceptions.ProbableAuthenticationError) or "ACCESS_REFUSED" in text:
        return (
            f'RabbitMQ refused the login of user "{user}" (ACCESS_REFUSED): check the user and password in '
            f"the URL ({text})"
        )
    if "Connection.OpenOk" in text and "Connection.Close" in text:
        return (
            f'RabbitMQ refused vhost "{vhost}" to user "{user}": the vhost does not exist or the user has no '
            f"permissions on it (rabbitmqctl list_vhosts; rabbitmqctl list_user_permissions {user})"
        )
    return None


def _broker_text(error: BaseException) -> str:
    """The broker's own sentence out of an aiormq channel error."""
    text = str(error)
    match = re.search(r'"([A-Z_]+ - .*)"\s*$', text)
    return match.group(1) if match else text


def _refused_topic(error: BaseException) -> str | None:
    """The routing key of a topic permission refusal on tomori.tool_calls, else None."""
    match = re.search(
        r"access to topic '([^']*)' in exchange '" + re.escape(TOOL_CALLS_EXCHANGE) + "'", str(error)
    )
    return match.group(1) if match else None
