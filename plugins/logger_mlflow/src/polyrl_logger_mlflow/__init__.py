"""polyrl-logger-mlflow: the ``mlflow`` metrics logger for polyrl (``trainer.logger=[mlflow]``).

Importing this package is light; mlflow itself is imported only when the logger is built.
"""

__version__ = "0.1.0"
