"""verl's optimal token baselines (``optimal_token_baseline``, ``tir_optimal_token_baseline``),
refused: their per-token baseline weighs each trajectory by its cumulative path variance
``sum_j (1 - 2 pi_j + sum_v pi_v^2)``, which needs ``sum_pi_squared`` (the sum over the
vocabulary of the squared token probabilities at every response position, verl's
``actor.calculate_sum_pi_squared``). polyrl's actor returns log-probs of the sampled tokens only,
so the batch lacks that input; selecting either is one line instead of a baseline of another
meaning."""

from __future__ import annotations

from typing import Any

from polyrl.api import ConfigError


def refusal(name: str) -> str:
    return (
        f"algorithm.adv_estimator={name} needs sum_pi_squared (the vocabulary sum of squared "
        f"probabilities per response token, verl's actor.calculate_sum_pi_squared), which "
        f"polyrl's actor does not compute; use grpo, rloo or opo for a group baseline"
    )


def check_otb_config(cfg: Any) -> list[str]:
    return [refusal(str(cfg.algorithm.adv_estimator))]


def optimal_token_baseline_advantage(batch: Any, config: Any) -> Any:
    raise ConfigError(refusal(str(config.adv_estimator)))
