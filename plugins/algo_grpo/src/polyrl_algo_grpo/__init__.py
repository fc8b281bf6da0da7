"""Group-relative advantage estimators (GRPO, Dr.GRPO, RLOO) and the GSPO policy loss.

The entry-point module :mod:`polyrl_algo_grpo.plugin` registers them by import string; import
:mod:`polyrl_algo_grpo.advantages` or :mod:`polyrl_algo_grpo.gspo` to call them directly.
"""

__version__ = "0.1.0"
