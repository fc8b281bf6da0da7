"""polyrl's transformers rollout engine (``actor_rollout_ref.rollout.name=hf``).

The engine class lives in :mod:`polyrl_rollout_hf.engine`; importing this package stays light.
"""

__version__ = "0.1.0"
