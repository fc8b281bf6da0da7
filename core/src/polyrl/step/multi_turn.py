"""The ``gen`` and ``reward`` stages of a multi-turn step (``multi_turn.enable=true``).

:class:`EpisodeGenerateStage` runs ``rollout.n`` episodes per prompt with the selected
environment (:mod:`polyrl.envs.rollout`) and provides the trajectory batch described in
:mod:`polyrl.envs`: the same keys as single-turn generation, so every later stage of any
algorithm built on :func:`polyrl.step.policy_gradient_pipeline` runs unchanged.
:class:`EpisodeRewardStage` turns the episodes' rewards into ``token_level_scores``. Both keep
the names ``gen`` and ``reward``, so algorithms that insert stages after them keep working.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import numpy as np

from polyrl.interfaces import RewardSample, SamplingParams
from polyrl.step import names
from polyrl.step.pipeline import Stage, StepState
from polyrl.step.stages import GENERATED_KEYS, training_sampling_params
from polyrl.workers.dispatch import Dispatch

if TYPE_CHECKING:
    from polyrl.batch import Batch
    from polyrl.envs.rollout import MultiTurnRollout, Trajectory
    from polyrl.plan import RunPlan
    from polyrl.step.context import StepContext

# What an environment's episode gets of its prompt row (polyrl.envs.Environment.episode).
ROW_KEYS = (
    names.MESSAGES,
    names.DATA_SOURCE,
    names.GROUND_TRUTH,
    names.EXTRA_INFO,
    names.INDEX,
    names.RAW_PROMPT,
)
EPISODE_KEYS = (names.TURN_SCORES, names.EPISODE_REWARD, names.LAST_TURN_TEXT)


class EpisodeGenerateStage(Stage):
    """``rollout.n`` episodes per prompt with the environment
    ``multi_turn.environment``; rows of one prompt share a ``uid``."""

    name = names.STAGE_GEN
    requires = (names.INPUT_IDS, names.ATTENTION_MASK, *ROW_KEYS)
    roles = ("rollout",)

    def __init__(self, cfg: Any = None) -> None:
        self.provides = (*GENERATED_KEYS, names.ROLLOUT_LOG_PROBS, names.UID, *EPISODE_KEYS)
        self.registration: Any = None
        self._rollout: MultiTurnRollout | None = None

    def bind(self, plan: RunPlan) -> None:
        self.registration = plan.environment

    def rollout(self, ctx: StepContext) -> MultiTurnRollout:
        """Built on first use, in the driver: the environment lives for the whole run."""
        if self._rollout is None:
            from polyrl.envs.chat import ChatTokens
            from polyrl.envs.episode import EnvironmentContext
            from polyrl.envs.rollout import MultiTurnRollout

            if self.registration is None:
                raise RuntimeError(f"stage {self.name!r} was not bound to a run plan")
            environment = self.registration.load()(
                EnvironmentContext(config=ctx.cfg, seed=int(ctx.cfg.trainer.seed))
            )
            eos = [ctx.tokenizer.eos_token_id] if ctx.tokenizer.eos_token_id is not None else []
            self._rollout = MultiTurnRollout(
                environment,
                ChatTokens(ctx.tokenizer, eos),
                ctx.cfg.actor_rollout_ref.rollout.multi_turn,
                max_response_length=int(ctx.cfg.data.max_response_length),
                max_prompt_length=int(ctx.cfg.data.max_prompt_length),
            )
        return self._rollout

    def run(self, state: StepState, ctx: StepContext) -> None:
        state.batch, metrics = self.episodes(
            ctx, state.batch, training_sampling_params(ctx.cfg, state.step)
        )
        state.metrics.update(metrics)

    def episodes(
        self, ctx: StepContext, prompts: Batch, params: SamplingParams
    ) -> tuple[Batch, dict[str, float]]:
        """``params.n`` episodes of each prompt row with this run's environment: the training
        step's, and the validation's (a tool task is validated by playing it, not by one turn
        without its tools)."""
        return run_episodes(ctx, self.rollout(ctx), prompts, params)

    def finish(self) -> None:
        """The run is over: the environment releases what it holds."""
        if self._rollout is not None:
            self._rollout.environment.close()


def run_episodes(
    ctx: StepContext, rollout: MultiTurnRollout, prompts: Batch, params: SamplingParams
) -> tuple[Batch, dict[str, float]]:
    """``params.n`` episodes of each prompt row: the trajectory batch and ``multi_turn/*``."""
    prompts[names.UID] = np.array([str(uuid.uuid4()) for _ in range(len(prompts))], dtype=object)
    rows_batch = prompts.repeat_interleave(params.n)
    rows = [
        {
            **{key: rows_batch[key][i] for key in (*ROW_KEYS, names.UID) if key in rows_batch},
            "sample": i % params.n,
        }
        for i in range(len(rows_batch))
    ]
    ids, mask = rows_batch[names.INPUT_IDS], rows_batch[names.ATTENTION_MASK]
    prompt_ids = [row[m.bool()].tolist() for row, m in zip(ids, mask)]

    def generate(batch: Batch, turn_params: SamplingParams) -> Batch:
        dp = ctx.workers.dp_size("rollout")
        padded = pad_rows(batch, dp)
        out = ctx.workers.call(
            "rollout", "generate", padded, turn_params, dispatch=Dispatch.DP_SPLIT
        )
        return out.slice(0, len(batch))

    def release() -> None:
        ctx.workers.call("rollout", "reset_prefix_cache", dispatch=Dispatch.BROADCAST)

    trajectories, metrics = rollout.run(rows, prompt_ids, generate, params, release=release)
    from polyrl.batch import Batch

    out = Batch(non_tensors=dict(rows_batch.non_tensors)).union(
        trajectory_batch(trajectories, rollout.budget, int(ctx.tokenizer.pad_token_id or 0))
    )
    return out, metrics


def pad_rows(batch: Batch, multiple: int) -> Batch:
    """Repeat the last row so the batch splits evenly over ``multiple`` ranks."""
    from polyrl.batch import Batch

    missing = -len(batch) % multiple
    if not missing:
        return batch
    return Batch.concat([batch, batch.select_rows([len(batch) - 1] * missing)])


def trajectory_batch(trajectories: list[Trajectory], width: int, pad_token_id: int) -> Batch:
    """The batch of :mod:`polyrl.envs`'s layout: left-padded first prompts, then each episode's
    tokens right-padded to ``width``."""
    import torch

    from polyrl.batch import Batch

    rows = len(trajectories)
    prompt_width = max(len(t.prompt_ids) for t in trajectories)
    prompts = torch.full((rows, prompt_width), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros((rows, prompt_width), dtype=torch.long)
    responses = torch.full((rows, width), pad_token_id, dtype=torch.long)
    attended = torch.zeros((rows, width), dtype=torch.long)
    assistant = torch.zeros((rows, width), dtype=torch.long)
    log_probs = torch.zeros((rows, width), dtype=torch.float32)
    turn_scores = torch.zeros((rows, width), dtype=torch.float32)
    for i, traj in enumerate(trajectories):
        p, n = len(traj.prompt_ids), len(traj.tokens)
        prompts[i, prompt_width - p :] = torch.tensor(traj.prompt_ids, dtype=torch.long)
        prompt_mask[i, prompt_width - p :] = 1
        if n:
            responses[i, :n] = torch.tensor(traj.tokens, dtype=torch.long)
            attended[i, :n] = 1
            assistant[i, :n] = torch.tensor(traj.assistant, dtype=torch.long)
            log_probs[i, :n] = torch.tensor(traj.log_probs, dtype=torch.float32)
        for position, reward in traj.turn_rewards.items():
            turn_scores[i, position] = reward
    attention_mask = torch.cat([prompt_mask, attended], dim=1)
    return Batch(
        tensors={
            names.INPUT_IDS: torch.cat([prompts, responses], dim=1),
            names.ATTENTION_MASK: attention_mask,
            names.POSITION_IDS: (attention_mask.cumsum(-1) - 1).clamp(min=0),
            names.RESPONSES: responses,
            names.RESPONSE_MASK: assistant,
            names.ROLLOUT_LOG_PROBS: log_probs,
            names.TURN_SCORES: turn_scores,
        },
        non_tensors={
            names.EPISODE_REWARD: np.array([t.result.reward for t in trajectories], dtype=object),
            names.LAST_TURN_TEXT: np.array([t.last_text for t in trajectories], dtype=object),
        },
    )


def last_assistant_positions(response_mask: Any) -> Any:
    """Index of each row's last assistant token (-1 for a row without any)."""
    import torch

    width = response_mask.shape[1]
    positions = torch.arange(width).expand_as(response_mask)
    return torch.where(response_mask.bool(), positions, -1).max(dim=1).values


class EpisodeRewardStage(Stage):
    """``token_level_scores``: each episode's reward on its last assistant token (the reward
    provider scores ``last_turn_text`` where the environment gave none) plus the environment's
    per-turn rewards; ``token_level_rewards`` starts equal to them."""

    name = names.STAGE_REWARD
    requires = (
        names.RESPONSE_MASK,
        *EPISODE_KEYS,
        names.DATA_SOURCE,
        names.GROUND_TRUTH,
        names.EXTRA_INFO,
    )
    provides = (names.TOKEN_LEVEL_SCORES, names.TOKEN_LEVEL_REWARDS)

    def run(self, state: StepState, ctx: StepContext) -> None:
        batch = state.batch
        scores, metrics = episode_scores(ctx, batch)
        batch[names.TOKEN_LEVEL_SCORES] = scores
        batch[names.TOKEN_LEVEL_REWARDS] = scores.clone()
        state.metrics.update(metrics)


def episode_scores(
    ctx: StepContext, batch: Batch, turn_rewards: bool = True
) -> tuple[Any, dict[str, float]]:
    """Each episode's reward on its last assistant token (the reward provider scores
    ``last_turn_text`` where the environment gave none) plus, with ``turn_rewards``, the
    environment's per-turn rewards, as ``[rows, response width]`` scores; and ``reward/errors``
    when the provider scored some."""
    import torch

    metrics: dict[str, float] = {}
    rewards = list(batch[names.EPISODE_REWARD])
    unscored = [i for i, r in enumerate(rewards) if r is None]
    if unscored:
        results = ctx.reward.score(
            [
                RewardSample(
                    index=i,
                    data_source=str(batch[names.DATA_SOURCE][i]),
                    solution_str=str(batch[names.LAST_TURN_TEXT][i]),
                    ground_truth=batch[names.GROUND_TRUTH][i],
                    extra_info=dict(batch[names.EXTRA_INFO][i] or {}),
                )
                for i in unscored
            ]
        )
        for i, result in zip(unscored, results):
            rewards[i] = result.score
        metrics["reward/errors"] = float(sum(r.error is not None for r in results))
    scores = batch[names.TURN_SCORES].clone() if turn_rewards else batch[names.TURN_SCORES] * 0
    last = last_assistant_positions(batch[names.RESPONSE_MASK])
    rows = torch.nonzero(last >= 0).flatten()
    scores[rows, last[rows]] += torch.tensor([float(rewards[i]) for i in rows.tolist()])
    return scores, metrics
