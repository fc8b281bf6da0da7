"""The DeepSpeed training engine: one data-parallel rank of a ZeRO-partitioned HF causal LM.

Read ``polyrl.interfaces.training_engine`` for the contract. The engine trains like the FSDP
engine, step for step: the same keys (``actor_rollout_ref.model.*`` and the role's node), the
same micro-batches (by count or token budget, the same number on every rank), the same float32
scoring of response-only logits, torch's AdamW and polyrl's LR schedule, a step with a
non-finite grad norm skipped. DeepSpeed partitions optimizer state (ZeRO-1), gradients
(ZeRO-2) and parameters (ZeRO-3), offloads to CPU when asked, and keeps fp32 master weights
under bf16/fp16. Its own settings are ``plugins.deepspeed.*`` (:mod:`.settings`). It takes the
FSDP engine's speed paths (:mod:`polyrl_engine_kit.fast_paths`: padding-free packing, log-probs
without full-vocabulary logits, decoder layers compiled on CUDA), all but packing off under
ZeRO-3, whose partitioned parameters they would read outside their modules.
"""

from __future__ import annotations

import logging
import math
import os
from collections import defaultdict
from collections.abc import Iterator

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.accelerator import get_accelerator
from deepspeed.runtime.zero.partition_parameters import GatheredParameters
from deepspeed.utils import safe_get_full_fp32_param

from polyrl.api import Batch, EngineContext, MicroBatchLossFn, ModelHead, TrainingEngine
from polyrl_engine_deepspeed import checkpoint as ds_ckpt
from polyrl_engine_deepspeed.ds_config import deepspeed_config
from polyrl_engine_deepspeed.settings import deepspeed_settings
from polyrl_engine_kit import fast_paths
from polyrl_engine_kit.checkpoint import export_on_rank0, loop_state, restore_loop_state
from polyrl_engine_kit.config import resolve_settings
from polyrl_engine_kit.errors import EngineUsageError
from polyrl_engine_kit.log_prob_methods import LogProbMethods
from polyrl_engine_kit.logprob import EntropyMode, TokenScores
from polyrl_engine_kit.microbatch import equalize_over_ranks, plan_micro_batches
from polyrl_engine_kit.modeling import load_hf_model, torch_dtype
from polyrl_engine_kit.runtime import (
    default_backend,
    join_default_group,
    resolve_device,
    seed_everything,
)
from polyrl_engine_kit.schedule import advance_schedule, build_adamw, build_scheduler
from polyrl_engine_kit.scoring import (
    MODEL_KEYS,
    accepts_logits_to_keep,
    check_batch,
    dummy_logits,
)
from polyrl_engine_kit.training import (
    EntropyMean,
    StepPeakMemory,
    accumulate,
    entropy_mode,
    policy_micro_loss,
    report_step,
    require_trainable,
)


def _join_process_group(ctx: EngineContext, device: torch.device) -> None:
    """DeepSpeed on the worker's default process group (a lone process gets a 1-rank group).

    ``deepspeed.init_distributed`` adopts an initialised group instead of making one; DeepSpeed
    reads ``LOCAL_RANK`` from the environment, which the polyrl worker sets (and which is 0 for
    a lone process).
    """
    join_default_group(ctx, default_backend(device))
    if ctx.world_size == 1:
        os.environ.setdefault("LOCAL_RANK", "0")
    elif "LOCAL_RANK" not in os.environ:
        raise EngineUsageError(
            "DeepSpeed needs LOCAL_RANK (this process's device index on its node) in the "
            "environment; the polyrl worker sets it, a custom launcher must too"
        )
    _skip_the_shared_memory_allreduce_build()
    deepspeed.init_distributed(dist_backend=dist.get_backend(), dist_init_required=False)


def _skip_the_shared_memory_allreduce_build() -> None:
    """Keep DeepSpeed's communication backend from compiling its CPU shared-memory op.

    On a CPU accelerator the backend JIT-compiles that C++ op (tens of CPU seconds on a machine
    that has not built it yet) for ``inference_all_reduce`` alone, which training never calls.
    Marked incompatible, the backend leaves every collective to torch.distributed, as it does
    where the op does not exist; DeepSpeed caches its compatibility table in the module, so
    the mark holds for the process.
    """
    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is not None:
        deepspeed.ops.__compatible_ops__[builder.NAME] = False


class DeepSpeedEngine(LogProbMethods, TrainingEngine):
    """DeepSpeed ZeRO engine for ``actor`` (trainable) and ``ref`` (frozen) roles."""

    def __init__(self, ctx: EngineContext) -> None:
        super().__init__(ctx)
        self.settings = resolve_settings(
            ctx.model, ctx.engine, ctx.total_training_steps, ctx.role, world_size=None
        )
        self.zero = deepspeed_settings(ctx.model)
        self.device = resolve_device(ctx.device, "DeepSpeed here")
        _join_process_group(ctx, self.device)
        logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
        seed_everything(ctx.seed)
        self.trainable = bool(ctx.trainable) and ctx.role != "ref"
        model = load_hf_model(ctx.model_path, self.settings, self.device)
        # the FSDP engine's speed paths (packing, fused log-probs, compiled layers or Liger);
        # ZeRO-3 keeps parameters partitioned, which rules out the last two but packing
        partitioned = self.zero.zero_stage == 3
        paths = fast_paths.prepare(model, self.settings, self.device, False, partitioned)
        self.hf_config = model.config
        self._logits_to_keep = accepts_logits_to_keep(model)
        optim = self.settings.optim
        optimizer = None
        if self.trainable:
            optimizer = build_adamw(model.parameters(), optim)
        else:
            model.requires_grad_(False)
        config = deepspeed_config(
            self.zero,
            dtype=self.settings.dtype,
            clip_grad=optim.clip_grad,
            on_cuda=self.device.type == "cuda",
            trainable=self.trainable,
        )
        self.engine, _, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=config, dist_init_required=False
        )
        self.paths = fast_paths.finish(
            self.engine.module, paths, self.settings, ModelHead.CAUSAL_LM, partitioned
        )
        # polyrl's schedule on the client optimizer, whose param groups ZeRO keeps (it swaps
        # their tensors for its fp32 partitions); stepped once per optimizer step, skipped or not.
        self.optimizer = optimizer
        self.scheduler = None if optimizer is None else build_scheduler(optimizer, optim)
        self.engine.train(self.trainable)
        self.global_step = 0
        self.metric_prefix = "critic" if ctx.role == "critic" else "actor"

    # ---- micro-batching -----------------------------------------------------------------------
    def _micro_batches(self, batch: Batch, training: bool) -> tuple[list[list[int]], int]:
        """Row groups for this rank and the number of dummy passes to match the other ranks:
        ZeRO-3 gathers parameters in every forward and ZeRO-2/3 reduce gradients in every
        backward, collectives that every rank must join."""
        groups = plan_micro_batches(batch, self.settings, training, self.paths.packed)
        return equalize_over_ranks(groups, self.device)

    def _score(
        self, micro: Batch, temperature: float, entropy: EntropyMode, sum_pi_squared: bool = False
    ) -> TokenScores:
        return fast_paths.policy_scores(
            self.engine,
            micro,
            self.device,
            self.paths,
            self._logits_to_keep,
            temperature=temperature,
            entropy=entropy,
            sum_pi_squared=sum_pi_squared,
        )

    # ---- TrainingEngine -----------------------------------------------------------------------
    def _scores(
        self, batch: Batch, temperature: float, calculate_entropy: bool, sum_pi_squared: bool
    ) -> TokenScores:
        """The no-grad scores ``[B, R]`` of the whole batch, float32 on the host; entropy and
        ``sum_pi_squared`` None unless asked for."""
        check_batch(batch, "DeepSpeed")
        groups, dummies = self._micro_batches(batch, training=False)
        rows, width = batch["responses"].shape
        wanted = (True, calculate_entropy, sum_pi_squared)
        outputs = [torch.zeros((rows, width), dtype=torch.float32) if w else None for w in wanted]
        mode = EntropyMode.DETACHED if calculate_entropy else EntropyMode.NONE
        was_training = self.engine.training
        self.engine.eval()
        try:
            with torch.no_grad():
                for group in groups:
                    index = torch.tensor(group, dtype=torch.long)
                    micro = batch.select_keys(MODEL_KEYS).select_rows(index)
                    scores = self._score(micro, temperature, mode, sum_pi_squared)
                    for output, value in zip(outputs, scores):
                        if output is not None and value is not None:
                            output[index] = value.float().cpu()
                for _ in range(dummies):
                    dummy_logits(self.engine, self.device)
        finally:
            self.engine.train(was_training)
        return TokenScores(*outputs)  # type: ignore[arg-type]

    def train_step(
        self, mini_batch: Batch, loss_fn: MicroBatchLossFn, *, temperature: float = 1.0
    ) -> dict[str, float]:
        """One optimizer step. Each micro-batch reaches ``loss_fn`` on the engine's device with
        ``meta`` keys ``mini_batch_rows``, ``mini_batch_response_tokens`` (this rank's) and
        ``num_micro_batches``; DeepSpeed accumulates the gradients of all of them until the
        step (``managed_gradient_accumulation: false``), without rescaling the losses."""
        require_trainable(self.optimizer, self.scheduler, self.ctx.role)
        check_batch(mini_batch, "DeepSpeed")
        groups, dummies = self._micro_batches(mini_batch, training=True)
        mode = entropy_mode(loss_fn)
        entropy = EntropyMean()
        micro_loss = policy_micro_loss(self._score, loss_fn, temperature, mode, entropy)
        self.engine.train()
        peak = StepPeakMemory(self.device)
        result = accumulate(mini_batch, groups, self.device, micro_loss, self.engine.backward)
        for _ in range(dummies):
            self.engine.backward(dummy_logits(self.engine, self.device).float().sum() * 0.0)

        grad_norm, lr, applied = self._optimizer_step()
        entropy.report(result, self.metric_prefix)
        peak.report(result, self.metric_prefix)
        return report_step(result, self.metric_prefix, grad_norm, lr, applied)

    def _optimizer_step(self) -> tuple[float, float, bool]:
        """DeepSpeed's step (reduce, clip, AdamW; skipped on a non-finite grad norm), then the
        schedule; returns the pre-clip grad norm, the lr this step used, whether it applied."""
        assert self.optimizer is not None and self.scheduler is not None
        lr = float(self.optimizer.param_groups[0]["lr"])
        self.engine.step()
        applied = bool(self.engine.was_step_applied())
        norm = self.engine.get_global_grad_norm()
        grad_norm = float(norm) if applied and norm is not None else math.inf
        advance_schedule(self.scheduler, skipped=not applied)
        self.global_step += 1
        return grad_norm, lr, applied

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full tensors under the HF ``state_dict()`` names, in its order, on the engine's
        device: a trainable engine's float32 master weights (from ZeRO's partitions, which bf16
        weights are rounded from; the FSDP engine streams its masters too), a frozen one's
        weights as its forward uses them. One parameter at a time, collective; a tied weight is
        gathered once and yielded under each name."""
        state = self.engine.module.state_dict(keep_vars=True)
        owners: dict[int, int] = defaultdict(int)
        for tensor in state.values():
            owners[id(tensor)] += 1
        gathered: dict[int, torch.Tensor] = {}
        for name, tensor in state.items():
            key = id(tensor)
            full = gathered.get(key)
            if full is None:
                full = self._full_tensor(tensor)
                if owners[key] > 1:
                    gathered[key] = full
            owners[key] -= 1
            if owners[key] == 0:
                gathered.pop(key, None)
            yield name, full
            del full

    def _full_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` whole (collective): the fp32 master assembled from the ZeRO partitions of a
        trainable engine; a frozen ZeRO-3 parameter gathered and copied out before DeepSpeed
        frees the gathered buffer; anything else detached."""
        if self.trainable:
            master = safe_get_full_fp32_param(tensor)
            if master is not None:
                return master
        if not hasattr(tensor, "ds_id"):
            return tensor.detach()
        with GatheredParameters([tensor], modifier_rank=None):
            return tensor.detach().clone()

    def save_checkpoint(self, path: str) -> None:
        extra = {
            **loop_state(self.global_step, self.scheduler, self.device),
            "layout": self._layout(),
        }
        ds_ckpt.save(path, self.engine, extra)

    def load_checkpoint(self, path: str) -> None:
        extra = ds_ckpt.load(path, self.engine, self._layout(), with_optimizer=self.trainable)
        self.global_step = restore_loop_state(extra, self.scheduler, self.device)
        dist.barrier()

    def _layout(self) -> dict[str, int]:
        return {
            "world_size": self.ctx.world_size,
            "zero_stage": int(self.engine.zero_optimization_stage()),
        }

    def export_hf(self, path: str) -> None:
        rank0 = dist.get_rank() == 0
        state = {name: tensor.cpu() for name, tensor in self.named_weights() if rank0}
        dtype = torch_dtype(self.settings.dtype)
        export_on_rank0(path, state, self.hf_config, dtype, self.settings, self.ctx.model_path)
        del state
        dist.barrier()
