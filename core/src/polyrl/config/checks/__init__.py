"""The checks behind :func:`polyrl.config.validate.validate_config`, one module per concern.

- :mod:`.checker`: the :class:`Checker` that collects problem lines, and safe accessors;
- :mod:`.plugins`: plugin selection, locatability, device capabilities, ``plugins.<name>``
  sections, and each selected plugin's own ``config_check``;
- :mod:`.model`, :mod:`.data`: the model and the data files;
- :mod:`.ranges`: types, ranges and choices of single keys;
- :mod:`.batches`: batch arithmetic against the world size;
- :mod:`.pipeline`: the selected algorithm and its step's data chain;
- :mod:`.placement`: roles to resource pools;
- :mod:`.lora`: LoRA's keys, the engine's ``supports_lora``, the reference in the actor's pool;
- :mod:`.off_policy`: ``trainer.async_mode`` and the truncated importance-sampling cap.

Nothing here imports torch or a backend at import time. Plugins use :func:`role_world` in their
own checks (the data-parallel size a role runs on).
"""

from polyrl.config.checks.placement import GLOBAL_POOL, pool_of, role_world

__all__ = ["GLOBAL_POOL", "pool_of", "role_world"]
