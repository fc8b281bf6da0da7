"""The hybrid-engine worker: actor, reference and rollout of one rank in one process.

One instance runs per device (a Ray actor). It joins the torch.distributed group of its worker
group, discovers plugins itself (it is a separate process), builds the engines named in the
config, and serves SPMD calls from the controller. Keeping the three roles in one process lets the
actor's weights reach the rollout engine as an in-memory stream after each update.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from polyrl.batch import Batch
from polyrl.interfaces import EngineContext, RolloutContext, SamplingParams
from polyrl.registry import get_registry
from polyrl.seeding import derive_seed
from polyrl.specs import PluginKind

# Keys the engines need for a forward pass; the rest of a batch stays on the driver.
MODEL_INPUT_KEYS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")
TRAIN_KEYS = (*MODEL_INPUT_KEYS, "old_log_probs", "ref_log_prob", "advantages")


def needs_reference(cfg: Any) -> bool:
    """A reference policy is built only when a KL term uses it."""
    return bool(cfg.actor_rollout_ref.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward)


def is_on_policy(cfg: Any) -> bool:
    """One epoch over one mini-batch: the policy that sampled is the one being updated, so the old
    log-probs equal the current ones (detached) and need no separate forward pass."""
    actor = cfg.actor_rollout_ref.actor
    return actor.ppo_epochs == 1 and actor.ppo_mini_batch_size == cfg.data.train_batch_size


class HybridWorker:
    """Serves one rank; every public method is called on all ranks at once by a WorkerGroup."""

    def __init__(
        self,
        cfg: dict[str, Any],
        model_path: str,
        rank: int,
        world_size: int,
        master_addr: str,
        master_port: int,
        total_training_steps: int,
        tokens: dict[str, Any],
    ) -> None:
        self.cfg = OmegaConf.create(cfg)
        self.rank, self.world_size = rank, world_size
        device = self.cfg.trainer.device
        self.device = device
        os.environ.update(
            MASTER_ADDR=master_addr,
            MASTER_PORT=str(master_port),
            RANK=str(rank),
            WORLD_SIZE=str(world_size),
            LOCAL_RANK="0",
        )
        if device == "cuda":
            torch.cuda.set_device(0)  # Ray exposes exactly one GPU to this actor
        else:
            torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
        dist.init_process_group(
            backend="nccl" if device == "cuda" else "gloo",
            init_method=f"tcp://{master_addr}:{master_port}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=float(self.cfg.trainer.collective_timeout_s)),
        )
        registry = get_registry()
        arr = self.cfg.actor_rollout_ref
        engine_cls = registry.load(PluginKind.TRAINING_ENGINE, arr.actor.strategy)
        seed = int(self.cfg.trainer.seed)
        optimizer_steps = self._optimizer_steps_per_training_step() * total_training_steps

        def engine_context(role: str, trainable: bool) -> EngineContext:
            engine_cfg = OmegaConf.merge(arr.actor, {"total_optimizer_steps": optimizer_steps})
            return EngineContext(
                role=role,
                model_path=model_path,
                model=arr.model,
                engine=engine_cfg,
                device=device,
                rank=rank,
                world_size=world_size,
                seed=seed,
                total_training_steps=total_training_steps,
                trainable=trainable,
            )

        self.actor = engine_cls(engine_context("actor", True))
        self.ref = engine_cls(engine_context("ref", False)) if needs_reference(self.cfg) else None
        rollout_cls = registry.load(PluginKind.ROLLOUT_ENGINE, arr.rollout.name)
        self.rollout = rollout_cls(
            RolloutContext(
                model_path=model_path,
                config=arr.rollout,
                device=device,
                rank=rank,
                world_size=world_size,
                seed=seed,
                max_prompt_length=int(self.cfg.data.max_prompt_length),
                max_response_length=int(self.cfg.data.max_response_length),
                pad_token_id=int(tokens["pad_token_id"]),
                eos_token_ids=list(tokens["eos_token_ids"]),
            )
        )
        from polyrl.algorithms.actor_loss import make_actor_loss_fn

        policy_loss = registry.load(PluginKind.POLICY_LOSS, arr.actor.policy_loss.loss_mode)
        self.loss_fn = make_actor_loss_fn(arr.actor, policy_loss)
        self.on_policy = is_on_policy(self.cfg)

    def _optimizer_steps_per_training_step(self) -> int:
        actor = self.cfg.actor_rollout_ref.actor
        return int(actor.ppo_epochs) * max(
            1, int(self.cfg.data.train_batch_size) // int(actor.ppo_mini_batch_size)
        )

    def ready(self) -> int:
        return self.rank

    # ---- generation --------------------------------------------------------------------------
    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        """Sample on this rank's prompts; the engine frees its cache afterwards when configured."""
        self.rollout.wake_up()
        try:
            if params.seed is not None:
                rank_seed = derive_seed(params.seed, "rank", self.rank)
                params = SamplingParams(**{**params.__dict__, "seed": rank_seed})
            out = self.rollout.generate(
                prompts.select_keys(("input_ids", "attention_mask")), params
            )
        finally:
            if self.cfg.actor_rollout_ref.rollout.free_cache_engine:
                self.rollout.sleep(level=1)
        return out.select_keys(
            (
                "responses",
                "response_mask",
                "rollout_log_probs",
                "input_ids",
                "attention_mask",
                "position_ids",
            )
        ).to("cpu")

    # ---- log-probs ---------------------------------------------------------------------------
    def compute_log_prob(self, batch: Batch) -> Batch:
        """Old log-probs (and entropy) under the current actor."""
        temperature = float(self.cfg.actor_rollout_ref.rollout.temperature)
        log_prob, entropy = self.actor.compute_log_prob(
            batch.select_keys(MODEL_INPUT_KEYS), temperature=temperature, calculate_entropy=True
        )
        out = Batch({"old_log_probs": log_prob})
        if entropy is not None:
            out["entropys"] = entropy
        return out

    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        temperature = float(self.cfg.actor_rollout_ref.rollout.temperature)
        log_prob, _ = self.ref.compute_log_prob(
            batch.select_keys(MODEL_INPUT_KEYS), temperature=temperature
        )
        return Batch({"ref_log_prob": log_prob})

    # ---- training ----------------------------------------------------------------------------
    def update_actor(self, batch: Batch) -> dict[str, float]:
        """PPO epochs over mini-batches of this rank's rows; one optimizer step per mini-batch."""
        actor_cfg = self.cfg.actor_rollout_ref.actor
        n = int(self.cfg.actor_rollout_ref.rollout.n)
        rows_per_mini = int(actor_cfg.ppo_mini_batch_size) * n // self.world_size
        temperature = float(self.cfg.actor_rollout_ref.rollout.temperature)
        batch = batch.select_keys(TRAIN_KEYS)
        loss_fn = self._on_policy_loss if self.on_policy else self.loss_fn
        generator = torch.Generator().manual_seed(int(self.cfg.trainer.seed) + self.rank)
        collected: dict[str, list[float]] = defaultdict(list)
        for _ in range(int(actor_cfg.ppo_epochs)):
            order = (
                torch.randperm(len(batch), generator=generator)
                if actor_cfg.shuffle
                else torch.arange(len(batch))
            )
            for mini in batch.select_rows(order).split(rows_per_mini):
                mini.meta["loss_norm"] = self._global_loss_norm(mini["response_mask"])
                for key, value in self.actor.train_step(
                    mini, loss_fn, temperature=temperature
                ).items():
                    collected[key].append(float(value))
        return {key: sum(values) / len(values) for key, values in collected.items()}

    def _global_loss_norm(self, response_mask: torch.Tensor) -> dict[str, float]:
        """Mini-batch denominators over ALL ranks, divided by the world size: each rank's loss
        is then its share of the global aggregate, and the gradient average across ranks that
        data parallelism performs yields exactly the global token/sequence mean."""
        from polyrl.algorithms.loss_agg import loss_norm_totals

        totals = loss_norm_totals(response_mask, max_len=int(self.cfg.data.max_response_length))
        counts = torch.tensor(
            [totals["num_seqs"], totals["num_tokens"]], dtype=torch.float64, device=self.device
        )
        dist.all_reduce(counts)  # NCCL reduces CUDA tensors only: counts live on the device
        counts = (counts / self.world_size).clamp(min=1.0 / self.world_size).cpu()
        return {
            "num_seqs": float(counts[0]),
            "num_tokens": float(counts[1]),
            "max_len": totals["max_len"],
        }

    def _on_policy_loss(
        self, micro_batch: Batch, log_prob: torch.Tensor, entropy: torch.Tensor | None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        micro_batch["old_log_probs"] = log_prob.detach()
        return self.loss_fn(micro_batch, log_prob, entropy)

    # ---- weight sync, checkpoints, export -----------------------------------------------------
    def sync_weights(self) -> dict[str, float]:
        """Stream the actor's full weights into the rollout engine (no disk round trip)."""
        start = time.perf_counter()
        moved = 0

        def stream():
            nonlocal moved
            for name, tensor in self.actor.named_weights():
                moved += tensor.numel() * tensor.element_size()
                yield name, tensor

        self.rollout.update_weights(stream())
        return {"bytes": float(moved), "seconds": time.perf_counter() - start}

    def save_checkpoint(self, directory: str) -> None:
        self.actor.save_checkpoint(os.path.join(directory, "actor"))

    def load_checkpoint(self, directory: str) -> None:
        self.actor.load_checkpoint(os.path.join(directory, "actor"))
        self.sync_weights()

    def export_hf(self, directory: str) -> None:
        self.actor.export_hf(directory)

    def shutdown(self) -> None:
        self.rollout.close()
        if dist.is_initialized():
            dist.destroy_process_group()
