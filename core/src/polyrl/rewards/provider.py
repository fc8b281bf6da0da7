"""The ``naive`` reward provider: one scoring function per run (the user's, else the built-in
dispatcher by ``data_source``), run by :class:`polyrl.rewards.runner.RewardRunner`."""

from __future__ import annotations

from typing import Any

from polyrl.interfaces.reward import RewardContext, RewardProvider, RewardResult, RewardSample
from polyrl.rewards._worker import ScorerRef
from polyrl.rewards.custom import load_custom_function
from polyrl.rewards.runner import RewardRunner


def _get(node: Any, key: str, default: Any) -> Any:
    """A key of a config node that may be a DictConfig, a dataclass, a dict or None."""
    if node is None:
        return default
    value = node.get(key, default) if isinstance(node, dict) else getattr(node, key, default)
    return default if value is None else value


class NaiveRewardProvider(RewardProvider):
    """Scores each sample with ``custom_reward_function`` when its ``path`` is set, else with
    :func:`polyrl.rewards.scorers.default_compute_score`.

    Config: ``reward_model.num_workers`` (0: in-process), ``.timeout_s``, ``.failure_score``,
    ``.on_error`` (``score`` | ``raise``). The worker pool starts here and lives until
    :meth:`close`.
    """

    def __init__(self, ctx: RewardContext) -> None:
        super().__init__(ctx)
        path = _get(ctx.custom_reward_function, "path", None)
        name = str(_get(ctx.custom_reward_function, "name", "compute_score"))
        if path:
            # Load once here so that a wrong path or name fails now, with a clear message,
            # rather than inside every worker.
            load_custom_function(path, name)
        scorer = ScorerRef(path=str(path) if path else None, name=name)
        rm = ctx.reward_model
        self.runner = RewardRunner(
            scorer,
            num_workers=int(_get(rm, "num_workers", 2)),
            timeout_s=float(_get(rm, "timeout_s", 10.0)),
            failure_score=float(_get(rm, "failure_score", 0.0)),
            on_error=str(_get(rm, "on_error", "score")),
        )

    def score(self, samples: list[RewardSample]) -> list[RewardResult]:
        return self.runner.score(samples)

    def close(self) -> None:
        self.runner.close()
