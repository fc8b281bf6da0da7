"""polyrl's built-in metrics loggers (console, jsonl, tensorboard) and :class:`LoggerGroup`,
which the trainer uses to drive every logger selected by ``trainer.logger``.

Light on purpose: importing this package imports neither torch nor tqdm; each logger's module
imports what it needs when the registry loads it.
"""

from polyrl.loggers.multi import LoggerGroup

__all__ = ["LoggerGroup"]
