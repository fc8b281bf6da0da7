"""The rollout: generation on the engine ``actor_rollout_ref.rollout.name``, fed fresh weights by
the actor after each update (in memory when both live in the worker)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from polyrl.batch import Batch
from polyrl.interfaces import RolloutContext, SamplingParams
from polyrl.seeding import derive_seed
from polyrl.specs import PluginKind
from polyrl.workers.mesh import DataParallelRank
from polyrl.workers.roles.base import Role, RoleContext

if TYPE_CHECKING:
    import torch

GENERATED_KEYS = (
    "responses",
    "response_mask",
    "rollout_log_probs",
    "input_ids",
    "attention_mask",
    "position_ids",
)


class RolloutRole(Role):
    """Samples responses; wakes its engine up before and (``free_cache_engine``) puts it to
    sleep after each generation."""

    def __init__(self, ctx: RoleContext) -> None:
        super().__init__(ctx)
        cfg = ctx.cfg
        rollout = cfg.actor_rollout_ref.rollout
        engine_cls = ctx.plan.load(PluginKind.ROLLOUT_ENGINE, rollout.name)
        self.free_cache_engine = bool(rollout.free_cache_engine)
        self.engine = engine_cls(
            RolloutContext(
                model_path=ctx.model_path,
                config=rollout,
                device=ctx.device,
                rank=ctx.rank,
                world_size=ctx.world_size,
                seed=int(cfg.trainer.seed),
                max_prompt_length=int(cfg.data.max_prompt_length),
                max_response_length=int(cfg.data.max_response_length),
                pad_token_id=ctx.pad_token_id,
                eos_token_ids=list(ctx.tokens.get("eos_token_ids", ())),
            )
        )

    def data_parallel_rank(self) -> DataParallelRank:
        return self.engine.data_parallel_rank()

    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        """Sample on this rank's prompts (``input_ids``, ``attention_mask``); returns
        ``responses``, ``response_mask``, ``rollout_log_probs`` (when the engine reports them),
        ``input_ids``, ``attention_mask`` and ``position_ids`` of prompt + response, on the CPU.

        A seeded request gets a seed of its own per data-parallel rank (tensor-parallel peers
        share it: they sample the same sequences together)."""
        self.engine.wake_up()
        try:
            if params.seed is not None:
                dp_rank = self.data_parallel_rank().dp_rank
                params = SamplingParams(
                    **{**params.__dict__, "seed": derive_seed(params.seed, "rank", dp_rank)}
                )
            out = self.engine.generate(prompts.select_keys(("input_ids", "attention_mask")), params)
        finally:
            if self.free_cache_engine:
                self.engine.sleep(level=1)
        return out.select_keys(GENERATED_KEYS).to("cpu")

    def reset_prefix_cache(self) -> None:
        """The engine drops the KV it keeps between calls (after a batch of episodes)."""
        self.engine.reset_prefix_cache()

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.engine.update_weights(named_tensors)

    def shutdown(self) -> None:
        self.engine.close()
