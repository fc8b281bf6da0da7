"""The reference policy: the frozen initial model, for KL terms.

Its engine is the actor's training engine built from ``actor_rollout_ref.actor`` merged with
``actor_rollout_ref.ref`` (the ref node's ``log_prob_micro_batch_size_per_gpu`` and
``fsdp_config`` win), not trainable.
"""

from __future__ import annotations

from omegaconf import OmegaConf

from polyrl.batch import Batch
from polyrl.registry import get_registry
from polyrl.specs import PluginKind
from polyrl.workers.mesh import DataParallelRank
from polyrl.workers.roles.actor import plain_node, training_engine_context
from polyrl.workers.roles.base import Role, RoleContext


class RefRole(Role):
    """Log-probs under the reference weights."""

    def __init__(self, ctx: RoleContext) -> None:
        super().__init__(ctx)
        arr = ctx.cfg.actor_rollout_ref
        engine_cfg = OmegaConf.merge(plain_node(arr.actor), plain_node(arr.ref))
        engine_cls = get_registry().load(PluginKind.TRAINING_ENGINE, arr.actor.strategy)
        self.engine = engine_cls(training_engine_context(ctx, engine_cfg, trainable=False))
        self.temperature = float(arr.rollout.temperature)

    def data_parallel_rank(self) -> DataParallelRank:
        return self.engine.data_parallel_rank()

    def compute_log_prob(self, batch: Batch) -> Batch:
        """``log_probs`` of the batch's responses under the reference weights."""
        log_prob, _ = self.engine.compute_log_prob(batch, temperature=self.temperature)
        return Batch({"log_probs": log_prob})
