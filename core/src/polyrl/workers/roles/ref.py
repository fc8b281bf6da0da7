"""The reference policy: the frozen initial model, for KL terms.

Its engine is the actor's training engine built from ``actor_rollout_ref.actor`` merged with
``actor_rollout_ref.ref`` (the ref node's ``log_prob_micro_batch_size_per_gpu`` and
``fsdp_config`` win), not trainable.

With LoRA (``actor_rollout_ref.model.lora_rank > 0``) the frozen initial model is the actor's
base weights, so the reference builds no engine: it asks the actor role of its worker for
log-probs with the adapters disabled (no second copy of the weights; the actor's micro-batch
settings apply). ``polyrl validate`` keeps the two roles in one pool for that.
"""

from __future__ import annotations

from contextlib import nullcontext

from omegaconf import OmegaConf

from polyrl.batch import Batch
from polyrl.interfaces import TrainingEngine
from polyrl.lora import lora_rank
from polyrl.specs import PluginKind
from polyrl.workers.mesh import DataParallelRank
from polyrl.workers.roles.actor import plain_node, training_engine_context
from polyrl.workers.roles.base import Role, RoleContext


class RefRole(Role):
    """Log-probs under the reference weights."""

    def __init__(self, ctx: RoleContext) -> None:
        super().__init__(ctx)
        arr = ctx.cfg.actor_rollout_ref
        self.temperature = float(arr.rollout.temperature)
        self.shares_actor = lora_rank(arr.model) > 0
        self._engine: TrainingEngine | None = None
        if not self.shares_actor:
            engine_cfg = OmegaConf.merge(plain_node(arr.actor), plain_node(arr.ref))
            engine_cls = ctx.plan.load(PluginKind.TRAINING_ENGINE, arr.actor.strategy)
            self._engine = engine_cls(training_engine_context(ctx, engine_cfg, trainable=False))

    @property
    def engine(self) -> TrainingEngine:
        """Its own frozen engine, or with LoRA the actor's (looked up when first used: the
        worker may build the actor after the reference)."""
        if self._engine is not None:
            return self._engine
        actor_role = self.ctx.peers.get("actor")
        engine = getattr(actor_role, "engine", None)
        if not isinstance(engine, TrainingEngine):
            raise RuntimeError(
                f"with actor_rollout_ref.model.lora_rank > 0 the reference uses the actor's "
                f"model, but this worker hosts no actor role (roles: {sorted(self.ctx.peers)}); "
                f"place ref and actor in one pool (trainer.role_pools)"
            )
        return engine

    def data_parallel_rank(self) -> DataParallelRank:
        return self.engine.data_parallel_rank()

    def compute_log_prob(self, batch: Batch) -> Batch:
        """``log_probs`` of the batch's responses under the reference weights."""
        engine = self.engine
        with engine.adapters_disabled() if self.shares_actor else nullcontext():
            log_prob, _ = engine.compute_log_prob(batch, temperature=self.temperature)
        return Batch({"log_probs": log_prob})
