"""The tool the model calls (CONTRACT.md section 3): its description and parameters, the original bot's
verbatim, the ``arguments`` a call carries as the model writes them, and the declaration a shard gives its
model.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, NotRequired

from pydantic import Field
from typing_extensions import TypedDict  # pydantic reads only this TypedDict on Python 3.11

from contracts.models.fields import TOOL_NAMES

#: The tool the model calls: its name and description, the original bot's verbatim (CONTRACT.md section 3).
TOOL_DESCRIPTION = (
    "Use this function when you identify a new, distinct piece of information, fact, preference, or "
    "instruction during the conversation that seems important to remember for future interactions. This "
    "helps you learn and adapt. Specify if the information is a general server-wide fact or something "
    "specific about a user. Avoid saving information that is already known or redundant. IMPORTANT: Use "
    "{bot} instead of hardcoded bot names and {user} instead of hardcoded user names in your memory content "
    "to prevent confusion when names change. Be proactive in remembering user or server preferences, "
    "interests, and facts. Do not wait for the user to ask you to remember things and be proactive but "
    "avoid saving PII (real names, addresses, and contact info)"
)
#: the parameters the model is shown, with the original's descriptions, in the original's order
TOOL_PARAMETERS: dict[str, str] = {
    "memory_content": "The specific piece of information, fact, or preference to remember. Be concise and "
    "clear. Write in third-person. Use {user} to refer to the target user and {bot} to refer to yourself; "
    "never hardcode names. Example: '{user} likes dogs' or '{bot} should greet {user} formally'.",
    "memory_scope": "Specify the scope of this memory. Use 'server_wide' for general information applicable "
    "to the whole server, or 'target_user' for information specific to a particular user.",
    "target_user": "If memory_scope is 'target_user', provide the target user's name as shown in the current "
    "conversation or server. Use natural names, not IDs.",
}
MemoryScope = Literal["server_wide", "target_user"]


class CreateMemoryArguments(TypedDict):
    """The `arguments` of a create_long_term_memory tool call as the model writes them: `memory_content`
    and `memory_scope` always, and for `target_user` the person's name as the conversation shows it
    (`target_user`). The worker reads the arguments verbatim and judges them (a wrong shape is answered
    memory_save_failed_invalid_args, CONTRACT.md section 4), ignoring keys it does not know; the model's
    tool declaration (create_long_term_memory.tool.json) lists the first three keys only.
    `target_user_nickname` and `target_user_discord_id` are the bot's legacy names for the target, still
    read (the first non-empty of `target_user`, `target_user_nickname`, `target_user_discord_id` is the
    target); a shard does not need them."""

    memory_content: Annotated[str, Field(description=TOOL_PARAMETERS["memory_content"])]
    memory_scope: Annotated[MemoryScope, Field(description=TOOL_PARAMETERS["memory_scope"])]
    target_user: NotRequired[Annotated[str, Field(description=TOOL_PARAMETERS["target_user"])]]
    target_user_nickname: NotRequired[Annotated[str, Field(description="Legacy name of target_user.")]]
    target_user_discord_id: NotRequired[
        Annotated[str, Field(description="Legacy: the target's Discord id (the model is told to use names).")]
    ]


def tool_declaration() -> dict[str, Any]:
    """The model's tool declaration (name, description, JSON Schema of the parameters), as the original bot
    declares it: the shape function-calling APIs take, with the original's texts."""
    return {
        "name": TOOL_NAMES[0],
        "description": TOOL_DESCRIPTION,
        "parameters": {
            "type": "object",
            "properties": {
                "memory_content": {"type": "string", "description": TOOL_PARAMETERS["memory_content"]},
                "memory_scope": {
                    "type": "string",
                    "enum": ["server_wide", "target_user"],
                    "description": TOOL_PARAMETERS["memory_scope"],
                },
                "target_user": {"type": "string", "description": TOOL_PARAMETERS["target_user"]},
            },
            "required": ["memory_content", "memory_scope"],
        },
    }
