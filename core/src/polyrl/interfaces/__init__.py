"""The abstract interfaces plugins implement, and the call signatures of estimators and losses.

Nothing here imports torch at module level: these names are importable in a process that only
lists plugins.
"""

from polyrl.interfaces.algorithms import AdvantageEstimatorFn, PolicyLossFn
from polyrl.interfaces.logger import LoggerContext, MetricsLogger
from polyrl.interfaces.reward import RewardContext, RewardProvider, RewardResult, RewardSample
from polyrl.interfaces.rollout_engine import RolloutContext, RolloutEngine, SamplingParams
from polyrl.interfaces.training_engine import EngineContext, MicroBatchLossFn, TrainingEngine

__all__ = [
    "AdvantageEstimatorFn",
    "EngineContext",
    "LoggerContext",
    "MetricsLogger",
    "MicroBatchLossFn",
    "PolicyLossFn",
    "RewardContext",
    "RewardProvider",
    "RewardResult",
    "RewardSample",
    "RolloutContext",
    "RolloutEngine",
    "SamplingParams",
    "TrainingEngine",
]
