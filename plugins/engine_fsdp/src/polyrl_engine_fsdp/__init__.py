"""polyrl's FSDP2 training engine (``actor_rollout_ref.actor.strategy=fsdp2`` or ``fsdp``).

The engine class lives in :mod:`polyrl_engine_fsdp.engine`; importing this package stays light
(no torch) so that listing plugins is cheap. What the three engines share moved to
``polyrl_engine_kit``; the old module paths below still import, with a deprecation warning.
"""

from polyrl_engine_kit.moved import redirect_modules

__version__ = "0.1.0"

MOVED_TO_ENGINE_KIT = (
    "compiling",
    "config",
    "errors",
    "fast_paths",
    "fused_logprob",
    "launch",
    "liger",
    "logprob",
    "microbatch",
    "packed_attention",
    "packed_scoring",
    "packing",
    "runtime",
    "schedule",
    "scoring",
    "testing",
    "training",
)
redirect_modules(__name__, "polyrl_engine_kit", MOVED_TO_ENGINE_KIT)
