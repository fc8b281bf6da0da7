"""polyrl's policy-loss conformance suite on every loss of polyrl-loss-zoo, called with the actor
node of a composed config (this package's sections mounted)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, ClassVar

from zoo_inputs import actor_node

from polyrl.api.testing import PolicyLossConformance
from polyrl_loss_zoo.settings import RolloutCorrectionSettings


class _ZooConformance(PolicyLossConformance):
    settings: ClassVar[dict[str, Any]] = {}

    def loss_config(self) -> Any:
        return actor_node(**self.settings, **self.config_overrides)


class TestGpgConformance(_ZooConformance):
    plugin_name = "gpg"


class TestDroConformance(_ZooConformance):
    plugin_name = "dro"
    settings = {"policy_loss": {"dro_beta": 0.1}}


class TestCispoConformance(_ZooConformance):
    plugin_name = "cispo"


class TestDppoTvConformance(_ZooConformance):
    plugin_name = "dppo_tv"


class TestDppoKlConformance(_ZooConformance):
    plugin_name = "dppo_kl"


class TestClipCovConformance(_ZooConformance):
    plugin_name = "clip_cov"
    settings = {"policy_loss": {"clip_cov_ratio": 0.2, "clip_cov_lb": -5.0}}


class TestKlCovConformance(_ZooConformance):
    plugin_name = "kl_cov"
    settings = {"policy_loss": {"kl_cov_ratio": 0.2}}


# The suite's gradient-sign check sums a per-token matrix; the sequence-level losses check their
# on-policy gradient in test_loss_zoo_formulas instead.
class TestSapoConformance(_ZooConformance):
    plugin_name = "sapo"
    check_gradient_sign = False


class TestGeoMeanConformance(_ZooConformance):
    plugin_name = "geo_mean"
    check_gradient_sign = False


def _correction(**settings: Any) -> dict[str, Any]:
    """``policy_loss.rollout_correction`` in whole (the node's own values follow
    ``algorithm.rollout_correction``, which a bare actor node lacks)."""
    return {
        "policy_loss": {
            "rollout_correction": {
                **asdict(RolloutCorrectionSettings()),
                "bypass_mode": True,
                **settings,
            }
        }
    }


class TestBypassPpoClipConformance(_ZooConformance):
    plugin_name = "bypass_mode"
    settings = _correction(
        rollout_is="token", rollout_rs="token_k1,seq_max_k2", rollout_rs_threshold="0.6_1.6,2.5"
    )


class TestBypassReinforceConformance(_ZooConformance):
    plugin_name = "bypass_mode"
    settings = _correction(
        rollout_is="sequence", rollout_is_batch_normalize=True, loss_type="reinforce"
    )
