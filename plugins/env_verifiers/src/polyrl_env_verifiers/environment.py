"""The ``verifiers`` environment: a verifiers ``MultiTurnEnv`` (SingleTurnEnv and ToolEnv are
ones) drives polyrl's episodes, and its Rubric scores them.

Why the episode drives verifiers' own hooks instead of calling ``env.rollout``: ``rollout``
samples from an OpenAI client itself, while polyrl samples every live episode of the batch
together on its rollout engine and keeps the sampled token ids. So the episode does what
``MultiTurnEnv.rollout`` does between two samples, with verifiers' own methods:

    start   init_state, setup_state, get_prompt_messages  -> the first messages and the tools
    step    add_trajectory_step (the assistant turn), is_completed (every @vf.stop condition:
            max_turns, ToolEnv's no_tools_called, ...); if not done, get_prompt_messages, which
            calls the env's env_response (tool results, a user turn) -> the observation; an
            env_response that sets ``final_env_response`` ends the episode
    finish  render_completion, rubric.score_rollout -> the reward

The reward is ``state["reward"]`` as the rubric leaves it: the weighted sum of its reward
functions (a RubricGroup's rubrics summed), on the last assistant token; each reward function
and metric is reported as ``multi_turn/verifiers/<name>/mean``. An episode that polyrl's own
limits ended (turns, tokens) is scored as it stands, like a truncated verifiers rollout; one
whose environment raised or hung (``env_error``, ``env_timeout``) scores 0.0, its state being
unknown.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from polyrl.api import (
    END_ENV_ERROR,
    END_ENV_TIMEOUT,
    AssistantTurn,
    Environment,
    EnvironmentContext,
    Episode,
    EpisodeResult,
    EpisodeStart,
    Observation,
)
from polyrl_env_verifiers.loading import load_env
from polyrl_env_verifiers.messages import assistant_message

MODEL = "polyrl"  # the model name verifiers records in its state; polyrl samples, not verifiers


class VerifiersEpisode(Episode):
    """One rollout of the verifiers environment ``env`` on ``rollout_input`` (verifiers'
    ``RolloutInput``: ``prompt``, ``answer``, ``info``, ``task``, ``example_id``)."""

    def __init__(self, env: Any, rollout_input: dict[str, Any]) -> None:
        self.env = env
        self.input = rollout_input
        self.state: Any = None
        self.prompt: list[dict[str, Any]] = []  # the conversation before the next assistant turn

    async def start(self) -> EpisodeStart:
        state = await self.env.init_state(self.input, client=None, model=MODEL)
        self.state = await self.env.setup_state(state)
        self.prompt = list(await self.env.get_prompt_messages(self.state))
        return EpisodeStart(messages=self.prompt, tools=list(self.state["oai_tools"] or []))

    async def step(self, turn: AssistantTurn) -> Observation:
        from verifiers.types import TrajectoryStep

        state = self.state
        completion = [assistant_message(turn)]
        step = TrajectoryStep(
            prompt=self.prompt,
            completion=completion,
            response=None,
            tokens=None,
            reward=None,
            advantage=None,
            is_truncated=not turn.finished,
            trajectory_id=state["trajectory_id"],
            extras={},
        )
        await self.env.add_trajectory_step(state, step)
        metrics = {"tool_calls": float(len(turn.tool_calls))}
        if await self.env.is_completed(state):
            return Observation(done=True, metrics=metrics)
        said = len(self.prompt) + len(completion)
        prompt = list(await self.env.get_prompt_messages(state))
        if state.get("final_env_response") is not None:
            await self.env.is_completed(state)  # records the stop condition, runs cleanups
            return Observation(done=True, metrics=metrics)
        self.prompt = prompt
        return Observation(messages=prompt[said:], metrics=metrics)

    async def finish(self, reason: str) -> EpisodeResult:
        state = self.state
        if state is None or not state["trajectory"] or reason in (END_ENV_ERROR, END_ENV_TIMEOUT):
            return EpisodeResult(reward=0.0, metrics={"verifiers/scored": 0.0})
        if not state["is_completed"]:
            # polyrl's limits ended it before a stop condition did: release what the rollout
            # holds, as verifiers does for a cancelled rollout.
            state["is_truncated"] = True
            await self.env._cleanup(state)
        await self.env.render_completion(state)
        await self.env.rubric.score_rollout(state)
        metrics = {f"verifiers/{k}": float(v) for k, v in (state["metrics"] or {}).items()}
        return EpisodeResult(
            reward=float(state["reward"]), metrics={**metrics, "verifiers/scored": 1.0}
        )


class VerifiersEnvironment(Environment):
    """The run's verifiers environment, built once (see the module's docstring)."""

    def __init__(self, ctx: EnvironmentContext) -> None:
        super().__init__(ctx)
        settings = ctx.config.actor_rollout_ref.rollout.multi_turn
        self.env = load_env(str(settings.verifiers_env), dict(settings.verifiers_env_args or {}))
        self.rows = str(settings.verifiers_rows)
        self.dataset = self.env.get_dataset() if self.rows == "env" else None

    def episode(self, row: Mapping[str, Any]) -> Episode:
        return VerifiersEpisode(self.env, self.rollout_input(row))

    def rollout_input(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """verifiers' RolloutInput of ``row`` (``multi_turn.verifiers_rows``, settings.py)."""
        extra = dict(row.get("extra_info") or {})
        if self.dataset is not None:
            position = int(extra.get("example_id", row.get("index", 0))) % len(self.dataset)
            example = self.dataset[position]
            return {
                k: example[k]
                for k in ("prompt", "answer", "info", "task", "example_id")
                if k in example
            }
        prompt = [dict(m) for m in row["messages"]]
        system = self.env.system_prompt
        if system and not (prompt and prompt[0].get("role") == "system"):
            prompt.insert(0, {"role": "system", "content": system})
        return {
            "prompt": prompt,
            "answer": str(row.get("ground_truth") or ""),
            "info": extra,
            "task": self.env.env_id or "default",
            "example_id": int(row.get("index", 0)),
        }
