"""REINFORCE-family estimators (ReMax, REINFORCE++, REINFORCE++-baseline) and their algorithms.

The entry-point module :mod:`polyrl_algo_reinforce.plugin` registers them by import string;
import :mod:`polyrl_algo_reinforce.advantages` to call the estimators directly and
:mod:`polyrl_algo_reinforce.remax` for ReMax's greedy-baseline stage.
"""

__version__ = "0.1.0"
