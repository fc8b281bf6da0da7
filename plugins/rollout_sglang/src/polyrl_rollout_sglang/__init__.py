"""polyrl's SGLang rollout engine (``actor_rollout_ref.rollout.name=sglang``).

Importing this package is light: SGLang is imported only by :mod:`polyrl_rollout_sglang.engine`.
"""

__version__ = "0.1.0"
