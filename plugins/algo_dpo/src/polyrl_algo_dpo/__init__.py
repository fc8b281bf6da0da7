"""Offline preference optimisation (DPO, IPO) as a polyrl algorithm.

The entry-point module :mod:`polyrl_algo_dpo.plugin` registers the ``dpo`` algorithm and the
``dpo`` and ``ipo`` policy losses by import string; :mod:`polyrl_algo_dpo.loss` holds the
losses, :mod:`polyrl_algo_dpo.step` the training step, :mod:`polyrl_algo_dpo.preference` the
preference files and their batches, :mod:`polyrl_algo_dpo.data` the run's data and validation,
:mod:`polyrl_algo_dpo.config` the settings and the config checks (the files' columns included).
"""

__version__ = "0.1.0"
