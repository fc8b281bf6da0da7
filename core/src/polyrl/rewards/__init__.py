"""Verifiable rewards: built-in scorers by ``data_source``, a user's function from a file, and a
runner that scores in worker processes with a per-sample timeout.

Importing this package is cheap (no torch, no math_verify, no reasoning_gym).
"""

from polyrl.rewards.custom import load_custom_function, normalise_score
from polyrl.rewards.runner import RewardRunner
from polyrl.rewards.scorers import default_compute_score, supported_data_sources

__all__ = [
    "RewardRunner",
    "default_compute_score",
    "load_custom_function",
    "normalise_score",
    "supported_data_sources",
]
