"""PPO's config sections at verl's places: the ``critic`` group and ``trainer.critic_warmup``
(mounted into the schema by :mod:`polyrl.config.sections`). Light on purpose (no torch): every
composed config imports it. Unset batch keys of the critic follow the actor's, as in verl."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from polyrl.api import OptimConfig

ACTOR = "actor_rollout_ref.actor"


@dataclass
class CriticModelSettings:
    """The critic's value model: a fresh one-scalar head on a causal-LM backbone.
    ``path`` null: the actor's model (``actor_rollout_ref.model.path``), else any form that key
    accepts. ``use_remove_padding``: the critic's micro-batches packed too."""

    path: Any = None
    enable_gradient_checkpointing: bool = "${actor_rollout_ref.model.enable_gradient_checkpointing}"  # type: ignore[assignment]
    use_remove_padding: bool = True


def _critic_optim() -> OptimConfig:
    """verl's critic learning rate; the clip follows critic.grad_clip, verl's key for it."""
    return OptimConfig(lr=1e-5, clip_grad="${critic.grad_clip}")  # type: ignore[arg-type]


@dataclass
class CriticSettings:
    """PPO's value model, with verl's keys and defaults.

    ``enable`` null: on exactly when the selected algorithm trains a critic
    (``adv_estimator=gae``), as in verl; true is refused when it does not, false when it does.
    ``strategy``: a training engine with a value head. ``cliprange_value``: new values stay
    within this distance of the old ones.
    """

    enable: Any = None
    strategy: str = f"${{{ACTOR}.strategy}}"
    ppo_mini_batch_size: int = f"${{{ACTOR}.ppo_mini_batch_size}}"  # type: ignore[assignment]
    ppo_micro_batch_size_per_gpu: int = f"${{{ACTOR}.ppo_micro_batch_size_per_gpu}}"  # type: ignore[assignment]
    forward_micro_batch_size_per_gpu: int = "${critic.ppo_micro_batch_size_per_gpu}"  # type: ignore[assignment]
    use_dynamic_bsz: bool = f"${{{ACTOR}.use_dynamic_bsz}}"  # type: ignore[assignment]
    ppo_max_token_len_per_gpu: int = f"${{{ACTOR}.ppo_max_token_len_per_gpu}}"  # type: ignore[assignment]
    forward_max_token_len_per_gpu: int = "${critic.ppo_max_token_len_per_gpu}"  # type: ignore[assignment]
    ppo_epochs: int = f"${{{ACTOR}.ppo_epochs}}"  # type: ignore[assignment]
    shuffle: bool = f"${{{ACTOR}.shuffle}}"  # type: ignore[assignment]
    cliprange_value: float = 0.5
    loss_agg_mode: str = f"${{{ACTOR}.loss_agg_mode}}"  # type: ignore[assignment]
    grad_clip: float = 1.0
    optim: OptimConfig = field(default_factory=_critic_optim)
    model: CriticModelSettings = field(default_factory=CriticModelSettings)


@dataclass
class CriticWarmupSettings:
    """``trainer.critic_warmup``: the actor (and the rollout's weights) update from this step
    on, so the steps before train only the critic (verl's rule; 0 and 1: no warm-up)."""

    critic_warmup: int = 0


REWEIGHT_METHODS = ("pow", "max_min", "max_random")


@dataclass
class PfPpoSettings:
    """verl's PF-PPO reweighting (:mod:`polyrl_algo_ppo.pf_ppo`): ``reweight_method`` pow,
    max_min or max_random; ``weight_pow``: the power of ``pow``."""

    reweight_method: str = "pow"
    weight_pow: float = 2.0


@dataclass
class PfPpoSwitch:
    """``algorithm.use_pf_ppo``: resample the batch by its scores after the advantages."""

    use_pf_ppo: bool = False
    pf_ppo: PfPpoSettings = field(default_factory=PfPpoSettings)


CONFIG_SECTIONS = {
    "critic": CriticSettings,
    "trainer": CriticWarmupSettings,
    "algorithm": PfPpoSwitch,
}
