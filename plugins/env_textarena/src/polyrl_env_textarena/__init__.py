"""TextArena games as a multi-turn environment for polyrl's rollouts (see :mod:`polyrl.envs`)."""
