"""Environments built with PrimeIntellect's ``verifiers`` as a polyrl multi-turn environment
(see :mod:`polyrl.envs`)."""
