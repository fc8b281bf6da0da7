"""The Megatron training engine: one rank of a megatron-core GPTModel split by tensor parallelism.

Read ``polyrl.interfaces.training_engine`` for the contract. Workers are grouped in consecutive
runs of ``actor_rollout_ref.actor.megatron.tensor_model_parallel_size``: each run holds one copy
of the model split over its ranks (attention heads, MLP columns and the vocabulary) and is one
data-parallel rank; every member gets the same rows and the first returns the output. What the
engine shares with the FSDP engine: the keys it reads, the micro-batches (by count or token
budget), float32 master weights with bf16 compute, torch's AdamW with polyrl's LR schedule and
grad-norm clipping, a step with a non-finite grad norm skipped, and the Hugging Face export.
What is its own: the weights live in megatron-core's layout (:mod:`.convert`), the log-probs and
entropy are computed without gathering the vocabulary (:mod:`.vocab_parallel`), and gradients
are averaged over the data-parallel group after the last micro-batch (TP shards need no
reduction: a replicated weight's gradient is already the same on every TP rank).
"""

from __future__ import annotations

import math
import warnings
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from polyrl.batch import Batch
from polyrl.config.nodes import schema_node
from polyrl.errors import ConfigError
from polyrl.interfaces.training_engine import EngineContext, MicroBatchLossFn, TrainingEngine
from polyrl.workers.mesh import DataParallelRank
from polyrl_engine_fsdp.checkpoint import rng_state, set_rng_state, write_hf_folder
from polyrl_engine_fsdp.config import resolve_settings
from polyrl_engine_fsdp.engine import EngineUsageError, seed_everything
from polyrl_engine_fsdp.logprob import EntropyMode
from polyrl_engine_fsdp.microbatch import (
    fixed_partition,
    row_lengths,
    token_budget_partition,
    trim_columns,
)
from polyrl_engine_fsdp.modeling import load_hf_config, torch_dtype
from polyrl_engine_fsdp.schedule import build_scheduler
from polyrl_engine_megatron import checkpoint as mckpt
from polyrl_engine_megatron.checks import dtype_problem, parallel_problems
from polyrl_engine_megatron.convert import GPTShape, megatron_to_hf, split_dim
from polyrl_engine_megatron.model import build_gpt_model, init_model_parallel, load_hf_weights
from polyrl_engine_megatron.vocab_parallel import vocab_parallel_logprob_entropy

MODEL_KEYS = ("input_ids", "attention_mask", "position_ids", "responses")


def _tensor_parallel_size(ctx: EngineContext) -> int:
    """``actor_rollout_ref.actor.megatron.tensor_model_parallel_size`` of the role's node, after
    the same checks as ``polyrl validate``."""
    engine, model = ctx.engine, ctx.model
    megatron = schema_node({"megatron": engine.get("megatron") or {}}, "actor_rollout_ref.actor")
    problems = parallel_problems(megatron.megatron)
    dtype = dtype_problem(schema_node(model, "actor_rollout_ref.model"))
    problems += [dtype] if dtype else []
    if problems:
        raise ConfigError("; ".join(problems))
    size = int(megatron.megatron.tensor_model_parallel_size)
    if ctx.world_size % size:
        raise ConfigError(
            f"actor_rollout_ref.actor.megatron.tensor_model_parallel_size={size} does not divide "
            f"the {ctx.world_size} workers of role {ctx.role!r}"
        )
    return size


def _join_process_group(ctx: EngineContext) -> torch.device:
    if not torch.cuda.is_available():
        raise EngineUsageError(
            "strategy=megatron needs CUDA: megatron-core's forward runs on GPUs only "
            "(trainer.device=cuda); use strategy=fsdp2 or deepspeed on CPU"
        )
    if not dist.is_initialized():
        if ctx.world_size != 1:
            raise EngineUsageError(
                f"torch.distributed is not initialised but world_size={ctx.world_size}; the "
                f"worker must call torch.distributed.init_process_group before building the engine"
            )
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    if dist.get_world_size() != ctx.world_size or dist.get_rank() != ctx.rank:
        raise EngineUsageError(
            f"EngineContext says rank {ctx.rank} of {ctx.world_size} but the default process "
            f"group is rank {dist.get_rank()} of {dist.get_world_size()}"
        )
    return torch.device("cuda", torch.cuda.current_device())


class MegatronEngine(TrainingEngine):
    """megatron-core engine for ``actor`` (trainable) and ``ref`` (frozen) roles."""

    def __init__(self, ctx: EngineContext) -> None:
        super().__init__(ctx)
        from megatron.core import parallel_state

        self.settings = resolve_settings(
            ctx.model, ctx.engine, ctx.total_training_steps, ctx.role, world_size=None
        )
        self.tp = _tensor_parallel_size(ctx)
        self.device = _join_process_group(ctx)
        init_model_parallel(self.tp, 1, ctx.seed)
        seed_everything(ctx.seed)
        self.tp_group = parallel_state.get_tensor_model_parallel_group()
        self.tp_rank = parallel_state.get_tensor_model_parallel_rank()
        self.dp_group = parallel_state.get_data_parallel_group()
        self.dp_size = parallel_state.get_data_parallel_world_size()
        self.mesh = DataParallelRank(
            dp_rank=parallel_state.get_data_parallel_rank(),
            dp_size=self.dp_size,
            returns_output=self.tp_rank == 0,
        )

        self.hf_config = load_hf_config(ctx.model_path, self.settings)
        self.shape = GPTShape.from_hf_config(self.hf_config, self.tp)
        self.model = build_gpt_model(
            self.shape, self.hf_config, gradient_checkpointing=self.settings.gradient_checkpointing
        )
        load_hf_weights(
            self.model,
            ctx.model_path,
            self.shape,
            self.tp_rank,
            self.settings.trust_remote_code,
        )
        self.compute_dtype = torch_dtype(self.settings.dtype)
        self.trainable = bool(ctx.trainable) and ctx.role != "ref"
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
        else:
            self.model.requires_grad_(False)
        self.model.train(self.trainable)
        self.global_step = 0
        self.metric_prefix = "critic" if ctx.role == "critic" else "actor"

    def data_parallel_rank(self) -> DataParallelRank:
        """TP peers (consecutive ranks in megatron's default order) form one data-parallel rank;
        the first of them returns the output."""
        return self.mesh

    # ---- forward ------------------------------------------------------------------------------
    def _micro_batches(self, batch: Batch, training: bool) -> list[list[int]]:
        """Row groups, the same on every TP peer (they hold the same rows). Data-parallel ranks
        may run different numbers: gradients are reduced once, after the last one."""
        s = self.settings
        if s.use_dynamic_bsz:
            budget = s.max_token_len if training else s.log_prob_max_token_len
            key = "ppo_max_token_len_per_gpu" if training else "log_prob_max_token_len_per_gpu"
            lengths = row_lengths(batch["attention_mask"], batch["responses"].shape[1])
            return token_budget_partition(lengths, budget, f"actor_rollout_ref.actor.{key}")
        size = s.micro_batch_size if training else s.log_prob_micro_batch_size
        return fixed_partition(len(batch), size)

    def _forward(
        self, batch: Batch, temperature: float, entropy: EntropyMode
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (and entropy) ``[b, R]`` of the response tokens; zero on padding."""
        responses = batch["responses"].to(self.device)
        width = responses.shape[1]
        attention_mask = batch["attention_mask"].to(self.device)
        position_ids = batch.get("position_ids")
        trimmed = trim_columns(
            batch["input_ids"].to(self.device),
            attention_mask,
            None if position_ids is None else position_ids.to(self.device),
            responses,
        )
        kept = trimmed.kept_response

        def response_logits(
            hidden_states: torch.Tensor, output_layer: Any, output_weight: Any, **_: Any
        ) -> torch.Tensor:
            """Logits only where a response token is predicted: ``[b, kept, V/tp]``."""
            logits, _ = output_layer(hidden_states[-(kept + 1) : -1], weight=output_weight)
            return logits.transpose(0, 1)

        with torch.autocast(
            "cuda", dtype=self.compute_dtype, enabled=self.compute_dtype != torch.float32
        ):
            logits = self.model(
                trimmed.input_ids,
                trimmed.position_ids,
                _attention_mask(trimmed.attention_mask),
                output_processor=response_logits,
            )
        log_prob, ent = vocab_parallel_logprob_entropy(
            logits,
            trimmed.labels,
            vocab_size=self.shape.vocab_size,
            temperature=temperature,
            entropy=entropy,
            group=self.tp_group,
        )
        del logits
        valid = attention_mask[:, -width:][:, :kept].to(log_prob.dtype)
        pad = (0, width - kept)
        log_prob = F.pad(log_prob * valid, pad)
        if ent is not None:
            ent = F.pad(ent * valid, pad)
        return log_prob, ent

    # ---- TrainingEngine -----------------------------------------------------------------------
    def compute_log_prob(
        self, batch: Batch, *, temperature: float = 1.0, calculate_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        rows, width = batch["responses"].shape
        log_probs = torch.zeros((rows, width), dtype=torch.float32)
        entropies = torch.zeros((rows, width), dtype=torch.float32) if calculate_entropy else None
        mode = EntropyMode.DETACHED if calculate_entropy else EntropyMode.NONE
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                for group in self._micro_batches(batch, training=False):
                    index = torch.tensor(group, dtype=torch.long)
                    micro = batch.select_keys(MODEL_KEYS).select_rows(index)
                    log_prob, ent = self._forward(micro, temperature, mode)
                    log_probs[index] = log_prob.float().cpu()
                    if entropies is not None and ent is not None:
                        entropies[index] = ent.float().cpu()
        finally:
            self.model.train(was_training)
        return log_probs, entropies

    def train_step(
        self, mini_batch: Batch, loss_fn: MicroBatchLossFn, *, temperature: float = 1.0
    ) -> dict[str, float]:
        """One optimizer step. Each micro-batch reaches ``loss_fn`` on the GPU with ``meta`` keys
        ``mini_batch_rows``, ``mini_batch_response_tokens`` (this data-parallel rank's) and
        ``num_micro_batches``."""
        if self.optimizer is None or self.scheduler is None:
            raise EngineUsageError(
                f"train_step called on a non-trainable engine (role {self.ctx.role!r}); "
                f"only the actor role trains"
            )
        groups = self._micro_batches(mini_batch, training=True)
        entropy_mode = (
            EntropyMode.GRAD if self.settings.entropy_coeff != 0 else EntropyMode.DETACHED
        )
        meta = {
            "mini_batch_rows": len(mini_batch),
            "mini_batch_response_tokens": float(_response_mask(mini_batch).sum()),
            "num_micro_batches": len(groups),
        }
        self.model.train()
        sums: dict[str, float] = defaultdict(float)
        counts: dict[str, int] = defaultdict(int)
        entropy_sum, entropy_tokens = 0.0, 0.0
        for group in groups:
            micro = mini_batch.select_rows(torch.tensor(group, dtype=torch.long)).to(self.device)
            micro.meta.update(meta)
            log_prob, ent = self._forward(micro, temperature, entropy_mode)
            passed = ent if entropy_mode == EntropyMode.GRAD else None
            loss, metrics = loss_fn(micro, log_prob, passed)
            loss.backward()
            for key, value in metrics.items():
                sums[key] += float(value)
                counts[key] += 1
            if ent is not None:
                mask = _response_mask(micro).to(ent.dtype)
                entropy_sum += float((ent.detach() * mask).sum())
                entropy_tokens += float(mask.sum())
        grad_norm, lr = self._optimizer_step()
        result = {key: sums[key] / counts[key] for key in sums}
        p = self.metric_prefix
        if f"{p}/entropy" not in result and entropy_tokens > 0:
            result[f"{p}/entropy"] = entropy_sum / entropy_tokens
        result[f"{p}/grad_norm"] = grad_norm
        result[f"{p}/lr"] = lr
        if not math.isfinite(grad_norm):
            result[f"{p}/skipped_step"] = 1.0
        return result

    def _optimizer_step(self) -> tuple[float, float]:
        """Average gradients over the data-parallel group, clip by the global norm (TP shards
        summed over the TP group, replicated weights counted once), step unless the norm is not
        finite, advance the schedule; return the pre-clip norm and the lr this step used."""
        assert self.optimizer is not None and self.scheduler is not None
        named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        params = [p for _, p in named]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        if self.dp_size > 1:
            handles = [dist.all_reduce(g, group=self.dp_group, async_op=True) for g in grads]
            for handle in handles:
                handle.wait()
            for grad in grads:
                grad.div_(self.dp_size)
        sharded = torch.zeros((), device=self.device)
        replicated = torch.zeros((), device=self.device)
        for (name, _), grad in zip(named, grads):
            square = grad.float().pow(2).sum()
            if split_dim(name) is not None:
                sharded += square
            else:
                replicated += square
        if self.tp > 1:
            dist.all_reduce(sharded, group=self.tp_group)
        grad_norm = float((sharded + replicated).sqrt())
        clip = self.settings.optim.clip_grad
        lr = float(self.optimizer.param_groups[0]["lr"])
        skipped = not math.isfinite(grad_norm)
        if not skipped:
            if clip > 0 and grad_norm > clip:
                for grad in grads:
                    grad.mul_(clip / (grad_norm + 1e-6))
            for param, grad in zip(params, grads):
                param.grad = grad
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        with warnings.catch_warnings():
            if skipped:  # torch warns when the schedule moves before any optimizer.step()
                warnings.simplefilter("ignore", UserWarning)
            self.scheduler.step()
        self.global_step += 1
        return grad_norm, lr

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full float32 tensors under their HF names: each tensor-parallel weight is gathered
        over the TP group (collective) and converted back to the HF layout, one at a time."""
        for name, param in self.model.named_parameters():
            shards = [param.detach()]
            if self.tp > 1 and split_dim(name) is not None:
                shards = [torch.empty_like(param) for _ in range(self.tp)]
                dist.all_gather(shards, param.detach().contiguous(), group=self.tp_group)
            yield from megatron_to_hf(name, shards, self.shape)

    def save_checkpoint(self, path: str) -> None:
        extra = {
            "global_step": self.global_step,
            "scheduler": None if self.scheduler is None else self.scheduler.state_dict(),
            "rng": rng_state(self.device),
            "layout": self._layout(),
        }
        mckpt.save(
            path,
            self.model,
            self.optimizer,
            extra,
            tp_rank=self.tp_rank,
            writes_shard=self.mesh.dp_rank == 0,
        )

    def load_checkpoint(self, path: str) -> None:
        extra = mckpt.load(
            path,
            self.model,
            self.optimizer,
            tp_rank=self.tp_rank,
            layout=self._layout(),
        )
        self.global_step = int(extra["global_step"])
        if self.scheduler is not None and extra.get("scheduler") is not None:
            self.scheduler.load_state_dict(extra["scheduler"])
        set_rng_state(extra["rng"], self.device)
        dist.barrier()

    def _layout(self) -> dict[str, int]:
        return {"tensor_model_parallel_size": self.tp, "pipeline_model_parallel_size": 1}

    def export_hf(self, path: str) -> None:
        rank0 = dist.get_rank() == 0
        # every rank walks the stream (its gathers are collective); rank 0 keeps the tensors
        state = {name: tensor.cpu() for name, tensor in self.named_weights() if rank0}
        if rank0:
            write_hf_folder(
                path,
                state,
                self.hf_config,
                self.compute_dtype,
                self.settings.tokenizer_path or self.ctx.model_path,
                self.settings.trust_remote_code,
            )
        del state
        dist.barrier()


def _attention_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """megatron-core's boolean mask ``[b, 1, s, s]``, True where a query may NOT attend: future
    positions and padding keys."""
    width = attention_mask.shape[1]
    causal = torch.ones((width, width), dtype=torch.bool, device=attention_mask.device).tril()
    allowed = causal.unsqueeze(0) & attention_mask.bool().unsqueeze(1)
    return ~allowed.unsqueeze(1)


def _response_mask(batch: Batch) -> torch.Tensor:
    if "response_mask" in batch:
        return batch["response_mask"]
    return batch["attention_mask"][:, -batch["responses"].shape[1] :]
