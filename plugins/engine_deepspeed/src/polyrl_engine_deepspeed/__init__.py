"""polyrl's DeepSpeed ZeRO training engine (``actor_rollout_ref.actor.strategy=deepspeed``).

The engine class lives in :mod:`polyrl_engine_deepspeed.engine`; importing this package stays
light (no torch, no deepspeed) so that listing plugins is cheap.
"""

__version__ = "0.1.0"
