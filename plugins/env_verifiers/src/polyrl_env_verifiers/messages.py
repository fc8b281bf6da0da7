"""polyrl's assistant turns as the OpenAI-style chat messages verifiers reads."""

from __future__ import annotations

import json
from typing import Any

from polyrl.api import AssistantTurn


def assistant_message(turn: AssistantTurn) -> dict[str, Any]:
    """The turn as verifiers' chat message: its text as ``content`` and, when the format parsed
    tool calls in it, ``tool_calls`` as the OpenAI API gives them (arguments as a JSON string),
    which ``ToolEnv.env_response`` executes. No calls, no ``tool_calls`` key: ToolEnv's
    ``no_tools_called`` stop condition reads the key's absence as the final answer."""
    message: dict[str, Any] = {"role": "assistant", "content": turn.text}
    if turn.tool_calls:
        message["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(dict(call.arguments))},
            }
            for call in turn.tool_calls
        ]
    return message
