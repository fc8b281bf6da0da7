"""polyrl-logger-wandb: the ``wandb`` metrics logger for polyrl (``trainer.logger=[wandb]``).

Importing this package is light; ``wandb`` itself is imported only when the logger is built.
"""

__version__ = "0.1.0"
