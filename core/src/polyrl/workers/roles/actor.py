"""The actor: the policy being trained, on the training engine ``actor_rollout_ref.actor.strategy``.

Engine settings: the ``actor_rollout_ref.actor`` node (whose log-prob micro-batch keys follow
the rollout node's, verl's place for them, through the schema's interpolations), plus
``total_optimizer_steps`` (the LR schedule's length).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from polyrl.batch import Batch
from polyrl.config.checks.off_policy import tis_enabled
from polyrl.errors import PolyrlError
from polyrl.interfaces import EngineContext
from polyrl.interfaces.training_engine import MicroBatchLossFn, needs_entropy_grad
from polyrl.lora import lora_rank, sync_sends_adapters
from polyrl.specs import PluginKind
from polyrl.workers.mesh import DataParallelRank
from polyrl.workers.roles.base import Role, RoleContext

if TYPE_CHECKING:
    from polyrl.algorithms.rollout_gap import GapTally
    from polyrl.step.minibatch import MiniBatchPlan


class UpdateError(PolyrlError):
    """The actor update cannot run on the batch and plan it was given."""


def training_engine_context(ctx: RoleContext, engine_cfg: Any, *, trainable: bool) -> EngineContext:
    """The :class:`EngineContext` of a training-engine role (actor, reference ...)."""
    return EngineContext(
        role=ctx.role,
        model_path=ctx.model_path,
        model=ctx.cfg.actor_rollout_ref.model,
        engine=engine_cfg,
        device=ctx.device,
        rank=ctx.rank,
        world_size=ctx.world_size,
        seed=int(ctx.cfg.trainer.seed),
        total_training_steps=ctx.total_training_steps,
        trainable=trainable,
    )


def plain_node(node: Any) -> Any:
    """A copy of a config node that accepts new keys (a structured node refuses them)."""
    return OmegaConf.create(OmegaConf.to_container(OmegaConf.create(node), resolve=True))


def optimizer_steps_per_training_step(cfg: Any, node: Any = None) -> int:
    """The configured number of optimizer steps of one update (epochs x mini-batches) of the
    role whose config ``node`` holds ``ppo_epochs`` and ``ppo_mini_batch_size`` (the actor's
    by default), for the LR schedule's length; a batch that shrank (dynamic sampling) takes
    fewer."""
    node = cfg.actor_rollout_ref.actor if node is None else node
    return int(node.ppo_epochs) * max(
        1, int(cfg.data.train_batch_size) // int(node.ppo_mini_batch_size)
    )


def train_on_plan(
    ctx: RoleContext,
    batch: Batch,
    plan: MiniBatchPlan,
    train_mini_batch: Callable[[Batch], dict[str, float]],
) -> dict[str, float]:
    """``train_mini_batch`` (one optimizer step) on each mini-batch of ``plan`` (local row
    indices into this shard, in order), each carrying its loss denominators in
    ``meta["loss_norm"]`` (see :func:`global_loss_norm`); the metrics averaged over the steps.
    Every role that trains by the driver's mini-batch plan (the actor, a critic) runs this."""
    check_plan(batch, plan)
    collected: dict[str, list[float]] = defaultdict(list)
    for minis in plan.epochs:
        for rows in minis:
            mini = batch.select_rows(rows)
            mini.meta["loss_norm"] = global_loss_norm(ctx, mini["response_mask"])
            for key, value in train_mini_batch(mini).items():
                collected[key].append(float(value))
    return {key: sum(values) / len(values) for key, values in collected.items()}


def check_plan(batch: Batch, plan: MiniBatchPlan) -> None:
    """Raise :class:`UpdateError` for an empty mini-batch or one indexing past this shard."""
    for epoch, minis in enumerate(plan.epochs):
        for m, rows in enumerate(minis):
            rows = np.asarray(rows)
            if rows.size == 0:
                raise UpdateError(f"mini-batch {m} of epoch {epoch} of the plan is empty")
            top = int(rows.max())
            if top >= len(batch) or int(rows.min()) < 0:
                raise UpdateError(
                    f"mini-batch {m} of epoch {epoch} of the update plan indexes row {top}, "
                    f"but this rank's shard has {len(batch)} rows: the plan was made for "
                    f"another batch size or data-parallel size"
                )


def global_loss_norm(ctx: RoleContext, response_mask: torch.Tensor) -> dict[str, float]:
    """Mini-batch denominators over ALL ranks, divided by the number of ranks: each rank's
    loss is then its share of the global aggregate, and the gradient average across ranks
    that data parallelism performs yields exactly the global token/sequence mean.

    Tensor-parallel peers hold the same rows, so the sum over all ranks counts each row
    ``tp`` times; divided by ``tp x dp`` ranks it is still the global total over ``dp``.
    ``dp_size`` (the role's data-parallel size) scales ``token-sum``, which has no denominator
    to cancel the gradient average.
    """
    from polyrl.algorithms.loss_agg import loss_norm_totals

    totals = loss_norm_totals(response_mask, max_len=int(ctx.cfg.data.max_response_length))
    counts = torch.tensor(
        [totals["num_seqs"], totals["num_tokens"]],
        dtype=torch.float64,
        device=ctx.device,
    )
    ranks = 1
    if dist.is_initialized():
        dist.all_reduce(counts)  # NCCL reduces CUDA tensors only: counts live on the device
        ranks = dist.get_world_size()
    counts = (counts / ranks).clamp(min=1.0 / ranks).cpu()
    role = ctx.peers.get(ctx.role)
    return {
        "num_seqs": float(counts[0]),
        "num_tokens": float(counts[1]),
        "max_len": totals["max_len"],
        "dp_size": role.data_parallel_rank().dp_size if role is not None else ranks,
    }


def on_policy(loss_fn: MicroBatchLossFn, gaps: GapTally | None = None) -> MicroBatchLossFn:
    """``loss_fn`` with the detached current log-probs as the old ones (a single-step update),
    needing what ``loss_fn`` needs. ``gaps`` tallies those log-probs against the micro-batch's
    ``rollout_log_probs`` (one optimizer step: each row's forward pass is seen once)."""

    def loss(
        micro_batch: Batch, log_prob: torch.Tensor, entropy: torch.Tensor | None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        micro_batch["old_log_probs"] = log_prob.detach()
        if gaps is not None:
            gaps.add(micro_batch["rollout_log_probs"], log_prob, micro_batch["response_mask"])
        return loss_fn(micro_batch, log_prob, entropy)

    loss.needs_entropy_grad = needs_entropy_grad(loss_fn)  # type: ignore[attr-defined]
    return loss


class ActorRole(Role):
    """Log-probs under the current policy, and the update by a driver-made mini-batch plan."""

    checkpointed = True

    def __init__(self, ctx: RoleContext) -> None:
        super().__init__(ctx)
        cfg = ctx.cfg
        arr = cfg.actor_rollout_ref
        engine_cfg = OmegaConf.merge(
            plain_node(arr.actor),
            {
                "total_optimizer_steps": optimizer_steps_per_training_step(cfg)
                * ctx.total_training_steps,
            },
        )
        engine_cls = ctx.plan.load(PluginKind.TRAINING_ENGINE, arr.actor.strategy)
        self.engine = engine_cls(training_engine_context(ctx, engine_cfg, trainable=True))
        from polyrl.algorithms.actor_loss import make_actor_loss_fn

        loss = ctx.plan.registration(PluginKind.POLICY_LOSS, arr.actor.policy_loss.loss_mode)
        self.loss_fn = make_actor_loss_fn(arr.actor, loss.load(), loss.spec.level)
        # Whether the update reads old log-probs (a loss on the rollout's reads none: verl's bypass)
        self.reads_old_log_probs = "old_log_probs" in loss.spec.requires or tis_enabled(
            arr.actor.tis_imp_ratio_cap
        )
        self.temperature = float(arr.rollout.temperature)
        self.sum_pi_squared = bool(arr.actor.calculate_sum_pi_squared)
        # A LoRA actor syncs the adapters alone into a rollout engine that loads them.
        self.sends_adapters = lora_rank(arr.model) > 0 and sync_sends_adapters(
            ctx.plan.registration(PluginKind.ROLLOUT_ENGINE, arr.rollout.name).spec
        )

    def data_parallel_rank(self) -> DataParallelRank:
        return self.engine.data_parallel_rank()

    # ---- log-probs ---------------------------------------------------------------------------
    def compute_log_prob(self, batch: Batch) -> Batch:
        """``log_probs`` (and ``entropys``) of the batch's responses under the current weights,
        and their ``sum_pi_squared`` with ``actor.calculate_sum_pi_squared``."""
        squares = None
        if self.sum_pi_squared:
            log_prob, entropy, squares = self.engine.compute_log_prob_and_sum_pi_squared(
                batch, temperature=self.temperature, calculate_entropy=True
            )
        else:
            log_prob, entropy = self.engine.compute_log_prob(
                batch, temperature=self.temperature, calculate_entropy=True
            )
        out = Batch({"log_probs": log_prob})
        if entropy is not None:
            out["entropys"] = entropy
        if squares is not None:
            out["sum_pi_squared"] = squares
        return out

    # ---- training ----------------------------------------------------------------------------
    def update(self, batch: Batch, plan: MiniBatchPlan) -> dict[str, float]:
        """One optimizer step per mini-batch of ``plan`` (local row indices into this shard, in
        order); the metrics averaged over the steps.

        Without ``old_log_probs`` in the batch the update must be on-policy (one optimizer
        step): the old log-probs are then the detached current ones; or the loss reads none
        (verl's bypass: the rollout's log-probs are the old ones). With ``rollout_log_probs``
        in such a batch, the metrics also hold this rank's parts of the probability-gap metrics
        (:class:`~polyrl.algorithms.rollout_gap.GapTally`), which the driver combines: the
        ``old_log_prob`` stage that would have computed them skipped its forward pass.
        """
        check_plan(batch, plan)
        gaps = None
        if "old_log_probs" in batch:
            loss_fn = self.loss_fn
        elif plan.on_policy:
            from polyrl.algorithms.rollout_gap import GapTally

            gaps = GapTally() if "rollout_log_probs" in batch else None
            loss_fn = on_policy(self.loss_fn, gaps)
        elif not self.reads_old_log_probs:
            loss_fn = self.loss_fn
        else:
            raise UpdateError(
                f"the actor update got a batch without 'old_log_probs' and a plan of "
                f"{plan.optimizer_steps} optimizer steps: only a single-step (on-policy) update "
                f"may use the current log-probs as the old ones. Run the old_log_prob stage "
                f"before update_actor (batch keys: "
                f"{sorted(batch.tensors) + sorted(batch.non_tensors)})"
            )
        metrics = train_on_plan(
            self.ctx,
            batch,
            plan,
            lambda mini: self.engine.train_step(mini, loss_fn, temperature=self.temperature),
        )
        if gaps is not None:
            metrics.update(gaps.parts())
        return metrics

    # ---- weights, checkpoints, export --------------------------------------------------------
    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """What weight sync sends the rollout: the full weights (merged ones with LoRA), or the
        LoRA adapters alone when the rollout plugin declares ``supports_lora_adapters``."""
        if self.sends_adapters:
            return self.engine.named_adapter_weights()
        return self.engine.named_weights()

    def save_checkpoint(self, path: str) -> None:
        self.engine.save_checkpoint(path)

    def load_checkpoint(self, path: str) -> None:
        self.engine.load_checkpoint(path)

    def export_hf(self, path: str) -> None:
        self.engine.export_hf(path)
