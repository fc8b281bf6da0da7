"""The ``tools`` environment: the model calls tools (``multi_turn.format``) until it answers.

Each assistant turn's parsed tool calls run concurrently, at most ``multi_turn.max_parallel_calls``
of them (the rest are answered with an error), each under ``tool_timeout_s``. Their results are
the next observation (``tool`` messages). A turn without tool calls is the answer: the episode
ends (``done``) and the run's reward provider scores it against the row's ``ground_truth``, as
verl's tool agent does, unless a verl tool reported a reward (the last one counts).

What the model gets wrong it is told, and the episode goes on: an unknown tool, arguments that do
not fit, a call that does not parse (``tool_errors``). What a tool does wrong ends its episode
only: a call that raises (``tool_error``) or runs past its limit (``tool_timeout``).

With verl's interactions (``multi_turn.interaction_config_path``,
:mod:`polyrl_env_tools.interactions`), a turn without tool calls is answered by the row's
interaction instead, as verl's tool agent loop does: its ``generate_response`` is the next user
message (or ends the episode), and its ``calculate_score`` when the episode ends is the
episode's reward. The per-turn scores ``generate_response`` returns (verl's ``turn_scores``)
are a metric (``multi_turn/interaction_turn_score/mean``: summed over an episode's turns,
averaged over episodes), not rewards: verl does not train on them either.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from polyrl.api import (
    AssistantTurn,
    Environment,
    EnvironmentContext,
    Episode,
    EpisodeResult,
    EpisodeStart,
    Observation,
    ToolCall,
)
from polyrl_env_tools.interactions import load_interactions
from polyrl_env_tools.tools import Tool, ToolOutcome, call_tool, load_tool_config

END_TOOL_ERROR = "tool_error"
END_TOOL_TIMEOUT = "tool_timeout"


class ToolEpisode(Episode):
    """One row's conversation with the tools."""

    def __init__(self, env: ToolEnvironment, row: Mapping[str, Any]) -> None:
        self.env = env
        self.row = row
        self.instances: dict[str, tuple[Any, str]] = {}  # tool name -> (instance, instance id)
        self.reward: float | None = None
        self.messages: list[dict[str, Any]] = []  # the conversation, as an interaction reads it
        self.interaction: Any = None
        self.interaction_kwargs: dict[str, Any] = {}
        self.interaction_id = ""

    async def start(self) -> EpisodeStart:
        kwargs = dict((self.row.get("extra_info") or {}).get("tools_kwargs") or {})
        for tool in self.env.tools.values():
            if tool.instance_class is None:
                continue
            instance = tool.instance_class(tool.config, tool.schema)
            create_kwargs = dict((kwargs.get(tool.name) or {}).get("create_kwargs") or {})
            instance_id = await instance.create(str(uuid.uuid4()), **create_kwargs)
            self.instances[tool.name] = (
                instance,
                instance_id if isinstance(instance_id, str) else "",
            )
        messages = [dict(m) for m in self.row.get("messages") or []]
        if self.env.system_prompt is not None:
            messages = [m for m in messages if m.get("role") != "system"]
            messages.insert(0, {"role": "system", "content": self.env.system_prompt})
        self.messages = [dict(m) for m in messages]
        if self.env.interactions:
            await self._start_interaction()
        return EpisodeStart(
            messages=messages,
            tools=[t.schema for t in self.env.tools.values()],
            prefill=self.env.prefill,
        )

    async def _start_interaction(self) -> None:
        """The row's interaction (``extra_info.interaction_kwargs.name``), started."""
        kwargs = (self.row.get("extra_info") or {}).get("interaction_kwargs")
        if not isinstance(kwargs, Mapping) or "name" not in kwargs:
            raise ValueError(
                "a row needs extra_info.interaction_kwargs with a 'name' (one of "
                f"{sorted(self.env.interactions)}) when multi_turn.interaction_config_path is set"
            )
        name = str(kwargs["name"])
        if name not in self.env.interactions:
            raise ValueError(
                f"no interaction {name!r}: the config has {sorted(self.env.interactions)}"
            )
        self.interaction = self.env.interactions[name]
        self.interaction_kwargs = dict(kwargs)
        self.interaction_id = str(
            await self.interaction.start_interaction(uuid.uuid4().hex, **self.interaction_kwargs)
        )

    async def step(self, turn: AssistantTurn) -> Observation:
        self.messages.append({"role": "assistant", "content": turn.text})
        if not turn.tool_calls and not turn.tool_call_errors:
            if self.interaction is None:
                return Observation(done=True)
            return await self._interact()
        limit = self.env.max_parallel_calls
        calls, refused = turn.tool_calls[:limit], turn.tool_calls[limit:]
        outcomes = await asyncio.gather(*(self._call(c) for c in calls))
        messages = [
            _tool_message(c, o.text if o.error is None else f"error: {o.error}")
            for c, o in zip(calls, outcomes)
        ]
        messages += [
            _tool_message(c, f"error: at most {limit} tool call(s) per turn") for c in refused
        ]
        messages += [{"role": "tool", "content": f"error: {e}"} for e in turn.tool_call_errors]
        model_errors = len(refused) + len(turn.tool_call_errors)
        model_errors += sum(o.by_model for o in outcomes)
        metrics = {
            "tool_calls": float(len(turn.tool_calls)),
            "tool_errors": float(model_errors),
            "tool_output_dropped_bytes": float(sum(o.dropped_bytes for o in outcomes)),
        }
        for outcome in outcomes:
            for key, value in outcome.metrics.items():
                metrics[f"tool/{key}"] = metrics.get(f"tool/{key}", 0.0) + value
            if outcome.reward is not None:
                self.reward = outcome.reward
        self.messages += messages
        failed = [o for o in outcomes if o.error is not None and not o.by_model]
        if failed:
            metrics["tool_errors"] += len(failed)
            reason = END_TOOL_TIMEOUT if any(o.timeout for o in failed) else END_TOOL_ERROR
            return Observation(messages, done=True, end_reason=reason, metrics=metrics)
        return Observation(messages, metrics=metrics)

    async def _call(self, call: ToolCall) -> ToolOutcome:
        tool = self.env.tools.get(call.name)
        if tool is None:
            known = ", ".join(sorted(self.env.tools)) or "none"
            return ToolOutcome(error=f"unknown tool {call.name!r} (tools: {known})", by_model=True)
        instance, instance_id = self.instances.get(call.name, (None, ""))
        return await call_tool(
            tool,
            call.arguments,
            instance=instance,
            instance_id=instance_id,
            timeout_s=self.env.timeout_s,
            max_output_bytes=self.env.max_output_bytes,
        )

    async def _interact(self) -> Observation:
        """The interaction's answer to a turn without tool calls: a user message, or the end."""
        done, response, score, _ = await self.interaction.generate_response(
            self.interaction_id, [dict(m) for m in self.messages], **self.interaction_kwargs
        )
        message = {"role": "user", "content": str(response)}
        self.messages.append(message)
        metrics = {} if score is None else {"interaction_turn_score": float(score)}
        return Observation([message], done=bool(done), metrics=metrics)

    async def finish(self, reason: str) -> EpisodeResult:
        for instance, instance_id in self.instances.values():
            release = getattr(instance, "release", None)
            if release is not None:
                await release(instance_id)
        if self.interaction is None:
            return EpisodeResult(reward=self.reward)
        kwargs = self.interaction_kwargs
        try:
            score = await self.interaction.calculate_score(self.interaction_id, **kwargs)
        finally:
            await self.interaction.finalize_interaction(self.interaction_id, **kwargs)
        return EpisodeResult(reward=float(score))


def _tool_message(call: ToolCall, content: str) -> dict[str, Any]:
    return {"role": "tool", "content": content, "tool_call_id": call.id, "name": call.name}


class ToolEnvironment(Environment):
    """Tools from ``multi_turn.tool_config_path`` (verl's YAML), or given directly (``tools``),
    for every row."""

    def __init__(self, ctx: EnvironmentContext, tools: Sequence[Tool] | None = None) -> None:
        super().__init__(ctx)
        multi_turn = ctx.config.actor_rollout_ref.rollout.multi_turn
        if tools is None:
            path = multi_turn.tool_config_path
            tools = load_tool_config(str(path)) if path else []
        self.tools = {tool.name: tool for tool in tools}
        self.max_parallel_calls = int(multi_turn.max_parallel_calls)
        self.timeout_s = float(multi_turn.tool_timeout_s)
        self.max_output_bytes = int(multi_turn.max_tool_output_bytes)
        system_prompt = multi_turn.get("system_prompt")
        self.system_prompt = None if system_prompt is None else str(system_prompt)
        self.prefill = str(multi_turn.get("prefill") or "")
        interaction_path = multi_turn.get("interaction_config_path")
        self.interactions = load_interactions(str(interaction_path)) if interaction_path else {}

    def episode(self, row: Mapping[str, Any]) -> Episode:
        return ToolEpisode(self, row)
