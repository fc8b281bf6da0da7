"""polyrl's FSDP2 training engine (``actor_rollout_ref.actor.strategy=fsdp2`` or ``fsdp``).

The engine class lives in :mod:`polyrl_engine_fsdp.engine`; importing this package stays light
(no torch) so that listing plugins is cheap.
"""

__version__ = "0.1.0"
