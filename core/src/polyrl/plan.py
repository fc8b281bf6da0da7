"""The run plan: every plugin a config selects, chosen once, and the step built from them.

:func:`assemble` is the one place that asks the registry which plugins a run uses. It selects
the algorithm (``algorithm.name``, or the algorithm that owns ``algorithm.adv_estimator``), one
plugin per kind from its config key (:attr:`polyrl.specs.PluginKind.config_key`), the plugins an
algorithm's roles build from further keys (:attr:`polyrl.specs.AlgorithmSpec.plugin_keys`, e.g.
the critic's ``critic.strategy``), builds the algorithm's step, binds its stages to the selected
plugins (:meth:`polyrl.step.Stage.bind`), checks the key chain and plans the worker pools.

``polyrl validate`` prints the plan (:meth:`RunPlan.describe`) and ``polyrl train`` runs it.
Workers receive :class:`WorkerPlan`, the selected registrations themselves (pickled with the
rest of their arguments), and never consult a registry: a plugin registered in-process with
:func:`polyrl.register` reaches every worker, on Ray or in the local worker group.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from polyrl.errors import ConfigError, PolyrlError
from polyrl.registry import Registration, Registry, get_registry
from polyrl.specs import PluginKind
from polyrl.step.pipeline import StepPipeline
from polyrl.workers.worker_plan import WorkerPlan

FALLBACK_ALGORITHM = "policy_gradient"

# Kinds selected by one name each (the logger key takes a list).
SINGLE_KINDS = (
    PluginKind.TRAINING_ENGINE,
    PluginKind.ROLLOUT_ENGINE,
    PluginKind.ADVANTAGE_ESTIMATOR,
    PluginKind.POLICY_LOSS,
    PluginKind.REWARD_PROVIDER,
    PluginKind.SCHEDULE,
)


def select_algorithm(
    name: str | None, adv_estimator: str, registry: Registry | None = None
) -> Registration:
    """The algorithm registration for ``algorithm.name`` / ``algorithm.adv_estimator``.

    An estimator that no algorithm claims (an estimator-only plugin) runs the built-in
    ``policy_gradient`` step."""
    registry = registry or get_registry()
    if name:
        return registry.get(PluginKind.ALGORITHM, name)
    owners = [r for r in registry.all(PluginKind.ALGORITHM) if adv_estimator in r.spec.estimators]
    if len(owners) > 1:
        listed = ", ".join(f"{r.name} ({r.provenance.distribution})" for r in owners)
        raise ConfigError(
            f"algorithm.adv_estimator={adv_estimator!r} is claimed by several algorithms: "
            f"{listed}; choose one with algorithm.name=<name>"
        )
    if owners:
        return registry.get(PluginKind.ALGORITHM, owners[0].name)  # judged like a named one
    return registry.get(PluginKind.ALGORITHM, FALLBACK_ALGORITHM)


def _select_algorithm_of(cfg: Any, registry: Registry) -> Registration:
    name = cfg.algorithm.name
    return select_algorithm(name if name else None, str(cfg.algorithm.adv_estimator), registry)


def _build_pipeline(cfg: Any, algorithm: Registration) -> StepPipeline:
    pipeline = algorithm.load()(cfg)
    where = f"algorithm {algorithm.name!r} (package {algorithm.provenance.distribution})"
    if not isinstance(pipeline, StepPipeline):
        raise ConfigError(
            f"{where} returned {type(pipeline).__name__} from its pipeline function, not a "
            f"StepPipeline"
        )
    undeclared = [r for r in pipeline.roles() if r not in algorithm.spec.roles]
    if undeclared:
        raise ConfigError(
            f"{where} has stages that use the role(s) {undeclared}, which its "
            f"AlgorithmSpec.roles {list(algorithm.spec.roles)} does not declare; report it "
            f"upstream"
        )
    return pipeline


def _edit_step(cfg: Any, pipeline: StepPipeline, registry: Registry) -> None:
    """Every installed plugin's ``edit_step`` (:class:`polyrl.specs._Spec`) on the step: a
    feature a plugin's keys turn on for whatever algorithm is selected."""
    from polyrl.specs import resolve_object

    for reg in registry.all():
        edit = getattr(reg.spec, "edit_step", None)
        if edit is None:
            continue
        try:
            resolve_object(edit)(cfg, pipeline)
        except PolyrlError:
            raise
        except Exception as exc:  # a plugin bug, named with its package
            raise PolyrlError(
                f"the plugin {reg.name!r} ({reg.provenance.distribution}) failed to edit the "
                f"step ({type(exc).__name__}: {exc}); report it to {reg.provenance.distribution}"
            ) from exc


def build_pipeline(cfg: Any, registry: Registry | None = None) -> StepPipeline:
    """The step of the algorithm ``cfg`` selects, its stages bound to the selected plugins (the
    pipeline of :func:`assemble`, without the chain check and the pools)."""
    return assemble(cfg, registry, check=False).pipeline


@dataclass
class RunPlan:
    """Everything :func:`assemble` decided for one run.

    ``plugins`` maps each config key to the registration it selects (loggers as
    ``trainer.logger[i]``); ``algorithm`` is the selected algorithm; ``pipeline`` the bound step;
    ``pools`` maps each pool to its size and roles (None when the config's placement is invalid:
    :attr:`problems` says why); ``problems`` are the chain check's lines.
    """

    cfg: Any
    algorithm: Registration
    plugins: dict[str, Registration]
    pipeline: StepPipeline
    pools: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)

    def selected(self, kind: PluginKind) -> Registration:
        """The registration of the single plugin of ``kind`` (not the loggers)."""
        if kind is PluginKind.ALGORITHM:
            return self.algorithm
        return self.plugins[kind.config_key]

    @property
    def training_engine(self) -> Registration:
        return self.selected(PluginKind.TRAINING_ENGINE)

    @property
    def rollout_engine(self) -> Registration:
        return self.selected(PluginKind.ROLLOUT_ENGINE)

    @property
    def estimator(self) -> Registration:
        return self.selected(PluginKind.ADVANTAGE_ESTIMATOR)

    @property
    def policy_loss(self) -> Registration:
        return self.selected(PluginKind.POLICY_LOSS)

    @property
    def reward_provider(self) -> Registration:
        return self.selected(PluginKind.REWARD_PROVIDER)

    @property
    def schedule(self) -> Registration:
        return self.selected(PluginKind.SCHEDULE)

    @property
    def environment(self) -> Registration:
        """The multi-turn environment (only when ``multi_turn.enable`` is true)."""
        return self.selected(PluginKind.ENVIRONMENT)

    @property
    def loggers(self) -> list[Registration]:
        prefix = PluginKind.LOGGER.config_key + "["
        return [reg for key, reg in self.plugins.items() if key.startswith(prefix)]

    def reward_roles(self) -> dict[str, Any]:
        """The worker roles the reward provider scores through (``RewardProviderSpec.roles``)."""
        provider = self.plugins.get(PluginKind.REWARD_PROVIDER.config_key)
        return provider.spec.worker_roles(self.cfg) if provider is not None else {}

    def worker_plan(self) -> WorkerPlan:
        registrations = {(reg.kind, reg.name): reg for reg in self.plugins.values()}
        role_classes = {**self.algorithm.spec.role_classes, **self.reward_roles()}
        return WorkerPlan(registrations, role_classes)

    def describe(self) -> str:
        """The whole plan: plugins, stages, pools."""
        stages = ["stages:", *self.pipeline.describe().splitlines()]
        return "\n".join([*self.describe_plugins(), *stages, *self.describe_pools()])

    def describe_plugins(self) -> list[str]:
        """Lines ``polyrl validate`` prints: every selected plugin with its config key, package
        and version, and its resolved settings."""
        entries = [("algorithm", self.algorithm), *self.plugins.items()]
        width = max(len(key) for key, _ in entries)
        lines = ["plugins:"]
        for key, reg in entries:
            origin = f"{reg.provenance.distribution} {reg.provenance.version}"
            lines.append(f"  {key:<{width}}  {reg.name} ({origin})")
            lines += [f"  {'':<{width}}    {line}" for line in _settings_lines(self.cfg, reg)]
        return lines

    def describe_pools(self) -> list[str]:
        """One line per worker pool: its size and the roles each of its workers hosts."""
        if not self.pools:
            return []
        return [
            "pools:",
            *(
                f"  {pool}: {size} worker(s), each hosting {', '.join(roles)}"
                for pool, (size, roles) in self.pools.items()
            ),
        ]


def _settings_lines(cfg: Any, reg: Registration) -> list[str]:
    """``plugins.<name>``'s resolved settings when the plugin declares a config class."""
    config_class = getattr(reg.spec, "config_class", None)
    if config_class is None:
        return []
    from dataclasses import asdict

    from polyrl.config.keys import plugin_settings
    from polyrl.specs import resolve_object

    try:
        settings = asdict(plugin_settings(cfg, reg.name, resolve_object(config_class)))
    except Exception as exc:  # noqa: BLE001 - the validator reports it as a problem line
        return [f"settings: unavailable ({type(exc).__name__}: {exc})"]
    return [f"plugins.{reg.name}.{key} = {value!r}" for key, value in settings.items()]


def _plugin_names(value: Any) -> list[str]:
    if value is None or value == "":
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


def select_plugins(
    cfg: Any,
    registry: Registry,
    algorithm: Registration | None,
    kinds: tuple[PluginKind, ...] = (*SINGLE_KINDS, PluginKind.LOGGER),
) -> dict[str, Registration]:
    """The registration each config key of ``kinds`` (and each of ``algorithm``'s
    ``plugin_keys``) selects, by config key; loggers as ``trainer.logger[i]``. A kind of
    :attr:`~polyrl.specs.PluginKind.flag` is selected when its flag is true."""
    from omegaconf import OmegaConf

    plugins: dict[str, Registration] = {}
    flagged = [k for k in PluginKind if k.flag and OmegaConf.select(cfg, k.flag)]
    for kind in (*kinds, *flagged):
        value = OmegaConf.select(cfg, kind.config_key)
        if kind is PluginKind.LOGGER:
            for i, name in enumerate(_plugin_names(value)):
                plugins[f"{kind.config_key}[{i}]"] = registry.get(kind, name)
        else:
            plugins[kind.config_key] = registry.get(kind, str(value))
    plugin_keys = dict(getattr(algorithm.spec, "plugin_keys", {}) if algorithm else {})
    provider = plugins.get(PluginKind.REWARD_PROVIDER.config_key)
    plugin_keys.update(getattr(provider.spec, "plugin_keys", {}) if provider else {})
    for key, kind in plugin_keys.items():
        name = OmegaConf.select(cfg, key)
        if name:
            plugins[key] = registry.get(PluginKind(kind), str(name))
    return plugins


def assemble(cfg: Any, registry: Registry | None = None, *, check: bool = True) -> RunPlan:
    """Select every plugin ``cfg`` names, build and bind the step, check it, plan the pools.

    Raises :class:`~polyrl.errors.PolyrlError` (unknown or conflicting names, a pipeline that
    cannot be built). With ``check`` the chain check's problems and a placement error are
    recorded in :attr:`RunPlan.problems` (``polyrl validate`` prints them; the trainer refuses
    to start with any).
    """
    registry = registry or get_registry()
    algorithm = _select_algorithm_of(cfg, registry)
    plugins = select_plugins(cfg, registry, algorithm)
    pipeline = _build_pipeline(cfg, algorithm)
    _edit_step(cfg, pipeline, registry)
    plan = RunPlan(cfg=cfg, algorithm=algorithm, plugins=plugins, pipeline=pipeline)
    pipeline.bind(plan)
    pipeline.add_roles(plan.reward_roles())
    if not check:
        return plan
    plan.problems = [
        f"algorithm {algorithm.name!r} (package {algorithm.provenance.distribution}): {line}"
        for line in pipeline.check()
    ]
    from polyrl.workers.placement import plan_pools

    try:
        plan.pools = dict(plan_pools(cfg, pipeline.roles()))
    except PolyrlError as exc:
        plan.problems.append(str(exc))
    return plan
