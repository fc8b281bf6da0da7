"""The standard stages of a policy-gradient step (see :mod:`polyrl.step.pipeline`).

Each class declares the batch keys it requires and provides and the worker roles it calls.
Algorithms reuse them, edit their order, or replace them with their own :class:`Stage`.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from polyrl.config.checks.off_policy import tis_enabled
from polyrl.interfaces import RewardResult, RewardSample, SamplingParams
from polyrl.seeding import derive_seed
from polyrl.specs import ESTIMATOR_KEYS, POLICY_LOSS_KEYS
from polyrl.step.context import StepContext
from polyrl.step.minibatch import MiniBatchPlan, plan_minibatches
from polyrl.step.pipeline import Stage, StepState
from polyrl.step.scoring_guard import ScoringFailureGuard
from polyrl.workers.dispatch import Dispatch

if TYPE_CHECKING:
    from polyrl.batch import Batch
    from polyrl.plan import RunPlan

# What an engine's forward pass reads: the prompt and response of each row.
MODEL_INPUT_KEYS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")
GENERATED_KEYS = ("responses", "response_mask", "input_ids", "attention_mask", "position_ids")


def training_sampling_params(cfg: Any, step: int) -> SamplingParams:
    """Sampling settings of training rollouts; the seed depends on the step only, so a resumed
    run samples exactly what an uninterrupted one would."""
    rollout = cfg.actor_rollout_ref.rollout
    return SamplingParams(
        n=int(rollout.n),
        temperature=float(rollout.temperature),
        top_p=float(rollout.top_p),
        top_k=int(rollout.top_k),
        max_new_tokens=int(cfg.data.max_response_length),
        greedy=not rollout.do_sample,
        seed=derive_seed(int(cfg.trainer.seed), "rollout", step),
    )


def generate(ctx: StepContext, prompts: Batch, params: SamplingParams) -> Batch:
    """Generate on every rollout rank; the result holds ``n`` rows per prompt with the prompt's
    non-tensor fields."""
    from polyrl.batch import Batch

    out = ctx.workers.call(
        "rollout",
        "generate",
        prompts.select_keys(("input_ids", "attention_mask")),
        params,
        dispatch=Dispatch.DP_SPLIT,
    )
    return Batch(non_tensors=dict(prompts.non_tensors)).repeat_interleave(params.n).union(out)


def score_responses(ctx: StepContext, batch: Batch) -> tuple[Any, dict[str, float]]:
    """Decode, score, and place each score on the response's last token."""
    scores, metrics, _ = score_batch(ctx, batch)
    return scores, metrics


def score_batch(ctx: StepContext, batch: Batch) -> tuple[Any, dict[str, float], list[RewardResult]]:
    """:func:`score_responses`, plus the reward provider's result of every sample."""
    import torch

    responses, mask = batch["responses"], batch["response_mask"]
    lengths = mask.sum(-1).long()
    texts = ctx.tokenizer.batch_decode(
        [row[: int(n)] for row, n in zip(responses.tolist(), lengths)], skip_special_tokens=True
    )
    samples = [
        RewardSample(
            index=i,
            data_source=str(batch["data_source"][i]),
            solution_str=texts[i],
            ground_truth=batch["ground_truth"][i],
            extra_info=dict(batch["extra_info"][i] or {}),
            prompt_str=str(batch.get("raw_prompt", [""] * len(batch))[i]),
        )
        for i in range(len(batch))
    ]
    results = ctx.reward.score(samples)
    scores = torch.zeros(mask.shape, dtype=torch.float32)
    last = (lengths - 1).clamp(min=0)
    scores[torch.arange(len(batch)), last] = torch.tensor([r.score for r in results])
    scores = scores * mask
    metrics: dict[str, float] = {"reward/errors": float(sum(r.error is not None for r in results))}
    extras: dict[str, list[float]] = defaultdict(list)
    for result in results:
        for key, value in result.extra.items():
            extras[key].append(float(value))
    metrics.update({f"reward_extra/{k}/mean": float(np.mean(v)) for k, v in extras.items()})
    return scores, metrics, results


class GenerateStage(Stage):
    """``n`` samples per prompt; rows of one prompt share a ``uid`` (the group id)."""

    name = "gen"
    requires = ("input_ids", "attention_mask")
    roles = ("rollout",)

    def __init__(self, cfg: Any = None) -> None:
        self.provides = (*GENERATED_KEYS, "uid")

    def bind(self, plan: RunPlan) -> None:
        """The sampling log-probs are provided when the selected rollout engine reports them."""
        sampled = ("rollout_log_probs",) if plan.rollout_engine.spec.supports_logprobs else ()
        self.provides = (*GENERATED_KEYS, *sampled, "uid")

    def run(self, state: StepState, ctx: StepContext) -> None:
        prompts = state.batch
        prompts["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(prompts))], dtype=object)
        params = training_sampling_params(ctx.cfg, state.step)
        state.batch = generate(ctx, prompts, params)


class RewardStage(Stage):
    """Scores on each response's last token; ``token_level_rewards`` starts equal to them
    (later stages may shape it: a KL penalty, an overlong penalty). A run whose samples keep
    failing to score stops (:mod:`polyrl.step.scoring_guard`)."""

    name = "reward"
    requires = ("responses", "response_mask", "data_source", "ground_truth", "extra_info")
    provides = ("token_level_scores", "token_level_rewards")

    def __init__(self, cfg: Any) -> None:
        rm = cfg.reward_model
        self.guard = ScoringFailureGuard(rm.max_failure_rate, rm.failure_window_steps)

    def run(self, state: StepState, ctx: StepContext) -> None:
        scores, metrics, results = score_batch(ctx, state.batch)
        state.batch["token_level_scores"] = scores
        state.batch["token_level_rewards"] = scores.clone()
        state.metrics.update(metrics)
        self.guard.record(state.step, results)

    def state_dict(self) -> dict[str, Any]:
        return self.guard.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.guard.load_state_dict(state)

    def finish(self) -> None:
        self.guard.finish()


def update_plan(cfg: Any, num_rows: int, dp_size: int, step: int) -> MiniBatchPlan:
    """The actor update's mini-batch plan for this batch (see :mod:`polyrl.step.minibatch`)."""
    actor = cfg.actor_rollout_ref.actor
    return plan_minibatches(
        num_rows,
        dp_size,
        int(actor.ppo_mini_batch_size) * int(cfg.actor_rollout_ref.rollout.n),
        epochs=int(actor.ppo_epochs),
        shuffle=bool(actor.shuffle),
        seed=int(cfg.trainer.seed),
        step=step,
    )


class OldLogProbStage(Stage):
    """Log-probs of the sampled responses under the actor before the update.

    The forward pass is skipped when this batch's update is a single optimizer step
    (on-policy) and the only stages that read ``old_log_probs`` recompute them on such a step
    (``recomputes_on_policy``: the actor update, which then takes the detached log-probs of its
    own forward pass, identical to these). Any other reader, before or after the update (a KL
    penalty in the reward, a plugin's stage), gets them computed: the stage provides what it
    declares whenever someone reads it, so the chain ``polyrl validate`` checks
    (:meth:`StepPipeline.check`) is the chain that runs. The pipeline shows the stage its later
    stages before every run (:meth:`link`), so an edited pipeline cannot leave it stale.
    Declaring the key as provided only sometimes would instead make every reader handle its
    absence; computing it for the readers that need it keeps the contract unconditional.
    ``needed_before_update`` forces the forward pass whatever reads it. With ``sum_pi_squared``
    (``actor.calculate_sum_pi_squared``) the stage also provides ``sum_pi_squared`` from the
    same pass, which then always runs.

    On a step where the forward pass runs and the batch has the rollout's own log-probs, the
    probability-gap metrics (:mod:`polyrl.algorithms.rollout_gap`) are computed here; on a
    skipped step, the actor's update reports them from its forward pass.
    """

    name = "old_log_prob"
    requires = MODEL_INPUT_KEYS
    provides = ("old_log_probs",)
    roles = ("actor",)

    def __init__(self, needed_before_update: bool = False, *, sum_pi_squared: bool = False) -> None:
        self.needed_before_update = needed_before_update or sum_pi_squared
        self.sum_pi_squared = sum_pi_squared
        self.provides = ("old_log_probs", *(("sum_pi_squared",) if sum_pi_squared else ()))
        # The later stages that read old_log_probs and do not recompute them, and whether none
        # reads them at all (set by link).
        self.read_by: tuple[str, ...] = ()
        self.unread = False

    def link(self, later: Sequence[Stage]) -> None:
        key = "old_log_probs"
        self.read_by = tuple(
            s.name for s in later if key in s.requires and key not in s.recomputes_on_policy
        )
        self.unread = not any(key in s.requires for s in later)

    def run(self, state: StepState, ctx: StepContext) -> None:
        if not self.needed_before_update and self.unread:
            return  # no stage reads them (a loss on the rollout's log-probs: verl's bypass)
        if not self.needed_before_update and not self.read_by:
            plan = update_plan(ctx.cfg, len(state.batch), ctx.workers.dp_size("actor"), state.step)
            if plan.on_policy:
                return
        out = ctx.workers.call(
            "actor",
            "compute_log_prob",
            state.batch.select_keys(MODEL_INPUT_KEYS),
            dispatch=Dispatch.DP_SPLIT,
        )
        state.batch["old_log_probs"] = out["log_probs"]
        if "entropys" in out:
            state.batch["entropys"] = out["entropys"]
        if self.sum_pi_squared:
            state.batch["sum_pi_squared"] = out["sum_pi_squared"]
        if "rollout_log_probs" in state.batch:
            state.metrics.update(rollout_mismatch_metrics(state.batch))


def rollout_mismatch_metrics(batch: Batch) -> dict[str, float]:
    """``training/rollout_probs_diff_mean`` and ``_max`` of the batch's ``rollout_log_probs``
    against its ``old_log_probs`` (see :mod:`polyrl.algorithms.rollout_gap`)."""
    from polyrl.algorithms.rollout_gap import gap_metrics

    return gap_metrics(batch["rollout_log_probs"], batch["old_log_probs"], batch["response_mask"])


class RefLogProbStage(Stage):
    """Log-probs under the frozen reference policy (for a KL loss or a KL penalty)."""

    name = "ref"
    requires = MODEL_INPUT_KEYS
    provides = ("ref_log_prob",)
    roles = ("ref",)

    def run(self, state: StepState, ctx: StepContext) -> None:
        out = ctx.workers.call(
            "ref",
            "compute_log_prob",
            state.batch.select_keys(MODEL_INPUT_KEYS),
            dispatch=Dispatch.DP_SPLIT,
        )
        state.batch["ref_log_prob"] = out["log_probs"]


class KLInRewardStage(Stage):
    """``rewards = rewards - beta * KL(actor || ref)`` per token, beta from the KL controller
    (whose value is saved in checkpoints)."""

    name = "kl_in_reward"
    requires = ("token_level_rewards", "old_log_probs", "ref_log_prob", "response_mask")
    provides = ("token_level_rewards",)

    def __init__(self, cfg: Any) -> None:
        self.kl_penalty = str(cfg.algorithm.kl_penalty)
        self.kl_ctrl = cfg.algorithm.kl_ctrl
        self._controller: Any = None

    @property
    def controller(self) -> Any:
        """Built on first use: the KL module needs torch, and pipelines are also built where
        only the config is checked (``polyrl validate``)."""
        if self._controller is None:
            from polyrl.algorithms.kl import make_kl_controller

            self._controller = make_kl_controller(self.kl_ctrl)
        return self._controller

    def run(self, state: StepState, ctx: StepContext) -> None:
        from polyrl.algorithms.kl import apply_kl_in_reward

        batch = state.batch
        rewards, metrics = apply_kl_in_reward(
            batch["token_level_rewards"],
            batch["old_log_probs"],
            batch["ref_log_prob"],
            batch["response_mask"],
            self.controller,
            self.kl_penalty,
        )
        batch["token_level_rewards"] = rewards
        state.metrics.update(metrics)

    def state_dict(self) -> dict[str, Any]:
        return {"kl_coef": float(self.controller.value)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.controller.value = float(state["kl_coef"])


class AdvantageStage(Stage):
    """The selected estimator (``algorithm.adv_estimator``) on the batch; its spec's
    ``requires`` become this stage's."""

    name = "adv"
    requires = ESTIMATOR_KEYS
    provides = ("advantages", "returns")

    def __init__(self, cfg: Any = None) -> None:
        self.registration: Any = None  # the plan's estimator registration
        self._estimator: Any = None

    def bind(self, plan: RunPlan) -> None:
        self.registration = plan.estimator
        self.requires = tuple(self.registration.spec.requires)

    def run(self, state: StepState, ctx: StepContext) -> None:
        if self._estimator is None:
            if self.registration is None:
                raise RuntimeError(f"stage {self.name!r} was not bound to a run plan")
            self._estimator = self.registration.load()
        advantages, returns = self._estimator(state.batch, ctx.cfg.algorithm)
        state.batch["advantages"], state.batch["returns"] = advantages, returns


class UpdateActorStage(Stage):
    """PPO epochs over mini-batches planned from this batch; the workers receive the keys the
    policy loss (and the KL loss and the truncated importance-sampling correction, when on)
    declare, nothing else.

    On an on-policy batch without ``old_log_probs`` (the ``old_log_prob`` stage skipped its
    forward pass) the actor takes its own forward pass's log-probs as the old ones; the batch's
    ``rollout_log_probs``, when it has them, then go along too, so the actor reports the
    probability-gap metrics the skipped stage would have (the ranks' parts combined here, see
    :mod:`polyrl.algorithms.rollout_gap`).
    """

    name = "update_actor"
    roles = ("actor",)
    recomputes_on_policy = ("old_log_probs",)

    def __init__(self, cfg: Any) -> None:
        actor = cfg.actor_rollout_ref.actor
        kl = ("ref_log_prob",) if actor.use_kl_loss else ()
        tis = ("old_log_probs", "rollout_log_probs") if tis_enabled(actor.tis_imp_ratio_cap) else ()
        self._own_keys = (*MODEL_INPUT_KEYS, *kl, *tis)
        self.requires = tuple(dict.fromkeys((*self._own_keys, *POLICY_LOSS_KEYS)))

    def send(self, *keys: str) -> None:
        """Also send ``keys`` to the workers' update (a plugin's stage adds one the actor
        reads, such as ``rollout_is_weights``); kept when the stage is bound."""
        self._own_keys = tuple(dict.fromkeys((*self._own_keys, *keys)))
        self.requires = tuple(dict.fromkeys((*self.requires, *keys)))

    def bind(self, plan: RunPlan) -> None:
        """The selected policy loss's ``requires`` reach the workers with the model inputs."""
        loss_keys = plan.policy_loss.spec.requires
        self.requires = tuple(dict.fromkeys((*self._own_keys, *loss_keys)))

    def run(self, state: StepState, ctx: StepContext) -> None:
        plan = update_plan(ctx.cfg, len(state.batch), ctx.workers.dp_size("actor"), state.step)
        keys = [k for k in self.requires if k in state.batch]
        missing = [k for k in self.requires if k not in state.batch]
        if missing and not (missing == ["old_log_probs"] and plan.on_policy):
            raise KeyError(f"stage {self.name!r}: the batch lacks {missing}")
        if missing and "rollout_log_probs" in state.batch and "rollout_log_probs" not in keys:
            keys.append("rollout_log_probs")  # for the gap metrics of the on-policy update
        per_rank = ctx.workers.call(
            "actor", "update", state.batch.select_keys(keys), plan, dispatch=Dispatch.DP_SPLIT
        )
        from polyrl.algorithms.rollout_gap import combine_parts

        per_rank = [dict(metrics) for metrics in per_rank]
        state.metrics.update(combine_parts(per_rank))
        for key in per_rank[0]:
            state.metrics[key] = float(np.mean([m[key] for m in per_rank]))
        state.metrics["actor/optimizer_steps"] = float(plan.optimizer_steps)


class SyncWeightsStage(Stage):
    """The actor's new weights into the rollout engine, so the next step samples from them."""

    name = "update_weights"
    roles = ("actor", "rollout")

    def run(self, state: StepState, ctx: StepContext) -> None:
        result = ctx.workers.sync_weights("actor", "rollout")
        state.metrics["perf/weight_sync_mb"] = result["bytes"] / 2**20
        state.metrics.update({k: v for k, v in result.items() if k.startswith("weight_sync/")})
