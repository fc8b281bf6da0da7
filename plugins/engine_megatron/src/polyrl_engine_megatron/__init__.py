"""polyrl's megatron-core training engine (``actor_rollout_ref.actor.strategy=megatron``).

The engine class lives in :mod:`polyrl_engine_megatron.engine`; importing this package stays
light (no torch, no megatron) so that listing plugins is cheap. CUDA only: megatron-core's
forward pass needs a GPU.
"""

__version__ = "0.1.0"
