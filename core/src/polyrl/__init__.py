"""polyrl: RL post-training for LLMs, built from plugins.

Importing this package is cheap (no torch): plugin entry-point modules import ``hookimpl`` from
here.
"""

from polyrl.hookspecs import hookimpl

__version__ = "0.1.0"

__all__ = ["__version__", "hookimpl"]
