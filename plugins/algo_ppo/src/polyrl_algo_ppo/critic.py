"""The critic worker role: a value model on the training engine ``critic.strategy``.

Its engine is built like the actor's, from an engine node shaped like
``actor_rollout_ref.actor``: the actor's node with the ``critic.*`` settings merged over it
(micro-batch sizes, token budgets, ``optim``, ``model.fsdp_config``, the FSDP engine's
``ulysses_sequence_parallel_size`` and the Megatron engine's ``megatron``), so any engine that
reads the actor's layout and has a value head (``TrainingEngineSpec.supports_value_head``) runs
a critic. The model is ``critic.model.path``, or the actor's model when it is null; in either case
the engine keeps the backbone's weights and puts a fresh one-scalar head on it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from omegaconf import OmegaConf

from polyrl.api import (
    Batch,
    DataParallelRank,
    ModelHead,
    PluginKind,
    Role,
    RoleContext,
    optimizer_steps_per_training_step,
    plain_node,
    train_on_plan,
    training_engine_context,
)
from polyrl_algo_ppo.value_loss import make_value_loss_fn

if TYPE_CHECKING:
    from polyrl.api import MiniBatchPlan


ULYSSES = "ulysses_sequence_parallel_size"


def critic_engine_node(cfg: Any, total_training_steps: int) -> Any:
    """The critic's engine node: the actor's, with the critic's keys (verl's names) over it."""
    critic, actor = cfg.critic, cfg.actor_rollout_ref.actor
    # Engine plugins' sections under critic.model (the FSDP engine's fsdp_config) override the
    # actor's group of the same name.
    engine_groups = {
        key: plain_node(critic.model[key])
        for key in critic.model
        if OmegaConf.is_dict(critic.model[key]) and key in actor
    }
    # The engines' keys directly under critic, which follow the actor's unless set: the FSDP
    # engine's Ulysses size, the Megatron engine's split, offload and TransformerConfig
    # overrides (verl's critic.megatron; an empty override dict keeps the actor's, which verl's
    # default interpolates; a given one replaces it).
    if ULYSSES in critic and ULYSSES in actor:
        engine_groups[ULYSSES] = critic[ULYSSES]
    overrides = None
    if OmegaConf.is_dict(critic.get("megatron")) and "megatron" in actor:
        engine_groups["megatron"] = plain_node(critic.megatron)
        overrides = engine_groups["megatron"].get("override_transformer_config") or None
    node = OmegaConf.merge(
        plain_node(actor),
        {
            "strategy": critic.strategy,
            "ppo_mini_batch_size": critic.ppo_mini_batch_size,
            "ppo_micro_batch_size_per_gpu": critic.ppo_micro_batch_size_per_gpu,
            "log_prob_micro_batch_size_per_gpu": critic.forward_micro_batch_size_per_gpu,
            "use_dynamic_bsz": critic.use_dynamic_bsz,
            "ppo_max_token_len_per_gpu": critic.ppo_max_token_len_per_gpu,
            "log_prob_max_token_len_per_gpu": critic.forward_max_token_len_per_gpu,
            "ppo_epochs": critic.ppo_epochs,
            "shuffle": critic.shuffle,
            "loss_agg_mode": critic.loss_agg_mode,
            "optim": plain_node(critic.optim),
            **engine_groups,
            "total_optimizer_steps": optimizer_steps_per_training_step(cfg, critic)
            * total_training_steps,
        },
    )
    if overrides is not None:  # the critic's own dict replaces the actor's, not merged into it
        OmegaConf.update(node, "megatron.override_transformer_config", overrides, merge=False)
    return node


def critic_model_path(ctx: RoleContext) -> str:
    """A local folder for ``critic.model.path``; the actor's model when it is null."""
    path = ctx.cfg.critic.model.path
    if path is None:
        return ctx.model_path
    from polyrl.api import resolve_model_path

    return resolve_model_path(str(path))


class CriticRole(Role):
    """Values of the sampled responses, and the value model's update by the driver's plan."""

    checkpointed = True

    def __init__(self, ctx: RoleContext) -> None:
        super().__init__(ctx)
        cfg = ctx.cfg
        engine_cls = ctx.plan.load(PluginKind.TRAINING_ENGINE, cfg.critic.strategy)
        model = OmegaConf.merge(
            plain_node(cfg.actor_rollout_ref.model),
            {"enable_gradient_checkpointing": cfg.critic.model.enable_gradient_checkpointing},
        )
        engine_ctx = training_engine_context(
            ctx, critic_engine_node(cfg, ctx.total_training_steps), trainable=True
        )
        self.engine = engine_cls(
            replace(
                engine_ctx, model_path=critic_model_path(ctx), model=model, head=ModelHead.VALUE
            )
        )
        self.loss_fn = make_value_loss_fn(cfg.critic)

    def data_parallel_rank(self) -> DataParallelRank:
        return self.engine.data_parallel_rank()

    def compute_values(self, batch: Batch) -> Batch:
        """``values`` ``[B, R]`` of the batch's responses under the current value model."""
        return Batch({"values": self.engine.compute_values(batch)})

    def update(self, batch: Batch, plan: MiniBatchPlan) -> dict[str, float]:
        """One optimizer step per mini-batch of ``plan`` on the clipped value loss; the batch
        holds the model inputs, ``values`` (before the update) and ``returns``."""
        return train_on_plan(
            self.ctx, batch, plan, lambda mini: self.engine.train_value_step(mini, self.loss_fn)
        )

    def save_checkpoint(self, path: str) -> None:
        self.engine.save_checkpoint(path)

    def load_checkpoint(self, path: str) -> None:
        self.engine.load_checkpoint(path)
