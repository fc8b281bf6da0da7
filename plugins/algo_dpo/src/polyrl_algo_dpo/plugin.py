"""Entry point of polyrl-algo-dpo. Light on purpose: no torch import here; the registry resolves
the import strings only when a name is selected."""

from __future__ import annotations

from collections.abc import Iterator

from polyrl.api import AlgorithmSpec, PolicyLossSpec, hookimpl
from polyrl_algo_dpo.config import CONFIG_DEFAULTS

_PKG = "polyrl_algo_dpo"
_LOSS_KEYS = ("ref_log_prob", "response_mask")


@hookimpl
def polyrl_algorithms() -> Iterator[AlgorithmSpec]:
    yield AlgorithmSpec(
        name="dpo",
        description="Offline DPO/IPO on preference pairs (prompt, chosen, rejected): the "
        "reference's log-probs from the ref role, one actor update per batch of pairs",
        pipeline=f"{_PKG}.step:dpo_pipeline",
        roles=("actor", "ref"),
        data=f"{_PKG}.data:preference_data",
        config_defaults=CONFIG_DEFAULTS,
        config_class=f"{_PKG}.config:DPOSettings",
        config_check=f"{_PKG}.config:check_config",
    )


@hookimpl
def polyrl_policy_losses() -> Iterator[PolicyLossSpec]:
    yield PolicyLossSpec(
        name="dpo",
        description="DPO (TRL's loss_type=sigmoid): -log sigmoid(beta x log-ratio margin) per "
        "pair of rows (chosen, rejected); plugins.dpo.beta",
        fn=f"{_PKG}.loss:dpo_loss",
        requires=_LOSS_KEYS,
        level="sequence",
    )
    yield PolicyLossSpec(
        name="ipo",
        description="IPO (TRL's loss_type=ipo): (log-ratio margin of token-mean log-probs - "
        "1/(2 beta))^2 per pair of rows; plugins.dpo.beta",
        fn=f"{_PKG}.loss:ipo_loss",
        requires=_LOSS_KEYS,
        level="sequence",
    )
