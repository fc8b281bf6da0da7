"""polyrl's public API: the one module a plugin imports core names from.

::

    from polyrl.api import AlgorithmSpec, Batch, Stage, StepPipeline, hookimpl, names

It covers what a plugin builds on: the hook marker and the registration specs, the interfaces
(training and rollout engines, rewards, loggers), the batch, the step (stages, the pipeline, the
standard policy-gradient step), batch-key and stage-name constants (:mod:`polyrl.step.names`,
as ``names``), the math helpers of losses and estimators, config and settings helpers, and the
config-check helpers ``AlgorithmSpec.config_check`` functions use. Test helpers (conformance
suites, the tiny model, test configs) are in :mod:`polyrl.api.testing`. Every name here is
re-exported from where it lives in core; the old import paths keep working, but only this
module's names are covered by :data:`API_VERSION`.

Versioning: :data:`API_VERSION` is ``"major.minor"``. A minor bump adds names; a major bump
removes or changes one. A plugin pins the polyrl release that has what it uses
(``polyrl>=0.1`` in its ``dependencies``) and declares the API range it was written for on each
spec it registers, a PEP 440 specifier the registry checks (an excluded plugin is listed as
``incompatible`` and cannot be selected)::

    AdvantageEstimatorSpec(name="mine", ..., api_version=">=1.0,<2")

Importing this module is cheap: it never imports torch, Ray or transformers, so a plugin's
entry-point module may import from it. Names whose home module needs torch (or numpy,
omegaconf) are resolved on first access (``from polyrl.api import Batch`` imports
:mod:`polyrl.batch` then, and only then).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from polyrl.api._lazy import lazy_attributes as _lazy_attributes
from polyrl.checkpoint import atomic_write_text
from polyrl.envs.episode import (
    END_DONE,
    END_ENV_ERROR,
    END_ENV_TIMEOUT,
    END_MAX_ASSISTANT_TURNS,
    END_MAX_USER_TURNS,
    END_TRUNCATED,
    AssistantTurn,
    Environment,
    EnvironmentContext,
    Episode,
    EpisodeResult,
    EpisodeStart,
    Observation,
    ToolCall,
)
from polyrl.errors import ConfigError, DataError, PolyrlError, RewardError
from polyrl.hookspecs import hookimpl
from polyrl.interfaces import (
    AdvantageEstimatorFn,
    EngineContext,
    LoggerContext,
    MetricsLogger,
    MicroBatchLossFn,
    PolicyLossFn,
    RewardContext,
    RewardProvider,
    RewardResult,
    RewardSample,
    RolloutContext,
    RolloutEngine,
    SamplingParams,
    TrainingEngine,
)
from polyrl.interfaces.training_engine import (
    MicroBatchValueLossFn,
    ModelHead,
    needs_entropy_grad,
)
from polyrl.loggers.run_id import resumable_run_id, store_run_id, stored_run_id
from polyrl.loggers.values import to_float_metrics
from polyrl.lora import adapter_path, lora_config, lora_problems, lora_rank, target_modules
from polyrl.models.resolve import resolve_model_path
from polyrl.registry import get_registry
from polyrl.seeding import derive_seed
from polyrl.specs import (
    API_VERSION,
    ESTIMATOR_KEYS,
    POLICY_LOSS_KEYS,
    AdvantageEstimatorSpec,
    AlgorithmSpec,
    DataSourceScorerSpec,
    EnvironmentSpec,
    LoggerSpec,
    PluginKind,
    PolicyLossSpec,
    RewardProviderSpec,
    RolloutEngineSpec,
    ScheduleSpec,
    TrainingEngineSpec,
)
from polyrl.workers.dispatch import Dispatch
from polyrl.workers.mesh import DataParallelRank, tensor_parallel_mesh
from polyrl.workers.roles.base import Role, RoleContext

# Names resolved on first access: name -> "module:attribute", or "module" for a module itself.
# Keep the ``TYPE_CHECKING`` imports below in step (core/tests/test_api_boundary.py checks).
_LAZY: dict[str, str] = {
    "following": "polyrl.config.sections:following",
    "save_hf_model": "polyrl.models.saving:save_hf_model",
    "load_step_state": "polyrl.step.saved_state:load_step_state",
    "save_step_state": "polyrl.step.saved_state:save_step_state",
    "TIS_CAP_KEY": "polyrl.config.checks.off_policy:TIS_CAP_KEY",
    "tis_enabled": "polyrl.config.checks.off_policy:tis_enabled",
    "pool_of": "polyrl.config.checks:pool_of",
    "SynchronousSchedule": "polyrl.step.schedule:SynchronousSchedule",
    "SyncWeightsStage": "polyrl.step.stages:SyncWeightsStage",
    # the batch
    "Batch": "polyrl.batch:Batch",
    # the step: stages, the pipeline, batch keys and stage names
    "names": "polyrl.step.names",
    "PROMPT_BATCH_KEYS": "polyrl.step:PROMPT_BATCH_KEYS",
    "Stage": "polyrl.step:Stage",
    "StepContext": "polyrl.step:StepContext",
    "StepPipeline": "polyrl.step:StepPipeline",
    "StepState": "polyrl.step:StepState",
    "policy_gradient_pipeline": "polyrl.step:policy_gradient_pipeline",
    # the run plan: what a config selects, the step built from it, the workers' part
    "RunPlan": "polyrl.plan:RunPlan",
    "assemble": "polyrl.plan:assemble",
    "ChatTokens": "polyrl.envs.chat:ChatTokens",
    "MultiTurnRollout": "polyrl.envs.rollout:MultiTurnRollout",
    "default_compute_score": "polyrl.rewards.scorers:default_compute_score",
    "load_config": "polyrl.config.loader:load_config",
    "import_user_file": "polyrl.user_modules:import_file",
    "resolve_data_files": "polyrl.data.sources:resolve_data_files",
    "build_pipeline": "polyrl.plan:build_pipeline",
    "select_algorithm": "polyrl.plan:select_algorithm",
    "WorkerPlan": "polyrl.workers.worker_plan:WorkerPlan",
    "MODEL_INPUT_KEYS": "polyrl.step.stages:MODEL_INPUT_KEYS",
    "RefLogProbStage": "polyrl.step.stages:RefLogProbStage",
    "UpdateActorStage": "polyrl.step.stages:UpdateActorStage",
    "generate": "polyrl.step.stages:generate",
    "score_responses": "polyrl.step.stages:score_responses",
    "training_sampling_params": "polyrl.step.stages:training_sampling_params",
    "MiniBatchPlan": "polyrl.step.minibatch:MiniBatchPlan",
    "plan_minibatches": "polyrl.step.minibatch:plan_minibatches",
    # the math of losses and estimators (torch)
    "agg_loss": "polyrl.algorithms.loss_agg:agg_loss",
    "check_loss_agg_mode": "polyrl.algorithms.loss_agg:check_loss_agg_mode",
    "clip_ratios": "polyrl.algorithms.policy_loss:clip_ratios",
    "clipped_surrogate": "polyrl.algorithms.policy_loss:clipped_surrogate",
    "masked_mean": "polyrl.algorithms.functional:masked_mean",
    "masked_whiten": "polyrl.algorithms.functional:masked_whiten",
    # the sandbox for model-written code (data-source scorers that run programs)
    "ProgramResult": "polyrl.rewards.sandbox:ProgramResult",
    "SandboxLimits": "polyrl.rewards.sandbox:SandboxLimits",
    "run_program": "polyrl.rewards.sandbox:run_program",
    # config and settings helpers
    "plugin_settings": "polyrl.config.keys:plugin_settings",
    "schema_node": "polyrl.config.nodes:schema_node",
    "schema_config": "polyrl.config.sections:schema_config",
    "OptimConfig": "polyrl.config.schema:OptimConfig",
    # config checks (``AlgorithmSpec.config_check`` and the engines' checks)
    "Checker": "polyrl.config.checks.checker:Checker",
    "Notice": "polyrl.config.checks.checker:Notice",
    "LOSS_AGG_MODES": "polyrl.config.checks.ranges:LOSS_AGG_MODES",
    "at_least": "polyrl.config.checks.ranges:at_least",
    "check_ppo_batches": "polyrl.config.checks.batches:check_ppo_batches",
    "get": "polyrl.config.checks.checker:get",
    "is_positive_int": "polyrl.config.checks.checker:is_positive_int",
    "looks_local": "polyrl.config.checks.model:looks_local",
    "role_world": "polyrl.config.checks:role_world",
    # datasets
    "TRUNCATION_MODES": "polyrl.data.dataset:TRUNCATION_MODES",
    "read_parquet": "polyrl.data.dataset:read_parquet",
    "PromptLoader": "polyrl.data.loader:PromptLoader",
    "settle_unteachable": "polyrl.data.unteachable:settle_unteachable",
    "template_kwargs": "polyrl.data.chat_template:template_kwargs",
    "use_custom_template": "polyrl.data.chat_template:use_custom_template",
    "TrainingData": "polyrl.data.training:TrainingData",
    "training_data_from_files": "polyrl.data.training:training_data_from_files",
    # rollout engines: settings, the response layout, weight sync
    "DTYPE_ALIASES": "polyrl.rollout_config:DTYPE_ALIASES",
    "SEED_STRIDE": "polyrl.rollout_config:SEED_STRIDE",
    "RolloutEngineNotInstalledError": "polyrl.rollout_config:RolloutEngineNotInstalledError",
    "engine_kwargs_problem": "polyrl.rollout_config:engine_kwargs_problem",
    "passthrough_engine_kwargs": "polyrl.rollout_config:passthrough_engine_kwargs",
    "rollout_node": "polyrl.rollout_config:rollout_node",
    "WeightStreamChecker": "polyrl.rollout_layout:WeightStreamChecker",
    "WeightSyncError": "polyrl.rollout_layout:WeightSyncError",
    "assemble_rollout": "polyrl.rollout_layout:assemble_rollout",
    "checkpoint_manifest": "polyrl.rollout_layout:checkpoint_manifest",
    "position_ids_for": "polyrl.rollout_layout:position_ids_for",
    "strip_left_padding": "polyrl.rollout_layout:strip_left_padding",
    # training engines: checkpoint loading
    "SafeFileSystemReader": "polyrl.safe_load:SafeFileSystemReader",
    "load_plain": "polyrl.safe_load:load_plain",
    # worker roles: what a role on a training engine (the critic) shares with the actor's
    "optimizer_steps_per_training_step": (
        "polyrl.workers.roles.actor:optimizer_steps_per_training_step"
    ),
    "plain_node": "polyrl.workers.roles.actor:plain_node",
    "train_on_plan": "polyrl.workers.roles.actor:train_on_plan",
    "training_engine_context": "polyrl.workers.roles.actor:training_engine_context",
}

if TYPE_CHECKING:
    from polyrl.algorithms.functional import masked_mean, masked_whiten
    from polyrl.algorithms.loss_agg import agg_loss, check_loss_agg_mode
    from polyrl.algorithms.policy_loss import clip_ratios, clipped_surrogate
    from polyrl.batch import Batch
    from polyrl.config.checks import pool_of, role_world
    from polyrl.config.checks.batches import check_ppo_batches
    from polyrl.config.checks.checker import Checker, Notice, get, is_positive_int
    from polyrl.config.checks.model import looks_local
    from polyrl.config.checks.off_policy import TIS_CAP_KEY, tis_enabled
    from polyrl.config.checks.ranges import LOSS_AGG_MODES, at_least
    from polyrl.config.keys import plugin_settings
    from polyrl.config.loader import load_config
    from polyrl.config.nodes import schema_node
    from polyrl.config.schema import OptimConfig
    from polyrl.config.sections import following, schema_config
    from polyrl.data.chat_template import template_kwargs, use_custom_template
    from polyrl.data.dataset import TRUNCATION_MODES, read_parquet
    from polyrl.data.loader import PromptLoader
    from polyrl.data.sources import resolve_data_files
    from polyrl.data.training import TrainingData, training_data_from_files
    from polyrl.data.unteachable import settle_unteachable
    from polyrl.envs.chat import ChatTokens
    from polyrl.envs.rollout import MultiTurnRollout
    from polyrl.models.saving import save_hf_model
    from polyrl.plan import RunPlan, assemble, build_pipeline, select_algorithm
    from polyrl.rewards.sandbox import ProgramResult, SandboxLimits, run_program
    from polyrl.rewards.scorers import default_compute_score
    from polyrl.rollout_config import (
        DTYPE_ALIASES,
        SEED_STRIDE,
        RolloutEngineNotInstalledError,
        engine_kwargs_problem,
        passthrough_engine_kwargs,
        rollout_node,
    )
    from polyrl.rollout_layout import (
        WeightStreamChecker,
        WeightSyncError,
        assemble_rollout,
        checkpoint_manifest,
        position_ids_for,
        strip_left_padding,
    )
    from polyrl.safe_load import SafeFileSystemReader, load_plain
    from polyrl.step import (
        PROMPT_BATCH_KEYS,
        Stage,
        StepContext,
        StepPipeline,
        StepState,
        names,
        policy_gradient_pipeline,
    )
    from polyrl.step.minibatch import MiniBatchPlan, plan_minibatches
    from polyrl.step.saved_state import load_step_state, save_step_state
    from polyrl.step.schedule import SynchronousSchedule
    from polyrl.step.stages import (
        MODEL_INPUT_KEYS,
        RefLogProbStage,
        SyncWeightsStage,
        UpdateActorStage,
        generate,
        score_responses,
        training_sampling_params,
    )
    from polyrl.user_modules import import_file as import_user_file
    from polyrl.workers.roles.actor import (
        optimizer_steps_per_training_step,
        plain_node,
        train_on_plan,
        training_engine_context,
    )
    from polyrl.workers.worker_plan import WorkerPlan

__all__ = [
    "API_VERSION",
    "DTYPE_ALIASES",
    "END_DONE",
    "END_ENV_ERROR",
    "END_ENV_TIMEOUT",
    "END_MAX_ASSISTANT_TURNS",
    "END_MAX_USER_TURNS",
    "END_TRUNCATED",
    "ESTIMATOR_KEYS",
    "LOSS_AGG_MODES",
    "MODEL_INPUT_KEYS",
    "POLICY_LOSS_KEYS",
    "PROMPT_BATCH_KEYS",
    "SEED_STRIDE",
    "TIS_CAP_KEY",
    "TRUNCATION_MODES",
    "AdvantageEstimatorFn",
    "AdvantageEstimatorSpec",
    "AlgorithmSpec",
    "AssistantTurn",
    "Batch",
    "ChatTokens",
    "Checker",
    "ConfigError",
    "DataError",
    "DataParallelRank",
    "DataSourceScorerSpec",
    "Dispatch",
    "EngineContext",
    "Environment",
    "EnvironmentContext",
    "EnvironmentSpec",
    "Episode",
    "EpisodeResult",
    "EpisodeStart",
    "LoggerContext",
    "LoggerSpec",
    "MetricsLogger",
    "MicroBatchLossFn",
    "MicroBatchValueLossFn",
    "MiniBatchPlan",
    "ModelHead",
    "MultiTurnRollout",
    "Notice",
    "Observation",
    "OptimConfig",
    "PluginKind",
    "PolicyLossFn",
    "PolicyLossSpec",
    "PolyrlError",
    "ProgramResult",
    "PromptLoader",
    "RefLogProbStage",
    "RewardContext",
    "RewardError",
    "RewardProvider",
    "RewardProviderSpec",
    "RewardResult",
    "RewardSample",
    "Role",
    "RoleContext",
    "RolloutContext",
    "RolloutEngine",
    "RolloutEngineNotInstalledError",
    "RolloutEngineSpec",
    "RunPlan",
    "SafeFileSystemReader",
    "SamplingParams",
    "SandboxLimits",
    "ScheduleSpec",
    "Stage",
    "StepContext",
    "StepPipeline",
    "StepState",
    "SyncWeightsStage",
    "SynchronousSchedule",
    "ToolCall",
    "TrainingData",
    "TrainingEngine",
    "TrainingEngineSpec",
    "UpdateActorStage",
    "WeightStreamChecker",
    "WeightSyncError",
    "WorkerPlan",
    "adapter_path",
    "agg_loss",
    "assemble",
    "assemble_rollout",
    "at_least",
    "atomic_write_text",
    "build_pipeline",
    "check_loss_agg_mode",
    "check_ppo_batches",
    "checkpoint_manifest",
    "clip_ratios",
    "clipped_surrogate",
    "default_compute_score",
    "derive_seed",
    "engine_kwargs_problem",
    "following",
    "generate",
    "get",
    "get_registry",
    "hookimpl",
    "import_user_file",
    "is_positive_int",
    "load_config",
    "load_plain",
    "load_step_state",
    "looks_local",
    "lora_config",
    "lora_problems",
    "lora_rank",
    "masked_mean",
    "masked_whiten",
    "names",
    "needs_entropy_grad",
    "optimizer_steps_per_training_step",
    "passthrough_engine_kwargs",
    "plain_node",
    "plan_minibatches",
    "plugin_settings",
    "policy_gradient_pipeline",
    "pool_of",
    "position_ids_for",
    "read_parquet",
    "resolve_data_files",
    "resolve_model_path",
    "resumable_run_id",
    "role_world",
    "rollout_node",
    "run_program",
    "save_hf_model",
    "save_step_state",
    "schema_config",
    "schema_node",
    "score_responses",
    "select_algorithm",
    "settle_unteachable",
    "store_run_id",
    "stored_run_id",
    "strip_left_padding",
    "target_modules",
    "template_kwargs",
    "tensor_parallel_mesh",
    "tis_enabled",
    "to_float_metrics",
    "train_on_plan",
    "training_data_from_files",
    "training_engine_context",
    "training_sampling_params",
    "use_custom_template",
]


__getattr__, __dir__ = _lazy_attributes(__name__, _LAZY, __all__)
