"""The multi-turn rollout: every live episode of a batch samples a turn together, on any engine.

Each round, the contexts of all live episodes (first prompt + everything so far) go to the
rollout engine as one batch of prompts (``n=1``, the budget left as ``max_new_tokens``): any
engine that samples prompts works, and engines with prefix caching reuse the shared context.
Each episode keeps the sampled ids and log-probs of its turn as they came back; then all live
episodes' ``step`` calls run concurrently on one event loop, each under
``multi_turn.env_timeout_s``. Episodes that end leave the batch; the rest go on to the next
round. See :mod:`polyrl.envs` for the trajectory batch this builds and
:mod:`polyrl.envs.episode` for the environment's side.

Runs in the driver: environments are built once there, and the engines stay stateless between
turns (weights only), so a worker restart or a resumed run loses no episode state.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import TYPE_CHECKING, Any, TypeVar

from polyrl.envs.chat import ChatTokens
from polyrl.envs.episode import (
    END_DONE,
    END_ENV_ERROR,
    END_ENV_TIMEOUT,
    END_MAX_ASSISTANT_TURNS,
    END_MAX_USER_TURNS,
    END_TRUNCATED,
    AssistantTurn,
    Environment,
    Episode,
    EpisodeResult,
    EpisodeStart,
    Observation,
)
from polyrl.envs.tool_calls import PARSERS
from polyrl.interfaces import SamplingParams
from polyrl.seeding import derive_seed

if TYPE_CHECKING:
    import torch

    from polyrl.batch import Batch

T = TypeVar("T")
END_PROMPT_TOO_LONG = "prompt_too_long"
GenerateFn = Callable[["Batch", SamplingParams], "Batch"]
"""Samples prompts (``input_ids``, ``attention_mask``, left-padded) on the rollout engine and
returns its batch (``responses``, ``response_mask``, ``rollout_log_probs``)."""


@dataclass
class Trajectory:
    """One episode as it grows: the first prompt, then the tokens after it."""

    row: Mapping[str, Any]
    prompt_ids: list[int]
    episode: Episode | None = None
    tokens: list[int] = field(default_factory=list)
    assistant: list[int] = field(default_factory=list)  # 1 on sampled tokens (the loss mask)
    log_probs: list[float] = field(default_factory=list)
    turn_rewards: dict[int, float] = field(default_factory=dict)  # token position -> reward
    assistant_turns: int = 0
    user_turns: int = 0
    metrics: Counter[str] = field(default_factory=Counter)
    env_seconds: float = 0.0
    end_reason: str | None = None
    last_text: str = ""
    result: EpisodeResult = field(default_factory=EpisodeResult)
    prefill: str = ""  # the start of the next assistant turn, already in the context

    @property
    def live(self) -> bool:
        return self.end_reason is None

    def append(self, ids: Sequence[int], log_probs: Sequence[float] | None) -> None:
        self.tokens += ids
        self.assistant += [int(log_probs is not None)] * len(ids)
        self.log_probs += list(log_probs) if log_probs is not None else [0.0] * len(ids)


class MultiTurnRollout:
    """Runs the episodes of one batch of rows. ``settings`` is the
    ``actor_rollout_ref.rollout.multi_turn`` node; ``max_response_length`` the token budget of an
    episode after its first prompt (``data.max_response_length``); a first prompt longer than
    ``max_prompt_length`` (an environment's messages and tools) ends its episode at once
    (``prompt_too_long``), as the engines are sized for prompt + budget."""

    def __init__(
        self,
        environment: Environment,
        chat: ChatTokens,
        settings: Any,
        *,
        max_response_length: int,
        max_prompt_length: int,
    ) -> None:
        self.environment = environment
        self.chat = chat
        self.settings = settings
        self.budget = int(max_response_length)
        self.max_prompt_length = int(max_prompt_length)
        self.parse = PARSERS[str(settings.format)]
        self.timeout_s = float(settings.env_timeout_s)
        # Read once: a config node's attribute access costs microseconds, and the loop reads
        # these for every episode at every turn.
        self.max_tokens_per_turn = _optional_int(settings.max_tokens_per_turn)
        self.max_user_turns = _optional_int(settings.max_user_turns)
        self.max_assistant_turns = _optional_int(settings.max_assistant_turns)
        self.max_tool_response_length = int(settings.max_tool_response_length)
        self.tool_response_truncate_side = str(settings.tool_response_truncate_side)

    # ---- the loop ------------------------------------------------------------------------------
    def run(
        self,
        rows: Sequence[Mapping[str, Any]],
        prompt_ids: Sequence[Sequence[int]],
        generate: GenerateFn,
        params: SamplingParams,
        *,
        release: Callable[[], None] | None = None,
    ) -> tuple[list[Trajectory], dict[str, float]]:
        """The finished trajectories of ``rows`` (``prompt_ids``: each row's prompt as the data
        loader tokenized it) and the step's ``multi_turn/*`` metrics. ``release`` runs once
        the last turn has been sampled (or the loop failed): the engines' prefix caches hold the
        episodes' KV from turn to turn, and nothing extends it after that (the rollout role's
        ``reset_prefix_cache``, :meth:`polyrl.interfaces.RolloutEngine.reset_prefix_cache`)."""
        start = time.monotonic()
        trajectories = asyncio.run(self._episodes(rows, prompt_ids, generate, params, release))
        metrics = episode_metrics(trajectories)
        metrics["multi_turn/episodes_per_s"] = len(trajectories) / max(
            time.monotonic() - start, 1e-9
        )
        return trajectories, metrics

    async def _episodes(
        self,
        rows: Sequence[Mapping[str, Any]],
        prompt_ids: Sequence[Sequence[int]],
        generate: GenerateFn,
        params: SamplingParams,
        release: Callable[[], None] | None,
    ) -> list[Trajectory]:
        trajectories = [Trajectory(row, list(ids)) for row, ids in zip(rows, prompt_ids)]
        await asyncio.gather(*(self._start(t) for t in trajectories))
        turn = 0
        try:
            while live := [t for t in trajectories if t.live]:
                turns = self._sample(live, generate, params, turn)
                steps = await asyncio.gather(*(self._step(t, at) for t, at in zip(live, turns)))
                self._observe([(t, step) for t, step in zip(live, steps) if step is not None])
                turn += 1
        finally:
            if release is not None:
                release()
        await asyncio.gather(*(self._finish(t) for t in trajectories))
        return trajectories

    async def _call(self, traj: Trajectory, call: Awaitable[T]) -> T | None:
        """``call`` under the timeout; a failure ends the episode (None)."""
        began = time.monotonic()
        try:
            return await asyncio.wait_for(call, self.timeout_s)
        except TimeoutError:
            traj.end_reason = END_ENV_TIMEOUT
        except Exception as exc:  # noqa: BLE001 - the environment's failure ends its episode only
            traj.end_reason = END_ENV_ERROR
            traj.metrics[f"error/{type(exc).__name__}"] += 1
        finally:
            traj.env_seconds += time.monotonic() - began
        return None

    async def _start(self, traj: Trajectory) -> None:
        try:
            traj.episode = self.environment.episode(traj.row)
        except Exception as exc:  # noqa: BLE001 - as a failing start
            traj.end_reason = END_ENV_ERROR
            traj.metrics[f"error/{type(exc).__name__}"] += 1
            return
        start = await self._call(traj, traj.episode.start())
        if isinstance(start, EpisodeStart) and start.messages is not None:
            traj.prompt_ids = self.chat.prompt_ids(start.messages, start.tools)
        if isinstance(start, EpisodeStart) and start.prefill:
            traj.prefill = start.prefill  # prompt tokens: read, never sampled nor trained on
            traj.prompt_ids = traj.prompt_ids + self.chat.encode(start.prefill)
        if len(traj.prompt_ids) > self.max_prompt_length:
            traj.end_reason = END_PROMPT_TOO_LONG

    def _sample(
        self, live: list[Trajectory], generate: GenerateFn, params: SamplingParams, turn: int
    ) -> list[AssistantTurn]:
        """One assistant turn of every live episode, sampled together."""

        from polyrl.batch import Batch

        ids, mask = left_padded([t.prompt_ids + t.tokens for t in live])
        left = [self.budget - len(t.tokens) for t in live]
        per_turn = self.max_tokens_per_turn
        if per_turn is not None:
            left = [min(n, per_turn) for n in left]
        seed = None if params.seed is None else derive_seed(params.seed, "turn", turn)
        turn_params = SamplingParams(
            **{**params.__dict__, "n": 1, "max_new_tokens": max(left), "seed": seed}
        )
        out = generate(Batch({"input_ids": ids, "attention_mask": mask}), turn_params)
        lengths = out["response_mask"].sum(-1).tolist()
        # one conversion of each tensor, not one per episode (the tokenizer takes numpy rows
        # without checking every id's type)
        responses_np = out["responses"].long().cpu().numpy()
        responses = responses_np.tolist()
        sampled_lp = out.get("rollout_log_probs")
        log_probs = sampled_lp.float().tolist() if sampled_lp is not None else None
        turns = []
        for i, traj in enumerate(live):
            n = min(int(lengths[i]), left[i])
            sampled = responses[i][:n]
            traj.append(sampled, log_probs[i][:n] if log_probs is not None else [0.0] * n)
            traj.assistant_turns += 1
            reply = self.chat.tokenizer.decode(responses_np[i, :n], skip_special_tokens=True)
            text = traj.prefill + reply
            traj.prefill = ""
            traj.last_text = text
            calls, errors = self.parse(text, traj.assistant_turns - 1)
            # stopped before the longest allowed turn: the engine met a stop token
            stopped = int(lengths[i]) < turn_params.max_new_tokens
            finished = n == int(lengths[i]) and (
                stopped or (bool(sampled) and sampled[-1] in self.chat.eos_token_ids)
            )
            turns.append(
                AssistantTurn(
                    index=traj.assistant_turns - 1,
                    text=text,
                    token_ids=tuple(sampled),
                    tool_calls=tuple(calls),
                    tool_call_errors=tuple(errors),
                    finished=finished,
                )
            )
        return turns

    async def _step(
        self, traj: Trajectory, turn: AssistantTurn
    ) -> tuple[list[dict[str, Any]], bool] | None:
        """The environment's answer to ``turn``: the observation's messages and whether the
        turn must be closed before them, when the episode goes on (:meth:`_observe` appends
        them), else None."""
        assert traj.episode is not None
        obs = await self._call(traj, traj.episode.step(turn))
        if not isinstance(obs, Observation):
            if traj.live:
                traj.end_reason = END_ENV_ERROR
                traj.metrics["error/not_an_observation"] += 1
            return None
        traj.metrics.update(obs.metrics)
        if obs.reward is not None and traj.tokens:
            traj.turn_rewards[len(traj.tokens) - 1] = float(obs.reward)
        traj.end_reason = self._end_after(traj, turn, obs)
        if traj.end_reason is not None:
            return None
        messages = [self._bounded(m) for m in obs.messages]
        traj.user_turns += any(m.get("role") == "user" for m in messages)
        limit = self.max_user_turns
        if limit is not None and traj.user_turns > limit:
            traj.end_reason = END_MAX_USER_TURNS
            return None
        return messages, not turn.finished

    def _observe(
        self, pending: Sequence[tuple[Trajectory, tuple[list[dict[str, Any]], bool]]]
    ) -> None:
        """Append each episode's observation tokens (all rendered, then encoded together)."""
        all_ids = self.chat.observations_ids([observation for _, observation in pending])
        for (traj, _), ids in zip(pending, all_ids, strict=True):
            if len(traj.tokens) + len(ids) >= self.budget:  # no room left for a reply
                traj.end_reason = END_TRUNCATED
            else:
                traj.append(ids, None)

    def _end_after(self, traj: Trajectory, turn: AssistantTurn, obs: Observation) -> str | None:
        if obs.done:
            return obs.end_reason or END_DONE
        if len(traj.tokens) >= self.budget:
            return END_TRUNCATED
        limit = self.max_assistant_turns
        if limit is not None and traj.assistant_turns >= limit:
            return END_MAX_ASSISTANT_TURNS
        return None

    def _bounded(self, message: dict[str, Any]) -> dict[str, Any]:
        """A tool message's content cut to ``max_tool_response_length`` characters."""
        content = message.get("content")
        cap = self.max_tool_response_length
        if message.get("role") != "tool" or not isinstance(content, str) or len(content) <= cap:
            return message
        return {
            **message,
            "content": truncate(content, cap, self.tool_response_truncate_side),
        }

    async def _finish(self, traj: Trajectory) -> None:
        if traj.episode is None:  # the environment could not open it
            traj.result = EpisodeResult(reward=0.0)
            return
        reason = traj.end_reason or END_DONE
        result = await self._call(traj, traj.episode.finish(reason))
        traj.end_reason = reason  # a failing finish does not change why the episode ended
        if isinstance(result, EpisodeResult):
            traj.result = result
            traj.metrics.update(result.metrics)
        else:
            traj.result = EpisodeResult(reward=0.0)
            traj.metrics["finish_failed"] += 1


def left_padded(contexts: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """``input_ids`` and ``attention_mask [len(contexts), longest]`` of token lists, each
    right-aligned after zeros (one conversion of all tokens: per-row tensors cost more than the
    rest of a turn's bookkeeping)."""
    import numpy as np
    import torch

    lengths = np.fromiter(map(len, contexts), dtype=np.int64, count=len(contexts))
    width = int(lengths.max()) if len(contexts) else 0
    mask = np.arange(width) >= width - lengths[:, None]
    ids = np.zeros(mask.shape, dtype=np.int64)
    ids[mask] = np.fromiter(chain.from_iterable(contexts), dtype=np.int64, count=int(lengths.sum()))
    return torch.from_numpy(ids), torch.from_numpy(mask.astype(np.int64))


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def truncate(text: str, cap: int, side: str) -> str:
    """``text`` cut to ``cap`` characters, the cut marked (verl's sides: left, right, middle)."""
    mark = "...(truncated)..."
    keep = max(cap - len(mark), 0)
    if side == "left":
        return mark + text[len(text) - keep :]
    if side == "right":
        return text[:keep] + mark
    head = keep // 2
    return text[:head] + mark + text[len(text) - (keep - head) :]


def episode_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """``multi_turn/*`` of a batch of finished episodes: means per episode of the turn and
    token counts and of the environments' own metrics, the environment's seconds, the share of
    episodes ending for each reason and the truncation rate."""
    count = max(len(trajectories), 1)
    sums: dict[str, float] = defaultdict(float)
    for traj in trajectories:
        assistant_tokens = sum(traj.assistant)
        sums["assistant_turns"] += traj.assistant_turns
        sums["user_turns"] += traj.user_turns
        sums["assistant_tokens"] += assistant_tokens
        sums["observation_tokens"] += len(traj.tokens) - assistant_tokens
        sums["env_seconds"] += traj.env_seconds
        for key, value in traj.metrics.items():
            sums[key] += float(value)
    for conventional in ("tool_calls", "tool_errors"):
        sums.setdefault(conventional, 0.0)
    metrics = {f"multi_turn/{key}/mean": value / count for key, value in sums.items()}
    reasons = Counter(t.end_reason or END_DONE for t in trajectories)
    metrics.update({f"multi_turn/end/{reason}": n / count for reason, n in reasons.items()})
    metrics["multi_turn/truncated_rate"] = reasons.get(END_TRUNCATED, 0) / count
    return metrics
