"""verl's ``batch`` reward manager (``reward_model.reward_manager=batch``): the user's
``custom_reward_function`` scores the whole batch in one call, with lists, as verl's
``BatchRewardManager`` calls it::

    compute_score(data_sources=[...], solution_strs=[...], ground_truths=[...],
                  extra_infos=[...], **reward_model.reward_kwargs)

and returns one score per sample, each a number or a dict holding ``score`` (its other numeric
keys are logged as extras). For functions that batch their work (a model or a service called
once per step). The call runs in the driver process: one call scores the batch, so there is no
per-sample timeout; a failing call gives every sample ``reward_model.failure_score`` (or raises,
with ``reward_model.on_error=raise``).
"""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

from polyrl.config.nodes import schema_node
from polyrl.errors import ConfigError
from polyrl.interfaces.reward import RewardContext, RewardProvider, RewardResult, RewardSample
from polyrl.rewards._worker import describe_exception
from polyrl.rewards.custom import check_custom_function, load_custom_function, normalise_score


class BatchRewardProvider(RewardProvider):
    """``custom_reward_function`` called once per batch (verl's ``BatchRewardManager``)."""

    def __init__(self, ctx: RewardContext) -> None:
        super().__init__(ctx)
        custom: Any = schema_node(ctx.custom_reward_function, "custom_reward_function")
        rm: Any = schema_node(ctx.reward_model, "reward_model")
        if not custom.path:
            raise ConfigError(
                "reward_model.reward_manager=batch calls custom_reward_function once per batch, "
                "with lists (verl's BatchRewardManager); set custom_reward_function.path to a "
                "file whose compute_score takes data_sources, solution_strs, ground_truths and "
                "extra_infos, or use reward_model.reward_manager=naive"
            )
        check_custom_function(custom.path, str(custom.name), float(custom.load_timeout_s))
        self.fn = load_custom_function(custom.path, str(custom.name))
        kwargs = OmegaConf.select(rm, "reward_kwargs", default=None)
        self.kwargs = dict(OmegaConf.to_container(kwargs, resolve=True)) if kwargs else {}
        self.failure_score = float(rm.failure_score)
        self.raise_errors = str(rm.on_error) == "raise"

    def score(self, samples: list[RewardSample]) -> list[RewardResult]:
        try:
            scores = list(
                self.fn(
                    data_sources=[s.data_source for s in samples],
                    solution_strs=[s.solution_str for s in samples],
                    ground_truths=[s.ground_truth for s in samples],
                    extra_infos=[s.extra_info for s in samples],
                    **self.kwargs,
                )
            )
            if len(scores) != len(samples):
                raise ValueError(
                    f"the batch reward function returned {len(scores)} scores for "
                    f"{len(samples)} samples"
                )
            return [RewardResult(*normalise_score(score)) for score in scores]
        except Exception as exc:
            if self.raise_errors:
                raise
            error = describe_exception(exc)
            return [RewardResult(self.failure_score, error=error) for _ in samples]
