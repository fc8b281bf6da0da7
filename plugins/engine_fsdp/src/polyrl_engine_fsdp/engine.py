"""The FSDP2 training engine: one data-parallel rank of a sharded Hugging Face causal LM.

Read ``polyrl.interfaces.training_engine`` for the contract. What this engine adds:

- micro-batches by row count or by token budget (``use_dynamic_bsz``), the same number on every
  rank (FSDP's collectives would hang otherwise), with all-padding columns cut away;
- logits only for the response positions (``logits_to_keep``), scored in float32;
- a value head (``ModelHead.VALUE``, a critic): one scalar per response token, trained with a
  loss the critic role supplies;
- AdamW + warm-up/constant/cosine schedule, grad-norm clipping, a step with a non-finite grad
  norm skipped (and reported as ``actor/skipped_step``);
- weight streaming, DCP checkpoints and Hugging Face export (see :mod:`.checkpoint`);
- LoRA on the actor (``actor_rollout_ref.model.lora_rank > 0``, see :mod:`.lora`): peft adapters
  on frozen base weights; the stream is the merged model, checkpoints hold the adapters only, and
  :meth:`FSDPEngine.adapters_disabled` is the reference policy;
- Ulysses sequence parallelism (``ulysses_sequence_parallel_size`` > 1, see
  :mod:`polyrl_engine_kit.ulysses`): groups of consecutive ranks split each packed row, report
  one data-parallel rank to the driver, and FSDP still shards over the whole world.
"""

from __future__ import annotations

import logging
import math
import os
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from polyrl.api import (
    Batch,
    ConfigError,
    DataParallelRank,
    EngineContext,
    MicroBatchLossFn,
    MicroBatchValueLossFn,
    ModelHead,
    TrainingEngine,
    schema_node,
    tensor_parallel_mesh,
)
from polyrl_engine_fsdp import checkpoint as ckpt
from polyrl_engine_fsdp.lora import adapter_names, apply_lora, merge_stream, saved_name
from polyrl_engine_fsdp.modeling import (
    StepGathering,
    accumulates_unsharded,
    freeze_in_compute_dtype,
    reshard_all,
    shard_model,
)
from polyrl_engine_kit import fast_paths
from polyrl_engine_kit.checkpoint import export_on_rank0, loop_state, restore_loop_state
from polyrl_engine_kit.checks import head_problem
from polyrl_engine_kit.config import engine_node, resolve_settings
from polyrl_engine_kit.errors import EngineUsageError
from polyrl_engine_kit.log_prob_methods import LogProbMethods
from polyrl_engine_kit.logprob import EntropyMode, TokenScores
from polyrl_engine_kit.microbatch import equalize_over_ranks, plan_micro_batches
from polyrl_engine_kit.modeling import load_hf_model, torch_dtype
from polyrl_engine_kit.packed_scoring import packed_values
from polyrl_engine_kit.runtime import (
    default_backend,
    join_default_group,
    resolve_device,
    seed_everything,
)
from polyrl_engine_kit.schedule import advance_schedule, build_adamw, build_scheduler
from polyrl_engine_kit.scoring import (
    MODEL_KEYS,
    REQUIRED_KEYS,
    accepts_logits_to_keep,
    check_batch,
    dummy_logits,
    model_inputs,
    pad_to_response,
)
from polyrl_engine_kit.training import (
    EntropyMean,
    MicroLoss,
    StepPeakMemory,
    accumulate,
    entropy_mode,
    policy_micro_loss,
    report_step,
)
from polyrl_engine_kit.ulysses import sequence_parallel_group

MERGED_FOLDER = "merged"  # the merged model's subfolder of a LoRA export

log = logging.getLogger(__name__)

# Names other modules import from here (the DeepSpeed and Megatron engines did, tests may).
__all__ = [
    "MODEL_KEYS",
    "REQUIRED_KEYS",
    "EngineUsageError",
    "FSDPEngine",
    "MicroLoss",
    "seed_everything",
]


class FSDPEngine(LogProbMethods, TrainingEngine):
    """FSDP2 engine for ``actor`` (trainable) and ``ref`` (frozen) roles, and for value models
    (a critic, ``EngineContext.head=ModelHead.VALUE``)."""

    def __init__(self, ctx: EngineContext) -> None:
        super().__init__(ctx)
        self.settings = resolve_settings(
            ctx.model, ctx.engine, ctx.total_training_steps, ctx.role, ctx.world_size
        )
        self.device = resolve_device(ctx.device, "the FSDP engine")
        join_default_group(ctx, default_backend(self.device))
        seed_everything(ctx.seed)
        self.trainable = bool(ctx.trainable) and ctx.role != "ref"
        self.head = ModelHead(ctx.head)
        # the actor's (a critic gets the actor's model node; verl's critic key is its own)
        offload = schema_node(ctx.model, "actor_rollout_ref.model").enable_activation_offload
        self.activation_offload = (
            self.trainable and self.head is ModelHead.CAUSAL_LM and bool(offload)
        )
        master = torch_dtype(self.settings.master_dtype)  # verl's fsdp_config.model_dtype
        model = load_hf_model(ctx.model_path, self.settings, self.device, self.head, master)
        self.hf_config = model.config
        self.ulysses = ulysses_size(ctx, model.config)
        self.sequence_parallel = sequence_parallel_group(self.ulysses, self.device)
        if not self.trainable:
            model.requires_grad_(False)
            freeze_in_compute_dtype(model, self.settings)
        # LoRA adapts the policy being trained; a critic or a frozen reference trains no adapters.
        lora = self.settings.lora if self.trainable else None
        self.lora = lora if self.head is ModelHead.CAUSAL_LM else None
        paths = fast_paths.prepare(
            model,
            self.settings,
            self.device,
            self.lora is not None,
            sequence_parallel=self.sequence_parallel,
        )
        wrapped = model if self.lora is None else apply_lora(model, self.lora)
        self.model, self.mesh = shard_model(wrapped, self.settings, self.device)
        self.paths = fast_paths.finish(self.model, paths, self.settings, self.head)
        self.gathered_steps = accumulates_unsharded(self.model, self.settings, self.device)
        log.info(
            "FSDP engine (%s): layers kept gathered within a step: %s",
            ctx.role,
            self.gathered_steps,
        )
        self._accepts_logits_to_keep = accepts_logits_to_keep(model)
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: torch.optim.lr_scheduler.LambdaLR | None = None
        if self.trainable:
            trained = [p for p in self.model.parameters() if p.requires_grad]
            fused = self.device.type == "cuda" and not self.settings.param_offload
            self.optimizer = build_adamw(trained, self.settings.optim, fused)
            self.scheduler = build_scheduler(self.optimizer, self.settings.optim)
        self.model.train(self.trainable)
        self.global_step = 0
        self.metric_prefix = "critic" if self.head is ModelHead.VALUE else "actor"

    def data_parallel_rank(self) -> DataParallelRank:
        """The ranks of one sequence-parallel group are one data-parallel rank: they get the
        same rows, and the first of them returns the output."""
        return tensor_parallel_mesh(self.ctx.rank, self.ctx.world_size, self.ulysses)

    # ---- micro-batching -----------------------------------------------------------------------
    def _micro_batches(self, batch: Batch, training: bool) -> tuple[list[list[int]], int]:
        """Row groups for this rank and the number of dummy passes to match the other ranks."""
        groups = plan_micro_batches(batch, self.settings, training, self.paths.packed, self.ulysses)
        return equalize_over_ranks(groups, self.device)

    # ---- forward ------------------------------------------------------------------------------
    def _forward(
        self, batch: Batch, temperature: float, entropy: EntropyMode, sum_pi_squared: bool = False
    ) -> TokenScores:
        """Log-probs (and entropy, and ``sum_pi_squared``) ``[b, R]`` of the response tokens;
        zero on padding."""
        return fast_paths.policy_scores(
            self.model,
            batch,
            self.device,
            self.paths,
            self._accepts_logits_to_keep,
            temperature=temperature,
            entropy=entropy,
            sequence_parallel=self.sequence_parallel,
            sum_pi_squared=sum_pi_squared,
        )

    def _forward_values(self, batch: Batch) -> torch.Tensor:
        """Values ``[b, R]`` in float32, zero on padding: the head's output at the position that
        predicts each response token."""
        with warnings.catch_warnings():
            # The head's output (nn.Linear with a bias on [b, T, H]) is a view, which FSDP warns
            # about for the sake of in-place ops; nothing here writes into it.
            warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* a view tensor")
            if self.paths.packed:
                return packed_values(self.model, batch, self.device, self.sequence_parallel)
            trimmed, kwargs, response_attention = model_inputs(batch, self.device)
            kept = trimmed.kept_response
            values = self.model(**kwargs).logits[:, -(kept + 1) : -1, 0].float()
        return pad_to_response(values, None, response_attention, kept)[0]

    def _dummy_pass(self, backward: Callable[[torch.Tensor], None] | None) -> None:
        """A 2-token forward (and, with ``backward``, a zero-weight backward) that only takes
        part in FSDP's collectives, for a rank with fewer micro-batches than the others."""
        logits = dummy_logits(self.model, self.device)
        if backward is not None:
            backward(logits.float().sum() * 0.0)

    def _gathering(self, micro_batches: int) -> StepGathering:
        return StepGathering(
            self.model, self.gathered_steps, micro_batches, self.settings.reshard_after_forward
        )

    def _require_head(self, head: ModelHead, method: str) -> None:
        if self.head is not head:
            raise EngineUsageError(
                f"{method} needs an engine with the {head.value} head, but this one (role "
                f"{self.ctx.role!r}) was built with the {self.head.value} head"
            )

    # ---- inference ----------------------------------------------------------------------------
    def _no_grad_rows(
        self, batch: Batch, forward: Callable[[Batch], tuple[torch.Tensor | None, ...]], count: int
    ) -> list[torch.Tensor]:
        """``count`` float32 ``[B, R]`` outputs of ``forward`` over the micro-batches, without
        grad and in eval mode (an output ``forward`` returns as None stays zero).

        The outputs stay on the device until the last micro-batch and come back to the host
        once: a copy back per micro-batch would make the host wait for each one before
        launching the next, leaving the device idle while the host prepares it."""
        check_batch(batch, "FSDP")
        groups, dummies = self._micro_batches(batch, training=False)
        rows, width = batch["responses"].shape
        outputs = [
            torch.zeros((rows, width), dtype=torch.float32, device=self.device)
            for _ in range(count)
        ]
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad(), self._gathering(len(groups) + dummies):
                for group in groups:
                    index = torch.tensor(group, dtype=torch.long)
                    micro = batch.select_keys(MODEL_KEYS).select_rows(index)
                    at = index.to(self.device, non_blocking=True)
                    for output, value in zip(outputs, forward(micro)):
                        if value is not None:
                            output[at] = value.float()
                for _ in range(dummies):
                    self._dummy_pass(backward=None)
        finally:
            self.model.train(was_training)
            reshard_all(self.model)
        return [output.cpu() for output in outputs]

    def _scores(
        self, batch: Batch, temperature: float, calculate_entropy: bool, sum_pi_squared: bool
    ) -> TokenScores:
        """The no-grad scores of the whole batch; entropy and ``sum_pi_squared`` None unless
        asked for."""
        self._require_head(ModelHead.CAUSAL_LM, "compute_log_prob")
        mode = EntropyMode.DETACHED if calculate_entropy else EntropyMode.NONE
        outputs = self._no_grad_rows(
            batch, lambda micro: self._forward(micro, temperature, mode, sum_pi_squared), 3
        )
        wanted = (True, calculate_entropy, sum_pi_squared)
        return TokenScores(*(out if want else None for out, want in zip(outputs, wanted)))

    def compute_values(self, batch: Batch) -> torch.Tensor:
        self._require_head(ModelHead.VALUE, "compute_values")
        return self._no_grad_rows(batch, lambda micro: (self._forward_values(micro),), 1)[0]

    # ---- training -----------------------------------------------------------------------------
    def train_step(
        self, mini_batch: Batch, loss_fn: MicroBatchLossFn, *, temperature: float = 1.0
    ) -> dict[str, float]:
        """One optimizer step. Each micro-batch reaches ``loss_fn`` on the engine's device with
        ``meta`` keys ``mini_batch_rows``, ``mini_batch_response_tokens`` (this rank's) and
        ``num_micro_batches``, so a loss can scale itself to the mini-batch."""
        self._require_head(ModelHead.CAUSAL_LM, "train_step")
        mode = entropy_mode(loss_fn)
        entropy = EntropyMean()
        micro_loss = policy_micro_loss(self._forward, loss_fn, temperature, mode, entropy)
        return self._train(mini_batch, micro_loss, entropy)

    def train_value_step(
        self, mini_batch: Batch, loss_fn: MicroBatchValueLossFn
    ) -> dict[str, float]:
        """One optimizer step of the value head; micro-batches carry the same ``meta`` as in
        :meth:`train_step`."""
        self._require_head(ModelHead.VALUE, "train_value_step")
        return self._train(mini_batch, lambda micro: loss_fn(micro, self._forward_values(micro)))

    def _train(
        self, mini_batch: Batch, micro_loss: MicroLoss, entropy: EntropyMean | None = None
    ) -> dict[str, float]:
        """Backward through ``micro_loss`` of every micro-batch, then one optimizer step; the
        loss metrics averaged over the micro-batches, the grad norm and the lr."""
        if self.optimizer is None or self.scheduler is None:
            raise EngineUsageError(
                f"a training step was called on a non-trainable engine (role "
                f"{self.ctx.role!r}); the reference does not train"
            )
        check_batch(mini_batch, "FSDP")
        groups, dummies = self._micro_batches(mini_batch, training=True)
        self.model.train()
        peak = StepPeakMemory(self.device)
        with (
            self._gathering(len(groups) + dummies) as gathering,
            offloaded_activations(self.activation_offload, self.device),
        ):
            result = accumulate(mini_batch, groups, self.device, micro_loss, gathering.backward)
            for _ in range(dummies):
                self._dummy_pass(backward=gathering.backward)

        grad_norm, lr = self._optimizer_step()
        if entropy is not None:
            entropy.report(result, self.metric_prefix)
        peak.report(result, self.metric_prefix)
        return report_step(result, self.metric_prefix, grad_norm, lr, math.isfinite(grad_norm))

    def _optimizer_step(self) -> tuple[float, float]:
        """Clip, step (unless the grad norm is not finite), advance the schedule; return the
        pre-clip grad norm and the lr this step used."""
        assert self.optimizer is not None and self.scheduler is not None
        clip = self.settings.optim.clip_grad
        max_norm = clip if clip and clip > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm=max_norm)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        grad_norm = float(norm)
        lr = float(self.optimizer.param_groups[0]["lr"])
        skipped = not math.isfinite(grad_norm)
        if not skipped:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        advance_schedule(self.scheduler, skipped)
        self.global_step += 1
        return grad_norm, lr

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full tensors in the master dtype on the engine's device, in state-dict order. A tied
        weight is gathered once and yielded under each name the state dict has for it. With
        LoRA: the merged model under the base model's names (the training weights unchanged)."""
        if self.lora is None:
            return self._full_weights()
        return merge_stream(self.model, self._full_weights())

    def named_adapter_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        self._require_lora("named_adapter_weights")
        reshard_all(self.model)
        adapters = adapter_names(self.model)
        for name, value in self.model.state_dict().items():
            if name in adapters:
                yield saved_name(name), value.full_tensor() if isinstance(value, DTensor) else value

    @contextmanager
    def adapters_disabled(self) -> Iterator[None]:
        """peft's switch (the weights stay as they are), with the adapters still marked
        trainable: peft freezes them while off, and FSDP2 fixes which parameters train (and so
        their gradients' reduce dtype) at its first forward, which may be the reference's."""
        self._require_lora("adapters_disabled")
        adapters = [param for param in self.model.parameters() if param.requires_grad]
        with self.model.disable_adapter():
            for param in adapters:
                param.requires_grad_(True)
            yield

    def _require_lora(self, method: str) -> None:
        if self.lora is None:
            raise EngineUsageError(
                f"{method} needs a LoRA engine (actor_rollout_ref.model.lora_rank > 0, role "
                f"'actor'); this one (role {self.ctx.role!r}) trains no adapters"
            )

    def _adapter_names(self) -> set[str] | None:
        """What checkpoints hold of the model: the adapters with LoRA, else everything."""
        return None if self.lora is None else adapter_names(self.model)

    def _full_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """:meth:`named_weights` of the model as it is held (with LoRA: peft's names)."""
        reshard_all(self.model)
        state = self.model.state_dict()
        owners = _tied_groups(self.model)
        gathered: dict[int, torch.Tensor] = {}
        remaining = {key: len(names) for key, names in owners.items()}
        name_to_key = {name: key for key, names in owners.items() for name in names}
        for name, value in state.items():
            key = name_to_key.get(name)
            if key is not None and key in gathered:
                full = gathered[key]
            else:
                full = value.full_tensor() if isinstance(value, DTensor) else value
                if key is not None:
                    gathered[key] = full
            if key is not None:
                remaining[key] -= 1
                if remaining[key] == 0:
                    gathered.pop(key, None)
            yield name, full
            del full

    def save_checkpoint(self, path: str) -> None:
        reshard_all(self.model)
        extra = {
            **loop_state(self.global_step, self.scheduler, self.device),
            "world_size": self.ctx.world_size,
        }
        ckpt.save_sharded(path, self.model, self.optimizer, extra, self._adapter_names())

    def load_checkpoint(self, path: str) -> None:
        reshard_all(self.model)
        extra = ckpt.load_sharded(path, self.model, self.optimizer, self._adapter_names())
        self.global_step = restore_loop_state(extra, self.scheduler, self.device)
        dist.barrier()

    def export_hf(self, path: str) -> None:
        """The model as a Hugging Face folder; with LoRA the adapter folder (peft's layout) and,
        with ``export_merged_lora``, the merged model in ``<path>/merged``."""
        self._require_head(ModelHead.CAUSAL_LM, "export_hf")
        if self.lora is not None:
            self._export_lora(path)
            return
        reshard_all(self.model)
        state = ckpt.full_state_dict_on_rank0(self.model)
        dtype = torch_dtype(self.settings.dtype)
        export_on_rank0(path, state, self.hf_config, dtype, self.settings, self.ctx.model_path)
        del state
        dist.barrier()

    def _export_lora(self, path: str) -> None:
        assert self.lora is not None
        rank0 = dist.get_rank() == 0
        adapters = {name: t.cpu() for name, t in self.named_adapter_weights() if rank0}
        if rank0:
            source = self.ctx.model_path
            ckpt.write_adapter_export(path, self.model, adapters, self.settings, source)
        del adapters
        if self.lora.export_merged:
            merged = {name: t.cpu() for name, t in self.named_weights() if rank0}
            dtype = torch_dtype(self.settings.dtype)
            target = os.path.join(path, MERGED_FOLDER)
            export_on_rank0(
                target, merged, self.hf_config, dtype, self.settings, self.ctx.model_path
            )
            del merged
        dist.barrier()


def offloaded_activations(enabled: bool, device: torch.device) -> AbstractContextManager:
    """verl's ``enable_activation_offload``: while it is open, every tensor autograd saves for
    the backward is moved to host memory (pinned on CUDA) and brought back when the backward
    uses it; the GPU then holds no activations between a micro-batch's forward and backward,
    at the price of the copies. The gradients are those without it."""
    if not enabled:
        return nullcontext()
    return torch.autograd.graph.save_on_cpu(pin_memory=device.type == "cuda")


def ulysses_size(ctx: EngineContext, hf_config: object) -> int:
    """The role's ``ulysses_sequence_parallel_size``, checked against the world and the
    model's heads (the same lines ``polyrl validate`` reports)."""
    prefix = "critic" if ctx.role == "critic" else "actor_rollout_ref.actor"
    size = engine_node(ctx.engine).ulysses_sequence_parallel_size
    if not isinstance(size, int) or size < 1 or ctx.world_size % size:
        raise ConfigError(
            f"{prefix}.ulysses_sequence_parallel_size={size!r} must be a positive divisor of the "
            f"role's {ctx.world_size} ranks"
        )
    heads = int(getattr(hf_config, "num_attention_heads", 1))
    kv_heads = int(getattr(hf_config, "num_key_value_heads", None) or heads)
    problem = head_problem(heads, kv_heads, size, prefix)
    if problem:
        raise ConfigError(problem)
    return size


def _tied_groups(model: torch.nn.Module) -> dict[int, list[str]]:
    """Parameters registered under several names (tied weights): id -> names."""
    names: dict[int, list[str]] = defaultdict(list)
    for name, param in model.named_parameters(remove_duplicate=False):
        names[id(param)].append(name)
    return {key: group for key, group in names.items() if len(group) > 1}
