"""The Megatron training engine: one rank of a megatron-core GPTModel split by tensor, pipeline
and context parallelism (with interleaved pipeline parallelism, several model chunks per rank).

Read ``polyrl.interfaces.training_engine`` for the contract. Workers are grouped by megatron-core
(tensor-parallel peers consecutive, then context-parallel peers, then data-parallel replicas,
then pipeline stages): the TP x PP x CP ranks holding one copy of the model are one
data-parallel rank; every member gets the same rows (context-parallel peers each run their share
of every sequence's tokens, :mod:`.context_parallel`) and the first tensor- and context-parallel
rank of the last stage, where the log-probs are, returns the output. What the engine shares with the
FSDP engine: the keys it reads, the micro-batches (by count or token budget), float32 master
weights with bf16 compute, torch's AdamW with polyrl's LR schedule and grad-norm clipping, a step
with a non-finite grad norm skipped, and the Hugging Face export. What is its own: the weights
live in megatron-core's layout (:mod:`.convert`), the micro-batches run through megatron-core's
schedule (:mod:`.pipeline`), each as one packed row or as padded rows, scored at the response
positions only, without gathering the vocabulary (:mod:`.scoring`), and gradients are averaged
over the data-parallel group after the last micro-batch (TP shards need no reduction: a
replicated weight's gradient is already the same on every TP rank; a tied embedding split over
the first and last stage sums its two gradients).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

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
)
from polyrl_engine_kit.checkpoint import export_on_rank0, loop_state, restore_loop_state
from polyrl_engine_kit.config import resolve_settings
from polyrl_engine_kit.errors import EngineUsageError
from polyrl_engine_kit.logprob import EntropyMode
from polyrl_engine_kit.microbatch import plan_micro_batches
from polyrl_engine_kit.modeling import load_hf_config, torch_dtype
from polyrl_engine_kit.runtime import join_default_group, seed_everything
from polyrl_engine_kit.schedule import advance_schedule, build_adamw, build_scheduler
from polyrl_engine_kit.scoring import MODEL_KEYS
from polyrl_engine_kit.training import (
    EntropyMean,
    StepPeakMemory,
    entropy_mode,
    mean_metrics,
    micro_batches_on,
    policy_loss,
    report_step,
    require_trainable,
)
from polyrl_engine_megatron import checkpoint as mckpt
from polyrl_engine_megatron.checks import (
    dist_checkpoint_problems,
    dtype_problem,
    lora_problems,
    optimizer_override_lines,
    parallel_problems,
    router_replay_problems,
    virtual_size,
)
from polyrl_engine_megatron.context_parallel import ContextParallel
from polyrl_engine_megatron.convert import (
    GPTShape,
    PipelineStage,
    StageSplit,
    is_tied_copy,
    megatron_to_hf,
    split_dim,
    virtual_stages,
)
from polyrl_engine_megatron.cpu_optimizer import CpuOffloadSettings, HostStep
from polyrl_engine_megatron.dist_checkpoint import load_dist_checkpoint
from polyrl_engine_megatron.gradients import GradientGroups, average_gradients, global_norm
from polyrl_engine_megatron.lora import LoraSpec, add_adapters, merge_adapters
from polyrl_engine_megatron.model import build_gpt_model, init_model_parallel, load_hf_weights
from polyrl_engine_megatron.moe import (
    gathered_experts,
    global_expert_name,
    is_expert,
    stack_experts,
)
from polyrl_engine_megatron.offload import HostOffload, OffloadSettings
from polyrl_engine_megatron.pipeline import StageWeights, at_least, run_schedule
from polyrl_engine_megatron.router_replay import RouterReplayR2
from polyrl_engine_megatron.scoring import Scorer, ScoringPaths
from polyrl_engine_megatron.sequence_parallel import has_partial_gradient, sum_partial_gradients
from polyrl_engine_megatron.transformer_overrides import (
    Recompute,
    recompute_plan,
    split,
    uneven_stage_problems,
)

log = logging.getLogger(__name__)

# What a loss function run on a micro-batch's scores returns: the loss and what to record
ScoredLoss = Callable[[Batch, torch.Tensor, torch.Tensor | None], tuple[torch.Tensor, Any]]
# A micro-batch through the model: the stage's output, and its scores back to [b, R]
ScoreForward = Callable[[Any, Batch], tuple[torch.Tensor, Callable]]


@dataclass
class ModelChunk:
    """One of this rank's model chunks: ``stage`` (its layers, whether it holds the embedding
    or the output layer), its place ``index`` in the model's chunks, and its GPTModel."""

    index: int
    stage: PipelineStage
    module: Any


def value_head(shape: GPTShape, hf_config: Any, seed: int, device: torch.device) -> torch.nn.Linear:
    """A critic's head on the last stage: hidden state -> one value, float32, the same on every
    tensor-parallel rank (each holds the whole hidden state); initialised as transformers
    initialises a token-classification head (normal weights at the config's
    ``initializer_range``, zero bias), seeded by ``seed``."""
    head = torch.nn.Linear(shape.hidden_size, 1)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        std = float(getattr(hf_config, "initializer_range", 0.02))
        head.weight.normal_(0.0, std, generator=generator)
        head.bias.zero_()
    return head.to(device)


def _megatron_node(ctx: EngineContext) -> Any:
    """The role's ``megatron`` node (``actor_rollout_ref.actor.megatron``'s layout), with the
    schema's defaults for the keys it leaves out."""
    node = schema_node({"megatron": ctx.engine.get("megatron") or {}}, "actor_rollout_ref.actor")
    return node.megatron


def _parallel_sizes(ctx: EngineContext) -> tuple[int, int, int | None, int]:
    """``actor_rollout_ref.actor.megatron.{tensor,pipeline,virtual_pipeline,expert}_model_
    parallel_size`` of the role's node (virtual None without interleaving), after the same
    checks as ``polyrl validate``."""
    megatron = _megatron_node(ctx)
    problems = parallel_problems(megatron) + dist_checkpoint_problems(megatron, "megatron")
    dtype = dtype_problem(schema_node(ctx.model, "actor_rollout_ref.model"))
    problems += [dtype] if dtype else []
    if problems:
        raise ConfigError("; ".join(problems))
    tp = int(megatron.tensor_model_parallel_size)
    pp = int(megatron.pipeline_model_parallel_size)
    cp = int(megatron.context_parallel_size)
    if ctx.world_size % (tp * pp * cp):
        raise ConfigError(
            f"actor_rollout_ref.actor.megatron tensor x pipeline x context parallel size {tp} x "
            f"{pp} x {cp} does not divide the {ctx.world_size} workers of role {ctx.role!r}"
        )
    return tp, pp, virtual_size(megatron), int(megatron.expert_model_parallel_size)


def _transformer_overrides(
    ctx: EngineContext, gradient_checkpointing: bool
) -> tuple[dict[str, Any], Recompute]:
    """The role's ``megatron.override_transformer_config``: the keys passed to
    ``TransformerConfig`` and the recompute to apply, after the same checks as ``polyrl
    validate``; what has no effect is logged once, by rank 0."""
    megatron = _megatron_node(ctx)
    given = OmegaConf.to_container(megatron.override_transformer_config, resolve=True)
    passed, problems, notices = split(given)
    problems += uneven_stage_problems(given, megatron.pipeline_model_parallel_size)
    if problems:
        raise ConfigError("; ".join(problems))
    for line in notices if ctx.rank == 0 else ():
        log.warning("%s", line)
    recompute, _ = recompute_plan(given, gradient_checkpointing=gradient_checkpointing)
    return passed, recompute


def _lora(ctx: EngineContext) -> LoraSpec | None:
    """verl's ``actor_rollout_ref.model.lora`` for the actor being trained (the reference and a
    critic run the base model), after the same checks as ``polyrl validate``; None with LoRA
    off."""
    if not ctx.trainable or ctx.role == "ref" or ModelHead(ctx.head) is not ModelHead.CAUSAL_LM:
        return None
    node = schema_node(ctx.model, "actor_rollout_ref.model").lora
    problems = lora_problems(node)
    if problems:
        raise ConfigError("; ".join(problems))
    return LoraSpec.from_node(node)


def _router_replay(ctx: EngineContext, shape: GPTShape, recompute: Recompute) -> bool:
    """Whether this engine replays MoE routing (verl's ``actor.router_replay.mode=R2``, for
    the actor being trained), after the same checks as ``polyrl validate``."""
    given = ctx.engine.get("router_replay") or {}
    replay = schema_node({"router_replay": given}, "actor_rollout_ref.actor").router_replay
    problems = router_replay_problems(replay)
    if problems:
        raise ConfigError("; ".join(problems))
    if replay.mode != "R2" or not ctx.trainable or ctx.role == "ref":
        return False
    node = "actor_rollout_ref.actor"
    if not shape.moe:
        raise ConfigError(
            f"{node}.router_replay.mode=R2 replays a mixture-of-experts model's routing; this "
            f"model has no experts: set mode=disabled"
        )
    if int(_megatron_node(ctx).context_parallel_size) > 1:
        raise ConfigError(
            f"{node}.router_replay.mode=R2 with megatron.context_parallel_size > 1 asks for "
            f"router replay over context-parallel ranks (verl); polyrl does not support it: use "
            f"context_parallel_size=1"
        )
    pipeline = int(_megatron_node(ctx).pipeline_model_parallel_size)
    if pipeline > 1 and (recompute.full or recompute.modules):
        raise ConfigError(
            f"{node}.router_replay.mode=R2 with recomputed activations over {pipeline} "
            f"pipeline stages asks for replaying each micro-batch's routing in a backward that "
            f"runs after later forwards; polyrl does not support it: turn gradient "
            f"checkpointing / recompute off, or use pipeline_model_parallel_size=1"
        )
    return True


def _cpu_offload(ctx: EngineContext) -> CpuOffloadSettings:
    """The role's ``optim.override_optimizer_config`` (verl's Megatron optimizer overrides; the
    critic's optim has none: its defaults), after the same checks as ``polyrl validate``; what
    has no effect is logged once, by rank 0."""
    given = (ctx.engine.get("optim") or {}).get("override_optimizer_config") or {}
    node = schema_node({"optim": {"override_optimizer_config": given}}, "actor_rollout_ref.actor")
    overrides = node.optim.override_optimizer_config
    problems, notices = optimizer_override_lines(overrides)
    if problems:
        raise ConfigError("; ".join(problems))
    for line in notices if ctx.rank == 0 else ():
        log.warning("%s", line)
    return CpuOffloadSettings.from_node(overrides)


def _join_process_group(ctx: EngineContext) -> torch.device:
    if not torch.cuda.is_available():
        raise EngineUsageError(
            "strategy=megatron needs CUDA: megatron-core's forward runs on GPUs only "
            "(trainer.device=cuda); use strategy=fsdp2 or deepspeed on CPU"
        )
    join_default_group(ctx, "nccl")
    return torch.device("cuda", torch.cuda.current_device())


class MegatronEngine(TrainingEngine):
    """megatron-core engine for ``actor`` (trainable) and ``ref`` (frozen) roles, and for value
    models (a critic, ``EngineContext.head=ModelHead.VALUE``: a one-value head on the last
    stage's hidden states)."""

    def __init__(self, ctx: EngineContext) -> None:
        super().__init__(ctx)
        from megatron.core import parallel_state

        self.settings = resolve_settings(
            ctx.model, ctx.engine, ctx.total_training_steps, ctx.role, world_size=None
        )
        self.tp, self.pp, self.vpp, self.ep = _parallel_sizes(ctx)
        self.cp = int(_megatron_node(ctx).context_parallel_size)
        self.device = _join_process_group(ctx)
        init_model_parallel(self.tp, self.pp, ctx.seed, self.vpp, self.ep, self.cp)
        seed_everything(ctx.seed)
        self.tp_group = parallel_state.get_tensor_model_parallel_group()
        self.tp_rank = parallel_state.get_tensor_model_parallel_rank()
        self.pp_group = parallel_state.get_pipeline_model_parallel_group()
        self.pp_rank = parallel_state.get_pipeline_model_parallel_rank()
        self.dp_size = parallel_state.get_data_parallel_world_size()
        self.ep_rank = parallel_state.get_expert_model_parallel_rank()
        self.ep_group = parallel_state.get_expert_model_parallel_group() if self.ep > 1 else None
        self.grad_groups = GradientGroups.from_parallel_state()
        self.cp_rank = parallel_state.get_context_parallel_rank()
        # a stage's ranks in megatron-core's order: CP peers, then data-parallel replicas
        self.dp_cp_rank = parallel_state.get_data_parallel_rank(with_context_parallel=True)
        self.context = (
            ContextParallel(
                parallel_state.get_context_parallel_group(), self.cp, self.cp_rank, self.device
            )
            if self.cp > 1
            else None
        )

        self.hf_config = load_hf_config(ctx.model_path, self.settings)
        self.shape = GPTShape.from_hf_config(self.hf_config, self.tp)
        experts = self.shape.moe.num_experts if self.shape.moe else 0
        if self.ep > 1 and (not experts or experts % self.ep):
            raise ConfigError(
                f"actor_rollout_ref.actor.megatron.expert_model_parallel_size={self.ep} spreads "
                f"a mixture-of-experts model's experts evenly over ranks; this "
                f"{self.hf_config.model_type} model has {experts or 'no'} experts: use a divisor "
                f"of the expert count, or 1"
            )
        overrides, recompute = _transformer_overrides(ctx, self.settings.gradient_checkpointing)
        replays = _router_replay(ctx, self.shape, recompute)
        if replays:  # megatron-core's routers record or take their top-k indices
            overrides = {**overrides, "moe_enable_routing_replay": True}
        self.lora = _lora(ctx)
        self.split = StageSplit.from_overrides(overrides)
        stages = virtual_stages(self.shape.num_layers, self.pp, self.vpp, self.split)
        # this rank's model chunks: its stage, or chunk v of it at [v * pp + pp_rank] (VPP)
        self.chunks = [
            ModelChunk(index, stages[index], None)
            for index in range(self.pp_rank, len(stages), self.pp)
        ]
        for number, chunk in enumerate(self.chunks):
            chunk.module = build_gpt_model(
                self.shape,
                self.hf_config,
                chunk.stage,
                pipeline_parallel=self.pp,
                recompute=recompute,
                overrides=overrides,
                device=self.device,
                virtual=self.vpp,
                chunk=number if self.vpp else None,
                expert_parallel=self.ep,
            )
            self._load_weights(ctx, chunk)
        if self.lora is not None:  # on the loaded weights, which they freeze
            self._add_adapters(self.lora, ctx.seed)
        self.is_last_stage = self.chunks[-1].stage.is_last
        self.mesh = DataParallelRank(
            dp_rank=parallel_state.get_data_parallel_rank(),
            dp_size=self.dp_size,
            returns_output=self.tp_rank == 0 and self.cp_rank == 0 and self.is_last_stage,
        )
        # one module holding this rank's parameters (offload, optimizer, checkpoint); with
        # several chunks their state_dict keys carry the chunk's number
        modules = [chunk.module for chunk in self.chunks]
        self.model = modules[0] if len(modules) == 1 else torch.nn.ModuleList(modules)
        self.head = ModelHead(ctx.head)
        self.value_head: torch.nn.Module | None = None
        if self.head is ModelHead.VALUE and self.is_last_stage:
            last = self.chunks[-1].module
            self.value_head = value_head(self.shape, self.hf_config, ctx.seed, self.device)
            last.add_module("value_head", self.value_head)
            if not (self.shape.tied and self.pp > 1):  # a tied copy still sums the embedding's
                last.output_layer.requires_grad_(False)  # the LM head: unused by a critic
        self.stage_weights = StageWeights(
            [(chunk.index, chunk.module) for chunk in self.chunks],
            stages,
            self.pp_group,
            self.device,
        )
        self.compute_dtype = torch_dtype(self.settings.dtype)
        paths = ScoringPaths.choose(
            remove_padding=self.settings.remove_padding,
            fused_log_prob=self.settings.fused_log_prob,
            torch_compile=self.settings.torch_compile,
            tp=self.tp,
        )
        log.info("megatron engine scoring paths: %s", paths)
        self.scorer = Scorer(
            self.shape, paths, self.compute_dtype, self.tp_group, self.device, self.context
        )
        self.trainable = bool(ctx.trainable) and ctx.role != "ref"
        self.router_replay = (
            RouterReplayR2(
                self._modules(),
                packed=self.settings.remove_padding,
                tp_group=self.tp_group,
                tp=self.tp,
                device=self.device,
            )
            if replays
            else None
        )
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: torch.optim.lr_scheduler.LambdaLR | None = None
        cpu_offload = _cpu_offload(ctx) if self.trainable else CpuOffloadSettings()
        trained = [p for p in self.model.parameters() if p.requires_grad]  # LoRA: the adapters
        self.host_step = HostStep(trained, cpu_offload)
        if self.trainable:
            self.optimizer = build_adamw(self.host_step.stepped, self.settings.optim)
            self.scheduler = build_scheduler(self.optimizer, self.settings.optim)
        else:
            self.model.requires_grad_(False)
        self.model.train(self.trainable)
        self.global_step = 0
        self.metric_prefix = "critic" if self.head is ModelHead.VALUE else "actor"
        self.offload = HostOffload(
            self.model,
            lambda: self.optimizer,
            self.device,
            OffloadSettings.from_node(_megatron_node(ctx)),
        )
        self.offload.start()

    def _add_adapters(self, lora: LoraSpec, seed: int) -> None:
        """LoRA adapters on every chunk's targeted linears; one line if the targets select
        none on any stage (collective over the pipeline group)."""
        count = sum(
            add_adapters(
                chunk.module,
                lora,
                seed=seed,
                global_name=lambda name, stage=chunk.stage: self._global(stage, name),
            )
            for chunk in self.chunks
        )
        total = torch.tensor(count, device=self.device)
        dist.all_reduce(total, group=self.pp_group)
        if not int(total):
            raise ConfigError(
                f"actor_rollout_ref.model.lora.target_modules={list(lora.targets)} selects none "
                f"of the model's linears; use linear_qkv, linear_proj, linear_fc1, linear_fc2 or "
                f"a pattern over their full names such as '*.layers.0.*.linear_qkv'"
            )

    def _global(self, stage: PipelineStage, name: str) -> str:
        """The whole model's name of this rank's module or weight ``name`` of ``stage``: its
        layer numbers, and with expert parallelism its experts' numbers."""
        name = stage.global_name(name)
        if self.ep > 1 and self.shape.moe:
            name = global_expert_name(name, self.ep_rank, self.shape.moe.num_experts // self.ep)
        return name

    def _load_weights(self, ctx: EngineContext, chunk: ModelChunk) -> None:
        """A chunk's initial weights: from the HF folder, or verl's megatron dist checkpoint."""
        megatron = _megatron_node(ctx)
        if megatron.use_dist_checkpointing:
            load_dist_checkpoint(
                chunk.module, megatron.dist_checkpointing_path, megatron.dist_checkpointing_prefix
            )
            return
        load_hf_weights(
            chunk.module,
            ctx.model_path,
            self.shape,
            chunk.stage,
            self.tp_rank,
            self.settings.trust_remote_code,
            expert_rank=self.ep_rank,
            expert_parallel=self.ep,
        )

    def data_parallel_rank(self) -> DataParallelRank:
        """The TP x PP x CP ranks of one model copy form one data-parallel rank; the first TP and
        CP rank of the last stage returns the output."""
        return self.mesh

    # ---- forward ------------------------------------------------------------------------------
    def _micro_batches(self, batch: Batch, training: bool) -> list[list[int]]:
        """Row groups, the same on every TP and PP peer (they hold the same rows). Data-parallel
        ranks may run different numbers (gradients are reduced once, after the last one),
        except those of an expert-parallel group, whose MoE layers exchange tokens in every
        forward and backward: they all run as many as the one that plans most."""
        groups = plan_micro_batches(
            batch,
            self.settings,
            training,
            sequence_parallel=self.cp,
            split_by="megatron.context_parallel_size",
        )
        wanted, why = 1, ""
        if self.vpp is not None:  # the interleaved schedule needs one per stage
            wanted = self.pp
            why = f"interleaved pipeline parallelism runs at least {self.pp}, one per stage"
        if self.ep > 1:
            count = torch.tensor(max(len(groups), wanted), device=self.device)
            dist.all_reduce(count, op=dist.ReduceOp.MAX, group=self.ep_group)
            if int(count) > wanted:
                wanted = int(count)
                why = f"its expert-parallel peers run {wanted} (their MoE layers exchange tokens)"
        groups = at_least(groups, wanted)
        if len(groups) < wanted:
            raise EngineUsageError(
                f"this data-parallel rank got {len(batch)} rows for {wanted} micro-batches: "
                f"{why}; give every data-parallel rank at least {wanted} rows"
            )
        return groups

    def _scores(self, temperature: float, entropy: EntropyMode) -> ScoreForward:
        """The forward that scores a micro-batch with this engine's head: log-probs (and
        entropy) of a causal LM, or a value model's values."""
        if self.head is ModelHead.VALUE:  # the head is on the last stage (None elsewhere)
            return lambda model, micro: self.scorer.forward_values(model, micro, self.value_head)
        return lambda model, micro: self.scorer.forward(
            model, micro, temperature=temperature, entropy=entropy
        )

    def _forward_step(
        self, scores: ScoreForward, scored_loss: ScoredLoss
    ) -> Callable[[Iterator[Batch], Any], tuple[torch.Tensor, Callable]]:
        """megatron-core's ``forward_step_func``: the next micro-batch through this stage, and
        the loss function the last stage runs on its ``scores`` (``[b, R]``, zero on padding,
        then ``scored_loss``)."""

        last = {id(chunk.module): chunk.stage.is_last for chunk in self.chunks}

        def step(micros: Iterator[Batch], model: Any) -> tuple[torch.Tensor, Callable]:
            micro = next(micros)
            with (
                torch.autocast(
                    "cuda", dtype=self.compute_dtype, enabled=self.compute_dtype != torch.float32
                ),
                self._routing(model, micro),
            ):
                output, to_response = scores(model, micro)

            def loss(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Any]:
                log_prob, ent = to_response(scores)
                value, record = scored_loss(micro, log_prob, ent)
                response_width = micro["responses"].shape[1]
                real = micro["attention_mask"][:, -response_width:]
                tokens = real.sum().to(device=self.device, dtype=torch.int)
                return value, tokens, record

            # the activation sent to the next stage in pipeline_dtype (float32)
            return (output if last[id(model)] else output.float()), loss

        return step

    # ---- TrainingEngine -----------------------------------------------------------------------
    def compute_log_prob(
        self, batch: Batch, *, temperature: float = 1.0, calculate_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (and entropy) of the response tokens; filled on the last stage (the rank
        that returns the output), zeros on the others."""
        self._require_head(ModelHead.CAUSAL_LM, "compute_log_prob")
        mode = EntropyMode.DETACHED if calculate_entropy else EntropyMode.NONE
        replay = self.router_replay
        with nullcontext() if replay is None else replay.recording_pass():  # R2's old log-probs
            return self._no_grad_scores(batch, self._scores(temperature, mode), calculate_entropy)

    def _routing(self, model: Any, micro: Batch) -> AbstractContextManager:
        """Around a micro-batch's forward: router replay's recording or replaying."""
        replay = self.router_replay
        return nullcontext() if replay is None else replay.forward(model, micro)

    def compute_values(self, batch: Batch) -> torch.Tensor:
        """Values of the response tokens (a critic); filled on the last stage, zeros on the
        others."""
        self._require_head(ModelHead.VALUE, "compute_values")
        return self._no_grad_scores(batch, self._scores(1.0, EntropyMode.NONE), False)[0]

    def _no_grad_scores(
        self, batch: Batch, scores: ScoreForward, with_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        rows, width = batch["responses"].shape
        values = torch.zeros((rows, width), dtype=torch.float32)
        entropies = torch.zeros((rows, width), dtype=torch.float32) if with_entropy else None
        groups = self._micro_batches(batch, training=False)
        micros = [
            batch.select_keys(MODEL_KEYS).select_rows(torch.tensor(group, dtype=torch.long))
            for group in groups
        ]
        zero = torch.zeros((), device=self.device)

        def keep_scores(micro: Batch, score: torch.Tensor, ent: torch.Tensor | None):
            return zero, (score.float().cpu(), None if ent is None else ent.float().cpu())

        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad(), self.offload.call():
                step = self._forward_step(scores, keep_scores)
                records = run_schedule(self._modules(), micros, step, forward_only=True)
        finally:
            self.model.train(was_training)
        for group, (score, ent) in zip(groups, records):
            index = torch.tensor(group, dtype=torch.long)
            values[index] = score
            if entropies is not None and ent is not None:
                entropies[index] = ent
        return values, entropies

    def _require_head(self, head: ModelHead, method: str) -> None:
        if self.head is not head:
            raise EngineUsageError(
                f"{method} needs a {head.value} engine; this one (role {self.ctx.role!r}) was "
                f"built with a {self.head.value} head"
            )

    def train_step(
        self, mini_batch: Batch, loss_fn: MicroBatchLossFn, *, temperature: float = 1.0
    ) -> dict[str, float]:
        """One optimizer step. Each micro-batch reaches ``loss_fn`` on the GPU with ``meta`` keys
        ``mini_batch_rows``, ``mini_batch_response_tokens`` (this data-parallel rank's) and
        ``num_micro_batches``; the loss metrics come from the last stage."""
        self._require_head(ModelHead.CAUSAL_LM, "train_step")
        mode = entropy_mode(loss_fn)
        entropy = EntropyMean()
        scored_loss = policy_loss(loss_fn, mode, entropy)
        replay = self.router_replay
        with nullcontext() if replay is None else replay.replaying_pass():  # R2
            return self._train(mini_batch, self._scores(temperature, mode), scored_loss, entropy)

    def train_value_step(
        self, mini_batch: Batch, loss_fn: MicroBatchValueLossFn
    ) -> dict[str, float]:
        """One optimizer step of the value model on ``loss_fn`` of its values, micro-batches
        as in :meth:`train_step`."""
        self._require_head(ModelHead.VALUE, "train_value_step")
        return self._train(
            mini_batch,
            self._scores(1.0, EntropyMode.NONE),
            lambda micro, values, _: loss_fn(micro, values),
        )

    def _train(
        self,
        mini_batch: Batch,
        scores: ScoreForward,
        scored_loss: ScoredLoss,
        entropy: EntropyMean | None = None,
    ) -> dict[str, float]:
        require_trainable(self.optimizer, self.scheduler, self.ctx.role)
        groups = self._micro_batches(mini_batch, training=True)
        micros = list(micro_batches_on(mini_batch, groups, self.device))
        self.model.train()
        peak = StepPeakMemory(self.device)
        step = self._forward_step(scores, scored_loss)
        with self.offload.call():
            result = mean_metrics(run_schedule(self._modules(), micros, step, forward_only=False))
            grad_norm, lr = self._optimizer_step()
        if entropy is not None:
            entropy.report(result, self.metric_prefix)
        peak.report(result, self.metric_prefix)
        return report_step(result, self.metric_prefix, grad_norm, lr, math.isfinite(grad_norm))

    def _optimizer_step(self) -> tuple[float, float]:
        """Average gradients over the data-parallel replicas (:mod:`.gradients`: experts over
        their expert-data-parallel copies), sum a tied embedding's two copies' gradients, clip
        by the global norm (the tied copy counted once), step unless the norm is not finite,
        advance the schedule; return the pre-clip norm and the lr this step used."""
        assert self.optimizer is not None and self.scheduler is not None
        named = [
            (chunk.stage, n, p)
            for chunk in self.chunks
            for n, p in chunk.module.named_parameters()
            if p.requires_grad
        ]
        params = [p for _, _, p in named]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        if self.tp > 1:  # weights each TP rank holds whole, seeing its tokens or heads only
            partial = [has_partial_gradient(n, p) for _, n, p in named]
            sum_partial_gradients(grads, partial, self.tp_group)
        average_gradients([n for _, n, _ in named], grads, self.grad_groups)
        ends = [c for c in self.chunks if c.stage.is_first or c.stage.is_last]
        if self.shape.tied and self.pp > 1 and ends:
            from megatron.core import parallel_state

            shared = ends[0].module.shared_embedding_or_output_weight()
            # frozen on both ends with LoRA: nothing to sum
            for tied in [g for p, g in zip(params, grads) if p is shared]:
                dist.all_reduce(tied, group=parallel_state.get_embedding_group())
        counted = [
            (name, grad)
            for (stage, name, _), grad in zip(named, grads)
            if not is_tied_copy(name, self.shape, stage)
        ]
        grad_norm = global_norm(
            [name for name, _ in counted],
            [grad for _, grad in counted],
            self.grad_groups,
            self.device,
        )
        clip = self.settings.optim.clip_grad
        lr = float(self.optimizer.param_groups[0]["lr"])
        skipped = not math.isfinite(grad_norm)
        if not skipped:
            if clip > 0 and grad_norm > clip:
                for grad in grads:
                    grad.mul_(clip / (grad_norm + 1e-6))
            for param, grad in zip(params, grads):
                param.grad = grad
            self.host_step.gradients_to_host()
            with self.offload.optimizer_step():
                self.optimizer.step()
            self.host_step.weights_from_host()
        self.optimizer.zero_grad(set_to_none=True)
        self.model.zero_grad(set_to_none=True)
        advance_schedule(self.scheduler, skipped)
        self.global_step += 1
        return grad_norm, lr

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full float32 tensors under their HF names, on every rank: each stage's weights are
        broadcast over the pipeline group, each tensor-parallel weight gathered over the TP
        group (collectives) and converted back to the HF layout, one at a time."""
        self._require_head(ModelHead.CAUSAL_LM, "named_weights (weight sync, HF export)")
        return self.offload.stream(self._weights())

    def _weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The HF weights; a MoE layer's experts joined into transformers' fused tensors."""
        weights = self._converted_weights()
        return stack_experts(weights, self.shape.moe.num_experts) if self.shape.moe else weights

    def _converted_weights(self) -> Iterator[tuple[str, torch.Tensor]]:

        # the first stage's embedding yields both HF names of a tied embedding
        def untied(stage: PipelineStage, name: str) -> bool:
            return not is_tied_copy(name, self.shape, stage)

        stream = self.stage_weights.stream(untied)
        if self.lora is not None:  # each rank's shard merged before any gather (:mod:`.lora`)
            lora = self.lora
            stream = merge_adapters(
                stream, lora.scale, lambda stage, module: lora.adapts(self._global(stage, module))
            )
        for stage, name, shard in stream:
            if self.ep > 1 and is_expert(name):  # each expert-parallel rank's own experts
                yield from self._expert_weights(stage, name, shard)
                continue
            shards = [shard]
            if self.tp > 1 and split_dim(name) is not None:
                shards = [torch.empty_like(shard) for _ in range(self.tp)]
                dist.all_gather(shards, shard, group=self.tp_group)
            yield from megatron_to_hf(stage.global_name(name), shards, self.shape)

    def _expert_weights(
        self, stage: PipelineStage, name: str, shard: torch.Tensor
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Local expert weight ``name`` of every expert-parallel rank (gathered over the group,
        collective), under the whole model's expert numbers."""
        assert self.shape.moe is not None
        per_rank = self.shape.moe.num_experts // self.ep
        for expert, tensor in gathered_experts(name, shard, self.ep_group, self.ep, per_rank):
            yield from megatron_to_hf(stage.global_name(expert), [tensor], self.shape)

    def save_checkpoint(self, path: str) -> None:
        extra = {
            **loop_state(self.global_step, self.scheduler, self.device),
            "layout": self._layout(),
        }
        with self.offload.call():
            mckpt.save(
                path,
                self.model,
                self.optimizer,
                extra,
                shard=self._shard(),
                # the first ranks of a stage, one per (TP rank, EP rank) pair: every TP shard
                # of the dense weights and every rank's experts written once
                writes_shard=self.tp_rank + self.tp * self.dp_cp_rank < math.lcm(self.tp, self.ep),
            )

    def load_checkpoint(self, path: str) -> None:
        with self.offload.call():  # the optimizer state lands on the parameters' device
            extra = mckpt.load(
                path,
                self.model,
                self.optimizer,
                shard=self._shard(),
                layout=self._layout(),
            )
        self.offload.park_optimizer()
        self.host_step.refresh()
        self.global_step = restore_loop_state(extra, self.scheduler, self.device)
        dist.barrier()

    def _modules(self) -> list[torch.nn.Module]:
        return [chunk.module for chunk in self.chunks]

    def _layout(self) -> dict[str, Any]:
        layout: dict[str, Any] = {
            "tensor_model_parallel_size": self.tp,
            "pipeline_model_parallel_size": self.pp,
        }
        if self.vpp is not None:  # each shard holds the rank's chunks, keys "<chunk>.<name>"
            layout[mckpt.VIRTUAL] = self.vpp
        if self.ep > 1:  # a shard per expert-parallel rank, each with its own experts
            layout[mckpt.EXPERT] = self.ep
        if self.lora is not None:  # the shards hold adapters: the reader merges them
            layout[mckpt.LORA_SCALE] = self.lora.scale
        if not self.split.even:  # uneven stages: what the reader needs to place the layers
            layout[mckpt.STAGE_LAYERS] = [s.num_layers for s in self.stage_weights.stages]
        return layout

    def _shard(self) -> str:
        return mckpt.shard_name(self.tp_rank, self.pp_rank, self.pp, self.ep_rank, self.ep)

    def export_hf(self, path: str) -> None:
        rank0 = dist.get_rank() == 0
        # every rank walks the stream (its gathers are collective); rank 0 keeps the tensors
        state = {name: tensor.cpu() for name, tensor in self.named_weights() if rank0}
        export_on_rank0(
            path, state, self.hf_config, self.compute_dtype, self.settings, self.ctx.model_path
        )
        del state
        dist.barrier()
