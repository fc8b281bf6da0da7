"""Typed registration records that plugins return from their hooks.

One dataclass per plugin kind (the conda style): a hook returns instances of exactly one of
these, so the registry can check what it gets and ``polyrl plugins`` can list it. Heavy
implementations (engines) are given as an import string ``"package.module:Attribute"`` and
resolved only when selected, so that listing plugins never imports torch, vLLM or Megatron.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

API_VERSION = "1.4"
"""The version of :mod:`polyrl.api`'s names, ``"major.minor"``: a minor bump adds names, a major
bump removes or changes one. Re-exported as ``polyrl.api.API_VERSION``; a spec's ``api_version``
is judged against it."""


class PluginKind(str, Enum):
    """The kinds of plugin polyrl knows, with the config key that selects each."""

    TRAINING_ENGINE = "training_engine"
    ROLLOUT_ENGINE = "rollout_engine"
    ADVANTAGE_ESTIMATOR = "advantage_estimator"
    POLICY_LOSS = "policy_loss"
    REWARD_PROVIDER = "reward_provider"
    LOGGER = "logger"
    ALGORITHM = "algorithm"
    DATA_SOURCE_SCORER = "data_source_scorer"
    SCHEDULE = "schedule"
    ENVIRONMENT = "environment"

    @property
    def config_key(self) -> str:
        return _CONFIG_KEYS[self]

    @property
    def flag(self) -> str | None:
        """The boolean config key without which no plugin of this kind is selected (None: one
        always is)."""
        return _FLAGS.get(self)


_CONFIG_KEYS = {
    PluginKind.TRAINING_ENGINE: "actor_rollout_ref.actor.strategy",
    PluginKind.ROLLOUT_ENGINE: "actor_rollout_ref.rollout.name",
    PluginKind.ADVANTAGE_ESTIMATOR: "algorithm.adv_estimator",
    PluginKind.POLICY_LOSS: "actor_rollout_ref.actor.policy_loss.loss_mode",
    PluginKind.REWARD_PROVIDER: "reward_model.reward_manager",
    PluginKind.LOGGER: "trainer.logger",
    PluginKind.ALGORITHM: "algorithm.name",
    # not a config key's value: a row's data_source (the column data.reward_fn_key names)
    PluginKind.DATA_SOURCE_SCORER: "data.reward_fn_key",
    PluginKind.SCHEDULE: "trainer.async_mode",
    # selected only when actor_rollout_ref.rollout.multi_turn.enable is true
    PluginKind.ENVIRONMENT: "actor_rollout_ref.rollout.multi_turn.environment",
}
# Kinds selected only when a flag key is true: the environment only for multi-turn rollouts.
_FLAGS = {PluginKind.ENVIRONMENT: "actor_rollout_ref.rollout.multi_turn.enable"}


def resolve_object(target: Any) -> Any:
    """Return ``target`` itself, or the attribute an import string ``"pkg.mod:attr"`` names.

    Import errors propagate unchanged: the registry wraps them into a message naming the package.
    """
    if not isinstance(target, str):
        return target
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"import string {target!r} must look like 'package.module:Attribute'")
    obj: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        obj = getattr(obj, part)
    return obj


@dataclass(frozen=True)
class _Spec:
    """Fields every registration has. A subclass's ``config_class`` optionally names a dataclass
    describing the plugin's config section ``plugins.<name>`` (checked by ``polyrl validate``).

    ``config_check`` (a callable or import string) is the plugin's own check of the run config:
    ``check(cfg) -> list[str]``, one line per problem, run by ``polyrl validate`` and before a
    run starts when this plugin is selected. Backend-specific rules live there, not in core.
    ``runtime_modules`` names the modules the implementation needs at run time (``("vllm",)``):
    the driver checks they import before Ray starts, so a missing backend is one line, not a
    traceback from inside a worker.

    ``config_sections`` maps dotted config paths to the dataclass (an instance of it, for
    interpolated defaults, or an import string to either) declaring the keys this plugin reads
    there, at verl's place in the tree: ``{"actor_rollout_ref.actor.fsdp_config":
    "polyrl_engine_fsdp.settings:FSDPSettings"}``. Sections are mounted into the schema whenever
    the package is installed (:mod:`polyrl.config.sections`), so they are typed, shown by
    ``polyrl config`` and spelled-checked like core's keys; keep their module free of heavy
    imports. ``key_aliases`` maps an older or verl-only key (or group) to the key it means;
    command-line overrides are rewritten to it.

    ``implies`` (a callable or import string) is ``implies(cfg) -> {key: (value, because)}``:
    settings of other keys that this plugin's own keys stand for, as verl's
    ``algorithm.rollout_correction.bypass_mode=true`` stands for the ``bypass_mode`` policy
    loss. It is called for every installed plugin when the config is composed, after the
    command line; each key still at its schema default takes ``value`` (``polyrl config``
    shows it), and one the user set to another value is refused in one line quoting
    ``because`` (the setting that implies it). Keep it light, like a ``config_check``.

    ``edit_step`` (a callable or import string) is ``edit_step(cfg, pipeline) -> None``: an
    edit of the selected algorithm's step for a feature this plugin's keys turn on whatever
    the algorithm (verl's decoupled rollout correction adds a stage before ``adv``). It is
    called for every installed plugin after the algorithm builds its step and before the stages
    are bound, in ``polyrl validate`` too: light, and the step is left alone unless the
    plugin's own keys ask for the feature. A setting it cannot honour raises
    :class:`~polyrl.errors.ConfigError` (one line).

    ``api_version`` is the range of :data:`API_VERSION` the plugin was written for, as a PEP 440
    specifier (``">=1.0,<2"``). Outside it, or when it is not a valid specifier, the registration
    is listed as ``incompatible`` and selecting it fails before anything starts, naming the
    release to install, instead of failing on a missing name deep inside a run. None declares
    nothing: the plugin is taken to work with every API version.
    """

    name: str
    description: str
    config_check: Callable[[Any], list[str]] | str | None = field(default=None, kw_only=True)
    runtime_modules: tuple[str, ...] = field(default=(), kw_only=True)
    config_sections: Mapping[str, Any] = field(default_factory=dict, kw_only=True)
    key_aliases: Mapping[str, str] = field(default_factory=dict, kw_only=True)
    implies: Callable[[Any], Mapping[str, tuple[Any, str]]] | str | None = field(
        default=None, kw_only=True
    )
    edit_step: Callable[[Any, Any], None] | str | None = field(default=None, kw_only=True)
    api_version: str | None = field(default=None, kw_only=True)

    def capability_flags(self) -> dict[str, Any]:
        """Capability flags of this registration, as shown by ``polyrl plugins``."""
        return {}

    def load(self) -> Any:
        """Resolve and return the implementation (may import heavy modules)."""
        raise TypeError(f"{type(self).__name__} must define load()")


@dataclass(frozen=True)
class TrainingEngineSpec(_Spec):
    """A training backend (FSDP2, Megatron, DeepSpeed ...).

    ``engine`` is a :class:`polyrl.interfaces.TrainingEngine` subclass or an import string to one.
    ``supports_value_head``: it builds :attr:`polyrl.interfaces.training_engine.ModelHead.VALUE`
    models (``compute_values``, ``train_value_step``), so it can run a PPO critic.
    ``checkpoint_reader`` (an import string or callable) lets ``polyrl export`` turn the
    engine's checkpoints into Hugging Face folders without starting the engine's ranks:
    ``read(role_dir, cfg, model_path) -> torch.nn.Module`` returns the model a checkpoint's
    role folder holds, whole, on the CPU in float32 (a transformers model; a peft model for a
    LoRA checkpoint), given the run config it was saved with and the local model folder.
    """

    engine: type | str = ""
    supports_cpu: bool = False
    supports_cuda: bool = True
    supports_lora: bool = False
    supports_sequence_packing: bool = False
    supports_weight_sync: bool = True
    supports_checkpoint: bool = True
    supports_value_head: bool = False
    config_class: type | str | None = None
    checkpoint_reader: Callable[..., Any] | str | None = None

    def capability_flags(self) -> dict[str, Any]:
        return {
            "cpu": self.supports_cpu,
            "cuda": self.supports_cuda,
            "lora": self.supports_lora,
            "sequence_packing": self.supports_sequence_packing,
            "weight_sync": self.supports_weight_sync,
            "checkpoint": self.supports_checkpoint,
            "value_head": self.supports_value_head,
        }

    def load(self) -> type:
        return resolve_object(self.engine)


@dataclass(frozen=True)
class RolloutEngineSpec(_Spec):
    """A generation backend (vLLM, SGLang, HF generate ...).

    ``engine`` is a :class:`polyrl.interfaces.RolloutEngine` subclass or an import string to one.
    ``supports_sleep`` means the engine can free its memory between generations (hybrid engine).
    ``supports_lora_adapters``: in a LoRA run (``actor_rollout_ref.model.lora_rank > 0``) the
    engine's ``update_weights`` takes the adapters alone (peft's names, e.g.
    ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``) and applies them itself;
    without it, weight sync sends merged weights under the base model's names (see
    :mod:`polyrl.lora`).
    """

    engine: type | str = ""
    supports_cpu: bool = False
    supports_cuda: bool = True
    supports_weight_sync: bool = True
    supports_sleep: bool = False
    supports_logprobs: bool = True
    supports_lora_adapters: bool = False
    config_class: type | str | None = None

    def capability_flags(self) -> dict[str, Any]:
        return {
            "cpu": self.supports_cpu,
            "cuda": self.supports_cuda,
            "weight_sync": self.supports_weight_sync,
            "sleep": self.supports_sleep,
            "logprobs": self.supports_logprobs,
            "lora_adapters": self.supports_lora_adapters,
        }

    def load(self) -> type:
        return resolve_object(self.engine)


# What a policy loss returns (PolicyLossSpec.level): a per-token matrix, or one value per row.
TOKEN_LEVEL = "token"
SEQUENCE_LEVEL = "sequence"
LOSS_LEVELS = (TOKEN_LEVEL, SEQUENCE_LEVEL)

# Batch keys an estimator / a policy loss reads unless its spec says otherwise.
ESTIMATOR_KEYS = ("token_level_rewards", "response_mask", "uid")
POLICY_LOSS_KEYS = ("old_log_probs", "advantages", "response_mask")


@dataclass(frozen=True)
class AdvantageEstimatorSpec(_Spec):
    """An advantage estimator: a callable with the signature documented in
    :data:`polyrl.interfaces.AdvantageEstimatorFn`.

    ``requires`` lists the batch keys it reads (``values`` for GAE, a baseline for ReMax): the
    step's chain check makes sure an earlier stage provides each. ``requires_groups``: it
    compares samples of one prompt, so ``actor_rollout_ref.rollout.n`` must be at least 2,
    unless ``groups_of_one`` says what a group of one sample gets (verl's GRPO: the raw score,
    no baseline): then ``n=1`` is accepted with a notice quoting it.
    """

    fn: Callable[..., Any] | str = ""
    requires: tuple[str, ...] = ESTIMATOR_KEYS
    requires_groups: bool = False
    groups_of_one: str | None = None
    config_class: type | str | None = None

    def capability_flags(self) -> dict[str, Any]:
        return {"groups": self.requires_groups, "requires": list(self.requires)}

    def load(self) -> Callable[..., Any]:
        return resolve_object(self.fn)


@dataclass(frozen=True)
class PolicyLossSpec(_Spec):
    """A policy loss: a callable with the signature of :data:`polyrl.interfaces.PolicyLossFn`.

    ``requires`` lists the batch keys it reads (``rollout_log_probs`` for truncated importance
    sampling); they reach the actor's update and are checked against the step's chain.

    ``level``: ``"token"`` (the default) — ``fn`` returns a per-token loss ``[B, T]`` that the
    actor aggregates with ``actor_rollout_ref.actor.loss_agg_mode``; ``"sequence"`` — ``fn``
    returns one loss per row ``[B]`` (a sequence-level objective such as DPO's per-pair loss,
    given to each row of the pair), averaged over the mini-batch's rows whatever their lengths.
    """

    fn: Callable[..., Any] | str = ""
    requires: tuple[str, ...] = POLICY_LOSS_KEYS
    config_class: type | str | None = None
    level: str = TOKEN_LEVEL

    def capability_flags(self) -> dict[str, Any]:
        return {"requires": list(self.requires), "level": self.level}

    def load(self) -> Callable[..., Any]:
        return resolve_object(self.fn)


@dataclass(frozen=True)
class RewardProviderSpec(_Spec):
    """A reward provider: a :class:`polyrl.interfaces.RewardProvider` subclass or import string.

    ``data_sources`` lists the ``data_source`` values it scores natively (empty: any).

    ``roles`` (optional; a callable or import string) is ``roles(cfg) -> {role: Role subclass or
    import string}``: the worker roles the provider scores through under the composed config
    ``cfg`` (a judge model served by an engine on the workers). The run plan places them like
    the step's own roles (``trainer.role_pools``; the global pool by default) and the trainer
    hands the provider the driver's handle on the workers
    (:meth:`polyrl.interfaces.RewardProvider.attach_workers`). It runs in the driver and in
    ``polyrl validate``: keep it light. ``plugin_keys``: as :attr:`AlgorithmSpec.plugin_keys`,
    config keys naming plugins those roles build (the judge's rollout engine).
    """

    provider: type | str = ""
    data_sources: tuple[str, ...] = field(default_factory=tuple)
    config_class: type | str | None = None
    roles: Callable[..., Mapping[str, type | str]] | str | None = None
    plugin_keys: Mapping[str, str] = field(default_factory=dict)

    def capability_flags(self) -> dict[str, Any]:
        return {"data_sources": list(self.data_sources)} if self.data_sources else {}

    def worker_roles(self, cfg: Any) -> dict[str, type | str]:
        """``roles(cfg)``: the worker roles the provider uses under ``cfg`` (none by default)."""
        return dict(resolve_object(self.roles)(cfg)) if self.roles else {}

    def load(self) -> type:
        return resolve_object(self.provider)


@dataclass(frozen=True)
class LoggerSpec(_Spec):
    """A metrics logger: a :class:`polyrl.interfaces.MetricsLogger` subclass or import string."""

    logger: type | str = ""
    config_class: type | str | None = None

    def load(self) -> type:
        return resolve_object(self.logger)


@dataclass(frozen=True)
class AlgorithmSpec(_Spec):
    """An RL algorithm: the stages of its training step, the worker roles they use, and the
    config defaults it brings.

    ``pipeline`` is a callable (or import string) ``pipeline(cfg) -> StepPipeline`` building the
    step from the composed config (see :mod:`polyrl.step`); it runs in the driver and in
    ``polyrl validate``, so it must not load models. ``estimators`` are the
    ``algorithm.adv_estimator`` values this algorithm owns: selecting one of them selects the
    algorithm (``algorithm.name`` picks one explicitly). ``roles`` are the worker roles its stages
    may use (``actor``, ``rollout``, ``ref``, ``critic``, ``reward_model`` ...);
    ``role_classes`` supplies the worker-side class (a :class:`polyrl.workers.roles.Role`
    subclass or import string) of any role beyond core's ``actor``, ``ref``, ``rollout`` and
    ``reward_model``.
    ``plugin_keys`` maps further config keys whose values name plugins this algorithm's roles
    build to the kind they select (the critic's engine: ``{"critic.strategy":
    "training_engine"}``): the run plan selects them with the rest and hands them to the
    workers, where roles load them with ``ctx.plan.load(kind, name)``.
    ``owned_keys`` are config keys (or groups) only this algorithm reads, such as DAPO's
    ``algorithm.filter_groups``: setting one while another algorithm is selected is refused by
    ``polyrl validate`` instead of being silently ignored.
    ``config_defaults`` maps dotted config keys to values merged when the config is composed:
    above the schema's defaults, below the recipe and the command line, and shown by
    ``polyrl config``.

    ``data`` (optional; a callable or import string) is for an algorithm whose step does not
    start from prompts (offline DPO trains on preference pairs):
    ``data(cfg, tokenizer) -> polyrl.data.training.TrainingData`` builds the loader of the
    batches each step starts from and the run's validation; it runs in the driver only. Its
    pipeline then declares the keys of those batches for the chain check
    (``StepPipeline(stages, initial_keys=...)``). None: verl-format prompt files
    (``data.train_files``), validated by generation and reward.
    """

    pipeline: Callable[..., Any] | str = ""
    estimators: tuple[str, ...] = ()
    roles: tuple[str, ...] = ("actor", "rollout")
    role_classes: Mapping[str, type | str] = field(default_factory=dict)
    config_defaults: Mapping[str, Any] = field(default_factory=dict)
    config_class: type | str | None = None
    data: Callable[..., Any] | str | None = None
    owned_keys: tuple[str, ...] = ()
    plugin_keys: Mapping[str, str] = field(default_factory=dict)

    def capability_flags(self) -> dict[str, Any]:
        flags: dict[str, Any] = {"roles": list(self.roles), "estimators": list(self.estimators)}
        if self.config_defaults:
            flags["defaults"] = dict(self.config_defaults)
        return flags

    def load(self) -> Callable[..., Any]:
        return resolve_object(self.pipeline)


@dataclass(frozen=True)
class DataSourceScorerSpec(_Spec):
    """A verifiable scorer for rows whose ``data_source`` is one of ``data_sources``, used by
    the built-in ``naive`` reward provider beside core's own scorers whenever its package is
    installed (no key selects it: the rows do).

    ``fn`` is ``fn(data_source, solution_str, ground_truth, extra_info, settings) -> float |
    dict`` (a dict has ``score`` and numeric extras), given as an import string or a
    module-level function: reward workers, sandboxed ones included, import it themselves.
    ``settings_key`` names the key under ``reward_model`` whose node reaches ``fn`` as a plain
    dict (``"code"`` for ``reward_model.code``; declare it in ``config_sections``); None: ``{}``.
    """

    fn: Callable[..., Any] | str = ""
    data_sources: tuple[str, ...] = ()
    settings_key: str | None = None

    def capability_flags(self) -> dict[str, Any]:
        return {"data_sources": list(self.data_sources)}

    def load(self) -> Callable[..., Any]:
        return resolve_object(self.fn)


@dataclass(frozen=True)
class ScheduleSpec(_Spec):
    """How the trainer turns steps into pipeline runs, selected by ``trainer.async_mode``.

    ``schedule`` is a callable (or import string) ``schedule(cfg, pipeline) -> StepSchedule``
    (:class:`polyrl.step.schedule.StepSchedule`: ``run``, ``before_validation``, ``save``,
    ``load``); it runs in the driver. ``describe`` (optional) is ``describe(cfg, pipeline) ->
    str``, the text of ``polyrl validate``'s ``schedule:`` line after the name. Rules the
    schedule needs of the config (placement, corrections) go in its ``config_check``.
    """

    schedule: Callable[..., Any] | str = ""
    describe: Callable[..., str] | str | None = None

    def load(self) -> Callable[..., Any]:
        return resolve_object(self.schedule)


@dataclass(frozen=True)
class EnvironmentSpec(_Spec):
    """A multi-turn environment, selected by ``actor_rollout_ref.rollout.multi_turn.environment``
    when ``multi_turn.enable`` is true.

    ``environment`` is a :class:`polyrl.envs.Environment` subclass (or an import string to one),
    built once in the driver; it opens an :class:`polyrl.envs.Episode` per sampled row (see
    :mod:`polyrl.envs.episode` for the loop and :mod:`polyrl.envs` for the trajectory batch).
    ``uses_tools``: its episodes answer parsed tool calls (``multi_turn.format``);
    ``user_turns``: it speaks as the user too (``multi_turn.max_user_turns`` applies).
    """

    environment: type | str = ""
    uses_tools: bool = True
    user_turns: bool = False

    def capability_flags(self) -> dict[str, Any]:
        return {"tools": self.uses_tools, "user_turns": self.user_turns}

    def load(self) -> type:
        return resolve_object(self.environment)


SPEC_TYPES: dict[PluginKind, type[_Spec]] = {
    PluginKind.TRAINING_ENGINE: TrainingEngineSpec,
    PluginKind.ROLLOUT_ENGINE: RolloutEngineSpec,
    PluginKind.ADVANTAGE_ESTIMATOR: AdvantageEstimatorSpec,
    PluginKind.POLICY_LOSS: PolicyLossSpec,
    PluginKind.REWARD_PROVIDER: RewardProviderSpec,
    PluginKind.LOGGER: LoggerSpec,
    PluginKind.ALGORITHM: AlgorithmSpec,
    PluginKind.DATA_SOURCE_SCORER: DataSourceScorerSpec,
    PluginKind.SCHEDULE: ScheduleSpec,
    PluginKind.ENVIRONMENT: EnvironmentSpec,
}

# First-party packages of the design (DESIGN.md) that do not exist yet: an "unknown name" error
# must not send a user to `pip install` a package that is not on PyPI.
UNRELEASED_PACKAGES: frozenset[str] = frozenset()

# Names of first-party plugins and the pip package that provides each: used in "unknown name"
# errors so that a user who selects a backend they have not installed is told what to install.
FIRST_PARTY_PACKAGES: dict[PluginKind, dict[str, str]] = {
    PluginKind.TRAINING_ENGINE: {
        "fsdp2": "polyrl-engine-fsdp",
        "fsdp": "polyrl-engine-fsdp",
        "megatron": "polyrl-engine-megatron",
        "deepspeed": "polyrl-engine-deepspeed",
    },
    PluginKind.ROLLOUT_ENGINE: {
        "vllm": "polyrl-rollout-vllm",
        "sglang": "polyrl-rollout-sglang",
        "hf": "polyrl-rollout-hf",
    },
    PluginKind.ADVANTAGE_ESTIMATOR: {
        "grpo": "polyrl-algo-grpo",
        "drgrpo": "polyrl-algo-grpo",
        "dr_grpo": "polyrl-algo-grpo",
        "rloo": "polyrl-algo-grpo",
        **dict.fromkeys(
            (
                "grpo_vectorized",
                "rloo_vectorized",
                "grpo_passk",
                "opo",
                "gpg",
                "gdpo",
                "optimal_token_baseline",
                "tir_optimal_token_baseline",
            ),
            "polyrl-algo-grpo",
        ),
        "gae": "polyrl-algo-ppo",
        "remax": "polyrl-algo-reinforce",
        "reinforce_plus_plus": "polyrl-algo-reinforce",
        "reinforce_plus_plus_baseline": "polyrl-algo-reinforce",
    },
    PluginKind.POLICY_LOSS: {
        "gspo": "polyrl-algo-grpo",
        "dpo": "polyrl-algo-dpo",
        "ipo": "polyrl-algo-dpo",
        **dict.fromkeys(
            (
                "gpg",
                "dro",
                "cispo",
                "dppo_tv",
                "dppo_kl",
                "sapo",
                "geo_mean",
                "clip_cov",
                "kl_cov",
                "bypass_mode",
            ),
            "polyrl-loss-zoo",
        ),
    },
    PluginKind.REWARD_PROVIDER: {"judge": "polyrl-reward-judge"},
    PluginKind.LOGGER: {
        "wandb": "polyrl-logger-wandb",
        "mlflow": "polyrl-logger-mlflow",
        "swanlab": "polyrl-logger-swanlab",
    },
    PluginKind.ALGORITHM: {
        "grpo": "polyrl-algo-grpo",
        "drgrpo": "polyrl-algo-grpo",
        "rloo": "polyrl-algo-grpo",
        "dapo": "polyrl-algo-grpo",
        "gdpo": "polyrl-algo-grpo",
        "ppo": "polyrl-algo-ppo",
        "remax": "polyrl-algo-reinforce",
        "reinforce_plus_plus": "polyrl-algo-reinforce",
        "reinforce_plus_plus_baseline": "polyrl-algo-reinforce",
        "dpo": "polyrl-algo-dpo",
        "distill": "polyrl-algo-distill",
    },
    PluginKind.DATA_SOURCE_SCORER: {"code": "polyrl-reward-code"},
    PluginKind.SCHEDULE: {
        "one_step_off": "polyrl-schedule-offpolicy",
        "k_step_off": "polyrl-schedule-offpolicy",
    },
    PluginKind.ENVIRONMENT: {
        "tools": "polyrl-env-tools",
        "tool_tiny": "polyrl-env-tools",
        "agent": "polyrl-env-agent",
        "textarena": "polyrl-env-textarena",
        "verifiers": "polyrl-env-verifiers",
    },
}

# Config groups first-party plugins declare (their ``config_sections``), with the package: an
# "unknown config key" below one of them says which package to install.
FIRST_PARTY_SECTIONS: dict[str, str] = {
    "actor_rollout_ref.actor.fsdp_config": "polyrl-engine-fsdp",
    "actor_rollout_ref.ref.fsdp_config": "polyrl-engine-fsdp",
    "critic.model.fsdp_config": "polyrl-engine-fsdp",
    "actor_rollout_ref.actor.megatron": "polyrl-engine-megatron",
    "critic": "polyrl-algo-ppo",
    "algorithm.filter_groups": "polyrl-algo-grpo",
    "reward_model.overlong_buffer": "polyrl-algo-grpo",
    "distill": "polyrl-algo-distill",
    "reward_model.judge": "polyrl-reward-judge",
}
