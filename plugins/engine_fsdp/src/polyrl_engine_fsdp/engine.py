"""The FSDP2 training engine: one data-parallel rank of a sharded Hugging Face causal LM.

Read ``polyrl.interfaces.training_engine`` for the contract. What this engine adds:

- micro-batches by row count or by token budget (``use_dynamic_bsz``), the same number on every
  rank (FSDP's collectives would hang otherwise), with all-padding columns cut away;
- logits only for the response positions (``logits_to_keep``), scored in float32;
- a value head (``ModelHead.VALUE``, a critic): one scalar per response token, trained with a
  loss the critic role supplies;
- AdamW + warm-up/constant/cosine schedule, grad-norm clipping, a step with a non-finite grad
  norm skipped (and reported as ``actor/skipped_step``);
- weight streaming, DCP checkpoints and Hugging Face export (see :mod:`.checkpoint`).
"""

from __future__ import annotations

import inspect
import math
import random
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from polyrl.batch import Batch
from polyrl.errors import PolyrlError
from polyrl.interfaces.training_engine import (
    EngineContext,
    MicroBatchLossFn,
    MicroBatchValueLossFn,
    ModelHead,
    TrainingEngine,
)
from polyrl_engine_fsdp import checkpoint as ckpt
from polyrl_engine_fsdp.config import resolve_settings
from polyrl_engine_fsdp.logprob import EntropyMode, token_logprob_entropy
from polyrl_engine_fsdp.microbatch import (
    TrimmedInputs,
    equalize_count,
    fixed_partition,
    row_lengths,
    token_budget_partition,
    trim_columns,
)
from polyrl_engine_fsdp.modeling import load_hf_model, reshard_all, shard_model, torch_dtype
from polyrl_engine_fsdp.schedule import build_scheduler

REQUIRED_KEYS = ("input_ids", "attention_mask", "responses")
MODEL_KEYS = ("input_ids", "attention_mask", "position_ids", "responses")
# A micro-batch's loss and metrics, computed from its forward pass (the head decides which).
MicroLoss = Callable[[Batch], tuple[torch.Tensor, dict[str, float]]]


class EngineUsageError(PolyrlError):
    """The engine was called in a way its role does not allow, or with a malformed batch."""


def _ensure_process_group(ctx: EngineContext, device: torch.device) -> None:
    """Use the worker's process group; for a lone process without one, make a 1-rank group."""
    if not dist.is_initialized():
        if ctx.world_size != 1:
            raise EngineUsageError(
                f"torch.distributed is not initialised but world_size={ctx.world_size}; the "
                f"worker must call torch.distributed.init_process_group before building the engine"
            )
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    if dist.get_world_size() != ctx.world_size or dist.get_rank() != ctx.rank:
        raise EngineUsageError(
            f"EngineContext says rank {ctx.rank} of {ctx.world_size} but the default process "
            f"group is rank {dist.get_rank()} of {dist.get_world_size()}"
        )


def _device(name: str) -> torch.device:
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise EngineUsageError("trainer.device=cuda but torch sees no CUDA device")
        return torch.device("cuda", torch.cuda.current_device())
    if name != "cpu":
        raise EngineUsageError(f"device {name!r} is not supported by the FSDP engine: cpu or cuda")
    return torch.device("cpu")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


class FSDPEngine(TrainingEngine):
    """FSDP2 engine for ``actor`` (trainable) and ``ref`` (frozen) roles, and for value models
    (a critic, ``EngineContext.head=ModelHead.VALUE``)."""

    def __init__(self, ctx: EngineContext) -> None:
        super().__init__(ctx)
        self.settings = resolve_settings(
            ctx.model, ctx.engine, ctx.total_training_steps, ctx.role, ctx.world_size
        )
        self.device = _device(ctx.device)
        _ensure_process_group(ctx, self.device)
        seed_everything(ctx.seed)
        self.trainable = bool(ctx.trainable) and ctx.role != "ref"
        self.head = ModelHead(ctx.head)
        model = load_hf_model(ctx.model_path, self.settings, self.device, self.head)
        self.hf_config = model.config
        if not self.trainable:
            model.requires_grad_(False)
        self.model, self.mesh = shard_model(model, self.settings, self.device)
        self._accepts_logits_to_keep = (
            "logits_to_keep" in inspect.signature(type(model).forward).parameters
        )
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: torch.optim.lr_scheduler.LambdaLR | None = None
        if self.trainable:
            optim = self.settings.optim
            self.optimizer = torch.optim.AdamW(
                self.model.parameters(),
                lr=optim.lr,
                betas=optim.betas,
                weight_decay=optim.weight_decay,
            )
            self.scheduler = build_scheduler(self.optimizer, optim)
        self.model.train(self.trainable)
        self.global_step = 0
        self.metric_prefix = "critic" if self.head is ModelHead.VALUE else "actor"

    # ---- micro-batching -----------------------------------------------------------------------
    def _micro_batches(self, batch: Batch, training: bool) -> tuple[list[list[int]], int]:
        """Row groups for this rank and the number of dummy passes to match the other ranks."""
        s = self.settings
        if s.use_dynamic_bsz:
            budget = s.max_token_len if training else s.log_prob_max_token_len
            key = "ppo_max_token_len_per_gpu" if training else "log_prob_max_token_len_per_gpu"
            lengths = row_lengths(batch["attention_mask"], batch["responses"].shape[1])
            groups = token_budget_partition(lengths, budget, f"actor_rollout_ref.actor.{key}")
        else:
            size = s.micro_batch_size if training else s.log_prob_micro_batch_size
            groups = fixed_partition(len(batch), size)
        count = torch.tensor([len(groups)], dtype=torch.long, device=self._collective_device())
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        return equalize_count(groups, int(count.item()))

    def _collective_device(self) -> torch.device:
        return self.device if dist.get_backend() == "nccl" else torch.device("cpu")

    # ---- forward ------------------------------------------------------------------------------
    def _trimmed_inputs(self, batch: Batch) -> tuple[TrimmedInputs, dict[str, Any], torch.Tensor]:
        """The micro-batch without its all-padding columns, the model's keyword arguments, and
        the response part of the attention mask ``[b, R]`` (on the device)."""
        responses = batch["responses"].to(self.device)
        attention_mask = batch["attention_mask"].to(self.device)
        position_ids = batch.get("position_ids")
        trimmed = trim_columns(
            batch["input_ids"].to(self.device),
            attention_mask,
            None if position_ids is None else position_ids.to(self.device),
            responses,
        )
        kwargs: dict[str, Any] = {
            "input_ids": trimmed.input_ids,
            "attention_mask": trimmed.attention_mask,
            "position_ids": trimmed.position_ids,
            "use_cache": False,
        }
        return trimmed, kwargs, attention_mask[:, -responses.shape[1] :]

    def _forward(
        self, batch: Batch, temperature: float, entropy: EntropyMode
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (and entropy) ``[b, R]`` of the response tokens; zero on padding."""
        trimmed, kwargs, response_attention = self._trimmed_inputs(batch)
        response_width, kept = response_attention.shape[1], trimmed.kept_response
        if self._accepts_logits_to_keep:
            kwargs["logits_to_keep"] = kept + 1
        logits = self.model(**kwargs).logits
        logits = logits[:, -(kept + 1) : -1]
        log_prob, ent = token_logprob_entropy(logits, trimmed.labels, temperature, entropy)
        del logits
        valid = response_attention[:, :kept].to(log_prob.dtype)
        pad = (0, response_width - kept)
        log_prob = F.pad(log_prob * valid, pad)
        if ent is not None:
            ent = F.pad(ent * valid, pad)
        return log_prob, ent

    def _forward_values(self, batch: Batch) -> torch.Tensor:
        """Values ``[b, R]`` in float32, zero on padding: the head's output at the position that
        predicts each response token."""
        trimmed, kwargs, response_attention = self._trimmed_inputs(batch)
        response_width, kept = response_attention.shape[1], trimmed.kept_response
        with warnings.catch_warnings():
            # The head's output (nn.Linear with a bias on [b, T, H]) is a view, which FSDP warns
            # about for the sake of in-place ops; nothing here writes into it.
            warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* a view tensor")
            values = self.model(**kwargs).logits[:, -(kept + 1) : -1, 0].float()
        valid = response_attention[:, :kept].to(values.dtype)
        return F.pad(values * valid, (0, response_width - kept))

    def _dummy_pass(self, backward: bool) -> None:
        """A 2-token forward (and zero-weight backward) that only takes part in FSDP's
        collectives, for a rank with fewer micro-batches than the others."""
        ids = torch.zeros((1, 2), dtype=torch.long, device=self.device)
        logits = self.model(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            position_ids=torch.arange(2, device=self.device).unsqueeze(0),
            use_cache=False,
        ).logits
        if backward:
            (logits.float().sum() * 0.0).backward()

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
        grad and in eval mode (an output ``forward`` returns as None stays zero)."""
        _check_batch(batch)
        groups, dummies = self._micro_batches(batch, training=False)
        rows, width = batch["responses"].shape
        outputs = [torch.zeros((rows, width), dtype=torch.float32) for _ in range(count)]
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                for group in groups:
                    index = torch.tensor(group, dtype=torch.long)
                    micro = batch.select_keys(MODEL_KEYS).select_rows(index)
                    for output, value in zip(outputs, forward(micro)):
                        if value is not None:
                            output[index] = value.float().cpu()
                for _ in range(dummies):
                    self._dummy_pass(backward=False)
        finally:
            self.model.train(was_training)
            reshard_all(self.model)
        return outputs

    def compute_log_prob(
        self, batch: Batch, *, temperature: float = 1.0, calculate_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        self._require_head(ModelHead.CAUSAL_LM, "compute_log_prob")
        mode = EntropyMode.DETACHED if calculate_entropy else EntropyMode.NONE
        outputs = self._no_grad_rows(
            batch,
            lambda micro: self._forward(micro, temperature, mode),
            2 if calculate_entropy else 1,
        )
        return outputs[0], outputs[1] if calculate_entropy else None

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
        with_grad = self.settings.entropy_coeff != 0
        entropy_mode = EntropyMode.GRAD if with_grad else EntropyMode.DETACHED
        entropy = {"sum": 0.0, "tokens": 0.0}

        def micro_loss(micro: Batch) -> tuple[torch.Tensor, dict[str, float]]:
            log_prob, ent = self._forward(micro, temperature, entropy_mode)
            passed = ent if entropy_mode == EntropyMode.GRAD else None
            loss, metrics = loss_fn(micro, log_prob, passed)
            if ent is not None:
                mask = _response_mask(micro).to(ent.dtype)
                entropy["sum"] += float((ent.detach() * mask).sum())
                entropy["tokens"] += float(mask.sum())
            return loss, metrics

        result = self._train(mini_batch, micro_loss)
        key = f"{self.metric_prefix}/entropy"
        if key not in result and entropy["tokens"] > 0:
            result[key] = entropy["sum"] / entropy["tokens"]
        return result

    def train_value_step(
        self, mini_batch: Batch, loss_fn: MicroBatchValueLossFn
    ) -> dict[str, float]:
        """One optimizer step of the value head; micro-batches carry the same ``meta`` as in
        :meth:`train_step`."""
        self._require_head(ModelHead.VALUE, "train_value_step")
        return self._train(mini_batch, lambda micro: loss_fn(micro, self._forward_values(micro)))

    def _train(self, mini_batch: Batch, micro_loss: MicroLoss) -> dict[str, float]:
        """Backward through ``micro_loss`` of every micro-batch, then one optimizer step; the
        loss metrics averaged over the micro-batches, the grad norm and the lr."""
        if self.optimizer is None or self.scheduler is None:
            raise EngineUsageError(
                f"a training step was called on a non-trainable engine (role "
                f"{self.ctx.role!r}); the reference does not train"
            )
        _check_batch(mini_batch)
        groups, dummies = self._micro_batches(mini_batch, training=True)
        meta = {
            "mini_batch_rows": len(mini_batch),
            "mini_batch_response_tokens": float(_response_mask(mini_batch).sum()),
            "num_micro_batches": len(groups),
        }
        self.model.train()
        sums: dict[str, float] = defaultdict(float)
        counts: dict[str, int] = defaultdict(int)
        for group in groups:
            micro = mini_batch.select_rows(torch.tensor(group, dtype=torch.long)).to(self.device)
            micro.meta.update(meta)
            loss, metrics = micro_loss(micro)
            loss.backward()
            for key, value in metrics.items():
                sums[key] += float(value)
                counts[key] += 1
        for _ in range(dummies):
            self._dummy_pass(backward=True)

        grad_norm, lr = self._optimizer_step()
        result = {key: sums[key] / counts[key] for key in sums}
        p = self.metric_prefix
        result[f"{p}/grad_norm"] = grad_norm
        result[f"{p}/lr"] = lr
        if not math.isfinite(grad_norm):
            result[f"{p}/skipped_step"] = 1.0
        return result

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
        with warnings.catch_warnings():
            if skipped:  # torch warns when the schedule moves before any optimizer.step()
                warnings.simplefilter("ignore", UserWarning)
            self.scheduler.step()
        self.global_step += 1
        return grad_norm, lr

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full tensors in the master dtype on the engine's device, in state-dict order. A tied
        weight is gathered once and yielded under each name the state dict has for it."""
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
            "global_step": self.global_step,
            "scheduler": None if self.scheduler is None else self.scheduler.state_dict(),
            "rng": ckpt.rng_state(self.device),
            "world_size": self.ctx.world_size,
        }
        ckpt.save_sharded(path, self.model, self.optimizer, extra)

    def load_checkpoint(self, path: str) -> None:
        reshard_all(self.model)
        extra = ckpt.load_sharded(path, self.model, self.optimizer)
        self.global_step = int(extra["global_step"])
        if self.scheduler is not None and extra.get("scheduler") is not None:
            self.scheduler.load_state_dict(extra["scheduler"])
        ckpt.set_rng_state(extra["rng"], self.device)
        dist.barrier()

    def export_hf(self, path: str) -> None:
        self._require_head(ModelHead.CAUSAL_LM, "export_hf")
        reshard_all(self.model)
        state = ckpt.full_state_dict_on_rank0(self.model)
        if dist.get_rank() == 0:
            ckpt.write_hf_folder(
                path,
                state,
                self.hf_config,
                torch_dtype(self.settings.dtype),
                self.settings.tokenizer_path or self.ctx.model_path,
                self.settings.trust_remote_code,
            )
        del state
        dist.barrier()


def _check_batch(batch: Batch) -> None:
    missing = [key for key in REQUIRED_KEYS if key not in batch]
    if missing:
        raise EngineUsageError(
            f"batch lacks {missing}; the FSDP engine needs input_ids [B, P+R], attention_mask "
            f"[B, P+R] and responses [B, R] (position_ids optional)"
        )
    ids, mask, responses = batch["input_ids"], batch["attention_mask"], batch["responses"]
    if ids.shape != mask.shape or ids.shape[1] <= responses.shape[1]:
        raise EngineUsageError(
            f"input_ids {tuple(ids.shape)}, attention_mask {tuple(mask.shape)} and responses "
            f"{tuple(responses.shape)} do not fit the layout [prompt | response]"
        )


def _response_mask(batch: Batch) -> torch.Tensor:
    if "response_mask" in batch:
        return batch["response_mask"]
    width = batch["responses"].shape[1]
    return batch["attention_mask"][:, -width:]


def _tied_groups(model: torch.nn.Module) -> dict[int, list[str]]:
    """Parameters registered under several names (tied weights): id -> names."""
    names: dict[int, list[str]] = defaultdict(list)
    for name, param in model.named_parameters(remove_duplicate=False):
        names[id(param)].append(name)
    return {key: group for key, group in names.items() if len(group) > 1}
