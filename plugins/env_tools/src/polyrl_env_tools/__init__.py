"""Tool-using environments for polyrl's multi-turn rollouts (see :mod:`polyrl.envs`)."""
