"""Tool calls in assistant text, by ``actor_rollout_ref.rollout.multi_turn.format``.

``hermes`` (Qwen2/2.5, SmolLM2 and most open models' templates, verl's default): each call is
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; a last ``<tool_call>`` that the
turn ends without closing runs to the end of the turn (small models often stop right after the
JSON). A block that is not such JSON is reported as an error line of the turn (the environment
answers it), never raised.
"""

from __future__ import annotations

import json
import re

from polyrl.envs.episode import ToolCall

_HERMES = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)


def parse_hermes(text: str, turn: int) -> tuple[list[ToolCall], list[str]]:
    """``(calls, errors)`` of ``text``; call ids are ``call_<turn>_<k>``."""
    calls: list[ToolCall] = []
    errors: list[str] = []
    for k, match in enumerate(_HERMES.finditer(text)):
        body = match.group(1).strip()
        try:
            data = json.loads(body)
        except json.JSONDecodeError as exc:
            errors.append(f"tool call {k} is not JSON ({exc.msg} at {exc.pos}): {body[:80]!r}")
            continue
        name = data.get("name") if isinstance(data, dict) else None
        arguments = data.get("arguments", {}) if isinstance(data, dict) else None
        if isinstance(arguments, str):  # some models write the arguments as JSON text
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                arguments = None
        if not isinstance(name, str) or not isinstance(arguments, dict):
            errors.append(
                f"tool call {k} needs a string name and an arguments object: {body[:80]!r}"
            )
            continue
        calls.append(ToolCall(name=name, arguments=arguments, id=f"call_{turn}_{k}"))
    return calls, errors


PARSERS = {"hermes": parse_hermes}
