"""On-policy distillation (``algorithm.name=distill``) as a polyrl algorithm plugin.

The student (the actor) samples; a frozen teacher scores the student's own tokens; the
per-token reverse KL ``log p_student - log p_teacher`` becomes the student's advantage. The
entry point (:mod:`polyrl_algo_distill.plugin`) is light; the stages, the teacher role and the
math are named by import string and loaded only when the algorithm is selected.
"""

__version__ = "0.1.0"
