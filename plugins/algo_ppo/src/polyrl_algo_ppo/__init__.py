"""PPO with a critic (``algorithm.adv_estimator=gae``) as a polyrl algorithm plugin.

The entry point (:mod:`polyrl_algo_ppo.plugin`) is light; the step, the critic role and the math
are named by import string and loaded only when PPO is selected.
"""

__version__ = "0.1.0"
