"""Prompt data: verl-format parquet datasets, batching with exact resume, built-in dataset
generators (reasoning-gym, the tiny synthetic task) and the ``polyrl data`` command.

Importing this package is cheap; torch, pyarrow and reasoning_gym load where they are used.
"""
