"""The single controller: sets up data, rewards, workers and loggers, then runs the steps.

The driver runs the algorithm as ordinary Python; the heavy work happens in Ray worker groups
that host the roles the step uses (:mod:`polyrl.workers.placement`). What a step does is the
selected algorithm's stage pipeline (:mod:`polyrl.step`): nothing here knows which algorithm
runs. How steps map onto pipeline runs (in order, or generating one step ahead) is the schedule
``trainer.async_mode`` selects (:mod:`polyrl.step.schedule`).
"""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from omegaconf import DictConfig

from polyrl.batch import Batch
from polyrl.checkpoint import (
    CheckpointManager,
    RunLock,
    capture_rng_state,
    check_resume_changes,
    load_driver_state,
    restore_rng_state,
    save_driver_state,
)
from polyrl.config import to_container
from polyrl.config.checks.placement import IN_PROCESS
from polyrl.data.training import TrainingData, ValidationResult
from polyrl.errors import ConfigError, PolyrlError
from polyrl.fsutil import DiskFullError, naming_full_disk
from polyrl.interfaces import LoggerContext, RewardContext, SamplingParams
from polyrl.loggers.multi import LoggerGroup
from polyrl.lora import describe_lora
from polyrl.plan import RunPlan, assemble
from polyrl.run_log import use_run_folder
from polyrl.specs import resolve_object
from polyrl.step.context import StepContext
from polyrl.step.multi_turn import EpisodeGenerateStage, episode_scores
from polyrl.step.schedule import make_schedule
from polyrl.step.stages import generate, score_responses
from polyrl.trainer.metrics import step_batch_metrics, timing_and_throughput
from polyrl.trainer.outputs import (
    EXPORT_DIR,
    check_export_target,
    clean_export_leftovers,
    export_is_current,
    install_export,
    move_earlier_reward_curve_aside,
)
from polyrl.trainer.recovery import Restart, cause_line, record_restart, worker_died
from polyrl.trainer.val_generations import generation_rows, pick_generations
from polyrl.workers.group import WorkerError
from polyrl.workers.nodes import require_cluster_to_join
from polyrl.workers.placement import start_role_workers
from polyrl.workers.worker_group import ensure_ray

if TYPE_CHECKING:
    from polyrl.data.dataset import RLDataset
    from polyrl.step import StepState


@dataclass
class TrainResult:
    """Where a finished run put its outputs."""

    steps: int
    output_dir: str
    checkpoint: str | None
    hf_model: str | None
    metrics_file: str
    plot: str | None
    val_before: dict[str, float]
    val_after: dict[str, float]


def world_size_of(cfg: DictConfig) -> int:
    return int(cfg.trainer.nnodes) * int(cfg.trainer.n_gpus_per_node)


def pad_rows_to_multiple(batch: Batch, multiple: int) -> Batch:
    """Repeat the last row so the batch splits evenly over ranks (validation sets of any size)."""
    missing = -len(batch) % multiple
    if not missing:
        return batch
    return Batch.concat([batch, batch.select_rows([len(batch) - 1] * missing)])


def prompt_data(cfg: DictConfig, tokenizer: Any) -> TrainingData:
    """verl-format prompts of ``data.train_files`` in batches of ``data.train_batch_size``,
    validated by generation on ``data.val_files`` (the data of every algorithm that brings none
    of its own, see ``AlgorithmSpec.data``). Rows whose ``data_source`` no scorer knows are
    counted as they load (:mod:`polyrl.data.unteachable`)."""
    from functools import partial

    from polyrl.data.dataset import RLDataset
    from polyrl.data.loader import PromptLoader
    from polyrl.data.training import training_data_from_files
    from polyrl.data.unteachable import scorer_check

    dataset = partial(RLDataset, has_scorer=scorer_check(cfg))
    return training_data_from_files(cfg, tokenizer, dataset, PromptLoader, validate_by_generation)


def validation_sampling_params(cfg: Any) -> SamplingParams:
    """``rollout.val_kwargs`` as verl's rollout reads them: greedy at temperature 0, sampled at
    a temperature above it; ``do_sample`` is not read."""
    val = cfg.actor_rollout_ref.rollout.val_kwargs
    return SamplingParams(
        n=int(val.n),
        temperature=float(val.temperature) or 1.0,
        top_p=float(val.top_p),
        top_k=int(val.top_k),
        max_new_tokens=int(cfg.data.max_response_length),
        greedy=float(val.temperature) == 0,
        seed=int(cfg.trainer.seed),
    )


def validate_by_generation(val_set: RLDataset, ctx: StepContext) -> ValidationResult:
    """Generation per ``rollout.val_kwargs`` (:func:`validation_sampling_params`) on the val
    set (multi-turn runs play their episodes, :attr:`StepContext.episodes`, and log their
    ``multi_turn/*`` metrics under ``val-aux/``), mean reward per source;
    with ``trainer.log_val_generations=N``, N of the samples to log
    (:mod:`polyrl.trainer.val_generations` picks them)."""
    from polyrl.data.dataset import collate

    params = validation_sampling_params(ctx.cfg)
    size = int(ctx.cfg.data.val_batch_size or len(val_set))
    shown = int(ctx.cfg.trainer.log_val_generations)
    scores: dict[str, list[float]] = {}
    lengths: list[float] = []
    rows: list[dict[str, Any]] = []
    episode_metrics: dict[str, list[float]] = {}  # multi_turn/* of each chunk's episodes
    for start in range(0, len(val_set), size):
        items = [val_set[i] for i in range(start, min(start + size, len(val_set)))]
        prompts = collate(items, ctx.tokenizer.pad_token_id)
        if ctx.episodes is not None:  # multi-turn: the episodes, tools and environment included
            out, played = ctx.episodes(prompts, params)
            for name, value in played.items():
                episode_metrics.setdefault(f"val-aux/{name}", []).append(value)
            # the outcome: per-turn rewards shape training, the figure is the task's
            token_scores, _ = episode_scores(ctx, out, turn_rewards=False)
        else:
            padded = pad_rows_to_multiple(prompts, ctx.workers.dp_size("rollout"))
            out = generate(ctx, padded, params).slice(0, len(prompts) * params.n)
            token_scores, _ = score_responses(ctx, out)
        sample_scores = token_scores.sum(-1).tolist()
        for source, score in zip(out["data_source"], sample_scores):
            scores.setdefault(str(source), []).append(score)
        response_lengths = out["response_mask"].sum(-1).long().tolist()
        lengths += [float(n) for n in response_lengths]
        if shown:
            written = response_lengths
            if ctx.episodes is not None:  # the whole episode, its observations included
                width = out["responses"].shape[1]
                written = out["attention_mask"][:, -width:].sum(-1).long().tolist()
            outputs = ctx.tokenizer.batch_decode(
                [row[:n] for row, n in zip(out["responses"].tolist(), written)],
                skip_special_tokens=True,
            )
            prompt_texts = [str(text) for text in out["raw_prompt"]]
            rows += generation_rows(out["data_source"], prompt_texts, outputs, sample_scores)
    metrics = {
        f"val-core/{source}/reward/mean@{params.n}": float(np.mean(values))
        for source, values in scores.items()
    }
    metrics["val-aux/response_length/mean"] = float(np.mean(lengths))
    metrics.update({name: float(np.mean(values)) for name, values in episode_metrics.items()})
    return ValidationResult(metrics, pick_generations(rows, shown, int(ctx.cfg.trainer.seed)))


class RLTrainer:
    """Builds every part named in the config and drives training."""

    def __init__(self, cfg: DictConfig, plan: RunPlan | None = None) -> None:
        self.cfg = cfg
        self.plan = plan or assemble(cfg)
        if self.plan.problems:
            raise ConfigError("; ".join(self.plan.problems))
        if int(cfg.trainer.max_restarts) < 0:
            raise ConfigError(
                f"trainer.max_restarts={cfg.trainer.max_restarts} must be 0 (off) or more"
            )
        self.world_size = world_size_of(cfg)
        self.output_dir = os.path.abspath(str(cfg.trainer.default_local_dir))
        use_run_folder(self.output_dir)  # where an error's details go
        self.lock = RunLock(self.output_dir)  # a second run into this folder is refused
        self.lock.acquire()
        try:
            self._build(cfg)
        except BaseException:
            self.lock.release()
            raise

    def _build(self, cfg: DictConfig) -> None:
        from transformers import AutoTokenizer

        from polyrl.data.chat_template import use_custom_template
        from polyrl.models.resolve import resolve_model_path

        plan = self.plan
        model_cfg = cfg.actor_rollout_ref.model
        self.model_path = resolve_model_path(str(model_cfg.path))
        tokenizer_path = resolve_model_path(str(model_cfg.tokenizer_path or model_cfg.path))
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
        use_custom_template(self.tokenizer, model_cfg.custom_chat_template)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token

        algorithm = plan.algorithm
        build_data = resolve_object(algorithm.spec.data) if algorithm.spec.data else prompt_data
        self.data: TrainingData = build_data(cfg, self.tokenizer)
        self.loader = self.data.loader
        self.total_steps = int(
            cfg.trainer.total_training_steps or len(self.loader) * int(cfg.trainer.total_epochs)
        )

        reward_cls = plan.reward_provider.load()
        self.reward = reward_cls(
            RewardContext(
                cfg.reward_model,
                cfg.custom_reward_function,
                int(cfg.trainer.seed),
                data_sources=self.data.data_sources,
            )
        )
        self.pipeline = plan.pipeline
        self.schedule = make_schedule(cfg, self.pipeline, self.plan.schedule)

        self.checkpoints = CheckpointManager(self.output_dir, cfg.trainer.max_actor_ckpt_to_keep)
        self.checkpoints.clean_stale()
        self.resume_from = self.checkpoints.resolve_resume(cfg.trainer)
        if self.resume_from:
            self.checkpoints.adopt_run(self.resume_from)
            self._check_resume_config(self.resume_from)
        if cfg.trainer.export_hf_model:
            clean_export_leftovers(self.output_dir)
            check_export_target(self.output_dir, self.checkpoints.run_id)
        if not self.resume_from:
            move_earlier_reward_curve_aside(self.output_dir)

        device = str(cfg.trainer.device)
        if str(cfg.trainer.worker_backend) != IN_PROCESS:
            ensure_ray(
                num_cpus=max(self.world_size, os.cpu_count() or 1) if device == "cpu" else None,
                extra=dict(cfg.trainer.ray_init),
                joined_growth_s=float(cfg.trainer.joined_cluster_growth_s),
            )
        self._restarts: list[Restart] = []
        self._first_start()

    def _first_start(self) -> None:
        """Start the workers; with ``trainer.max_restarts``, a worker lost while they start
        (killed, out of memory, its node gone) is a restart like one lost in a step: all of
        them are started again (:mod:`polyrl.trainer.recovery`)."""
        while True:
            try:
                self._start_workers()
                return
            except WorkerError as exc:
                if len(self._restarts) >= int(self.cfg.trainer.max_restarts) or not worker_died(
                    exc, None
                ):
                    raise
                restart = Restart(len(self._restarts) + 1, cause_line(exc), 0, 0, resumed_step=0)
                record_restart(self.output_dir, restart)
                print(restart.line(int(self.cfg.trainer.max_restarts)), file=sys.stderr)
                self._restarts.append(restart)

    def _start_workers(self) -> None:
        eos_ids = sorted(self._eos_token_ids())
        self.workers = start_role_workers(
            self.cfg,
            self.pipeline.roles(),
            model_path=self.model_path,
            total_training_steps=self.total_steps,
            tokens={"pad_token_id": self.tokenizer.pad_token_id, "eos_token_ids": eos_ids},
            plan=self.plan.worker_plan(),
        )
        self.reward.attach_workers(self.workers)
        self.context = StepContext(
            cfg=self.cfg,
            workers=self.workers,
            tokenizer=self.tokenizer,
            reward=self.reward,
            next_prompts=self.loader.next_batch,
        )
        gen = next((s for s in self.pipeline.stages if isinstance(s, EpisodeGenerateStage)), None)
        if gen is not None:
            context = self.context
            context.episodes = lambda prompts, params: gen.episodes(context, prompts, params)

    def _eos_token_ids(self) -> set[int]:
        ids = {self.tokenizer.eos_token_id}
        try:
            from transformers import GenerationConfig

            generation_eos = GenerationConfig.from_pretrained(self.model_path).eos_token_id
        except OSError:
            generation_eos = None
        if isinstance(generation_eos, int):
            ids.add(generation_eos)
        elif generation_eos:
            ids.update(generation_eos)
        return {i for i in ids if i is not None}

    # ---- validation --------------------------------------------------------------------------
    def validate(self) -> ValidationResult:
        """The run's validation (:attr:`TrainingData.validate`); none gives no metrics. A
        validation's plain metrics dict is one without samples to log."""
        if self.data.validate is None:
            return ValidationResult({})
        self.schedule.before_validation(self.context)
        result = self.data.validate(self.context)
        return result if isinstance(result, ValidationResult) else ValidationResult(result)

    # ---- checkpoints -------------------------------------------------------------------------
    def _save_checkpoint(self, step: int) -> str:
        what = f"the checkpoint of step {step}"
        with naming_full_disk(self.output_dir, what):
            staging = self.checkpoints.staging_dir(step)
        try:
            with naming_full_disk(self.output_dir, what):
                self.workers.save_checkpoint(staging)
                if self.cfg.trainer.export_hf_every_save:
                    # inside the checkpoint: checksummed with it, kept and pruned with it
                    self.workers.export_hf(os.path.join(staging, EXPORT_DIR))
                save_driver_state(
                    staging,
                    {
                        "step": step,
                        "loader": self.loader.state_dict(),
                        "stages": self.pipeline.state_dict(),
                        "config": to_container(self.cfg),
                        **self.schedule.save(staging),
                    },
                )
                return self.checkpoints.commit(step, staging)
        except DiskFullError:
            # this save's own half-written folder: left there, it would keep the disk full
            shutil.rmtree(staging, ignore_errors=True)
            raise

    def _check_resume_config(self, checkpoint: str) -> None:
        """Report what changed since the checkpoint's run; refuse a change the checkpoint would
        undo, and run-defining ones unless ``trainer.resume_allow_changes``
        (:func:`~polyrl.checkpoint.check_resume_changes`)."""
        saved = load_driver_state(checkpoint, restore_rng=False).get("config") or {}
        allow = bool(self.cfg.trainer.resume_allow_changes)
        changes = check_resume_changes(checkpoint, saved, to_container(self.cfg), allow)
        if changes:
            print(f"polyrl: resuming with changed settings: {'; '.join(changes)}", file=sys.stderr)

    def _resume(self) -> int:
        if not self.resume_from:
            return 0
        self.workers.load_checkpoint(self.resume_from)
        state = load_driver_state(self.resume_from)
        self.loader.load_state_dict(state["loader"])
        self.pipeline.load_state_dict(state["stages"])
        self.schedule.load(self.resume_from, state)
        print(f"polyrl: resumed from {self.resume_from} (step {state['step']})", file=sys.stderr)
        return int(state["step"])

    def _export(self) -> str | None:
        """Write ``hf_model/`` unless it already holds this run's export of the final step (a
        run stopped after its last checkpoint but before or during the export writes it)."""
        if not self.cfg.trainer.export_hf_model:
            return None
        run_id = self.checkpoints.run_id
        target = os.path.join(self.output_dir, "hf_model")
        if not export_is_current(self.output_dir, run_id, self.total_steps):
            with naming_full_disk(target, "the Hugging Face export"):
                install_export(self.output_dir, run_id, self.total_steps, self.workers.export_hf)
        return target

    # ---- the loop ----------------------------------------------------------------------------
    def fit(self) -> TrainResult:
        """Train to ``total_steps``; with ``trainer.max_restarts`` a lost worker is replaced (all
        workers restarted, back to this run's newest complete checkpoint) up to that many
        times (:mod:`polyrl.trainer.recovery`)."""
        start_step = self._resume()
        self._first_resume_from = self.resume_from
        # what a restart before the first checkpoint goes back to
        self._start_state = None if start_step else self._driver_snapshot()
        self._finished_steps = start_step
        self._step_running = start_step
        restarts = list(self._restarts)  # those of the first start
        while True:
            try:
                if restarts and restarts[-1].resumed_step < 0:
                    start_step = self._restart(restarts[-1])
                return self._fit_from(start_step, restarts[-1] if restarts else None)
            except WorkerError as exc:
                if len(restarts) >= int(self.cfg.trainer.max_restarts) or not worker_died(
                    exc, self.workers
                ):
                    raise
                restarts.append(
                    Restart(
                        len(restarts) + 1, cause_line(exc), self._step_running, self._finished_steps
                    )
                )

    def _fit_from(self, start_step: int, restart: Restart | None) -> TrainResult:
        cfg = self.cfg.trainer
        logger_ctx = LoggerContext(
            project_name=str(cfg.project_name),
            experiment_name=str(cfg.experiment_name),
            log_dir=self.output_dir,
            total_steps=self.total_steps,
            config=to_container(self.cfg),
            resumed_from_step=start_step,
        )
        val_before: dict[str, float] = {}
        val_after: dict[str, float] = {}
        last_checkpoint = self.resume_from
        pending = restart.metrics() if restart is not None else {}
        with LoggerGroup.from_registrations(self.plan.loggers, logger_ctx) as loggers:
            if cfg.val_before_train and start_step == 0 and self.data.validate is not None:
                before = self.validate()
                val_before = before.metrics
                print(f"polyrl: validation before training: {val_before}", file=sys.stderr)
                # Its own record, at step 0 (the policy no update has touched yet); then one
                # record per training step, 1, 2, ...
                if val_before:
                    loggers.log(val_before, 0)
                loggers.log_generations(before.generations, 0)
            for step in range(start_step + 1, self.total_steps + 1):
                self._step_running = step
                metrics = self._train_step(step)
                is_last = step == self.total_steps
                samples: list[dict[str, Any]] = []
                if cfg.test_freq > 0 and (step % cfg.test_freq == 0 or is_last):
                    after = self.validate()
                    val_after, samples = after.metrics, after.generations
                    metrics.update(val_after)
                metrics["training/epoch"] = float(self.loader.epoch)
                metrics.update(pending)
                pending = {}
                with naming_full_disk(self.output_dir, f"the metrics of step {step}"):
                    loggers.log(metrics, step)
                    loggers.log_generations(samples, step)
                self._finished_steps = step
                if self._saves_checkpoint(step):
                    last_checkpoint = self._save_checkpoint(step)
            self.pipeline.finish()  # a run whose rewards all failed must not exit 0
            metrics_file = os.path.join(self.output_dir, "metrics.jsonl")
            plot = self._plot(metrics_file)
            if plot is not None:
                loggers.log_image("reward_curve", plot, self.total_steps)
        self._step_running = self.total_steps + 1  # the export
        hf_model = self._export()
        return TrainResult(
            steps=self.total_steps,
            output_dir=self.output_dir,
            checkpoint=last_checkpoint,
            hf_model=hf_model,
            metrics_file=metrics_file,
            plot=plot,
            val_before=val_before,
            val_after=val_after,
        )

    def _driver_snapshot(self) -> dict[str, Any]:
        """The driver's state before the first step: data position, stage state, RNG."""
        return copy.deepcopy(
            {
                "loader": self.loader.state_dict(),
                "stages": self.pipeline.state_dict(),
                "rng": capture_rng_state(),
            }
        )

    def _restart(self, restart: Restart) -> int:
        """Replace every worker and go back to this run's newest complete checkpoint (the one
        it resumed from, or its start, when it has written none); returns that step."""
        with contextlib.suppress(PolyrlError):
            self.workers.shutdown()
        self.checkpoints.clean_stale()  # the lost workers' half-written save
        self.resume_from = self.checkpoints.newest_of_run() or self._first_resume_from
        self.schedule = make_schedule(self.cfg, self.pipeline, self.plan.schedule)
        self._start_workers()
        if self.resume_from is None:
            assert self._start_state is not None
            self.loader.load_state_dict(self._start_state["loader"])
            self.pipeline.load_state_dict(self._start_state["stages"])
            restore_rng_state(self._start_state["rng"])
        restart.resumed_step = self._resume()
        record_restart(self.output_dir, restart)
        print(restart.line(int(self.cfg.trainer.max_restarts)), file=sys.stderr)
        self._finished_steps = self._step_running = restart.resumed_step
        return restart.resumed_step

    def _saves_checkpoint(self, step: int) -> bool:
        save_freq = self.cfg.trainer.save_freq
        return save_freq > 0 and (step % save_freq == 0 or step == self.total_steps)

    def _train_step(self, step: int) -> dict[str, float]:
        from polyrl.data.sampler import after_step

        state = self._run_step(step)
        after_step(self.loader, state.batch)  # a curriculum sampler's update(batch), as verl's
        metrics = dict(state.metrics)
        metrics.update(step_batch_metrics(state.batch, state.metrics))
        metrics.update(timing_and_throughput(state.timing, state.batch, self.world_size))
        return metrics

    def _run_step(self, step: int) -> StepState:
        """One training step through the schedule, timed."""
        start = time.perf_counter()
        # The next step's start is needed when there is one, or when this step's checkpoint
        # must hold it (a run resumed from it with more steps continues as this one would).
        state = self.schedule.run(
            step,
            self.context,
            prefetch_next=step < self.total_steps or self._saves_checkpoint(step),
        )
        state.timing["step"] = time.perf_counter() - start
        return state

    def _plot(self, metrics_file: str) -> str | None:
        """The reward-curve PNG, or None when there is nothing to plot (a run with no steps
        left to train); a plotting problem must not fail a finished run."""
        from polyrl.errors import DataError
        from polyrl.plotting import plot_reward_curve

        try:
            return plot_reward_curve(
                metrics_file, os.path.join(self.output_dir, "reward_curve.png")
            )
        except (DataError, OSError, ImportError) as exc:
            print(f"polyrl: no reward curve: {exc}", file=sys.stderr)
            return None

    def close(self) -> None:
        try:
            self.workers.shutdown()
            self.reward.close()
        finally:
            self.lock.release()


def config_summary(cfg: DictConfig, plan: RunPlan) -> str:
    """One line on what is about to run (and one on LoRA, when on)."""
    arr = cfg.actor_rollout_ref
    algorithm = plan.algorithm.name
    lora = describe_lora(cfg)
    return (
        f"polyrl: {algorithm} ({cfg.algorithm.adv_estimator}) | model {arr.model.path} | engine "
        f"{arr.actor.strategy} | rollout {arr.rollout.name} x{arr.rollout.n} | "
        f"{world_size_of(cfg)} worker(s) on {cfg.trainer.device} | "
        f"out {cfg.trainer.default_local_dir}" + (f"\npolyrl: {lora}" if lora else "")
    )


def describe_result(result: TrainResult) -> str:
    """The run's summary: the outputs it wrote, only those that exist (no ``metrics.jsonl``
    without the jsonl logger), and each validation reward before -> after."""
    lines = [f"polyrl: finished {result.steps} steps. Outputs in {result.output_dir}:"]
    outputs = (
        ("checkpoint", result.checkpoint),
        ("HF model", result.hf_model),
        ("metrics", result.metrics_file),
        ("reward curve", result.plot),
    )
    for label, path in outputs:
        if path and os.path.exists(path):
            lines.append(f"  {label:<13} {path}")
    for name, before in sorted(result.val_before.items()):
        if name.startswith("val-core/") and name in result.val_after:
            lines.append(f"  {name}: {before:.3f} before -> {result.val_after[name]:.3f} after")
    return "\n".join(lines)


def run(cfg: DictConfig) -> TrainResult:
    """Train with ``cfg`` and release Ray actors and reward workers whatever happens."""
    from polyrl.preflight import preflight

    preflight(cfg)  # a missing backend is one line here, before Ray starts
    require_cluster_to_join(cfg)  # so is trainer.nnodes > 1 without a cluster to join
    torch.manual_seed(int(cfg.trainer.seed))
    plan = assemble(cfg)
    print(config_summary(cfg, plan), file=sys.stderr)
    trainer = RLTrainer(cfg, plan)
    try:
        result = trainer.fit()
    finally:
        trainer.close()
    print(describe_result(result))
    return result
