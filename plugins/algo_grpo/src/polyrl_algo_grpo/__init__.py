"""Group-relative advantage estimators (GRPO, Dr.GRPO, RLOO), the GSPO policy loss, and DAPO.

The entry-point module :mod:`polyrl_algo_grpo.plugin` registers them by import string; import
:mod:`polyrl_algo_grpo.advantages` or :mod:`polyrl_algo_grpo.gspo` to call them directly, and
:mod:`polyrl_algo_grpo.dapo` for DAPO's step (dynamic sampling, overlong punishment).
"""

__version__ = "0.1.0"
