"""polyrl's vLLM rollout engine (``actor_rollout_ref.rollout.name=vllm``).

Importing this package is light: vLLM is imported only by :mod:`polyrl_rollout_vllm.engine`.
"""

__version__ = "0.1.0"
