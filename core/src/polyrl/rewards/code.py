"""Moved: the code-execution reward (``code_score``, ``CodeRewardSettings``, ``extract_code``,
``load_cases`` ...) is the plugin package ``polyrl-reward-code``'s,
:mod:`polyrl_reward_code.scorer`. Names imported from here still resolve, with a
:class:`DeprecationWarning`, while that package is installed."""

from polyrl._moved import moved_to

__getattr__ = moved_to(__name__, "polyrl_reward_code.scorer", "polyrl-reward-code")
