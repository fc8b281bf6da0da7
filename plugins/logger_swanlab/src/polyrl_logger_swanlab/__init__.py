"""polyrl-logger-swanlab: the ``swanlab`` metrics logger for polyrl
(``trainer.logger=[swanlab]``). Importing this package is light; swanlab itself is imported only
when the logger is built."""

__version__ = "0.1.0"
