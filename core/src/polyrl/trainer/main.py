"""``polyrl train``: compose the config, validate it before any device is taken, train."""

from __future__ import annotations

import os
import sys

from polyrl.config import load_config
from polyrl.config.validate import validate_config


def train_from_overrides(overrides: list[str]) -> int:
    """Exit code 0 after a complete run, 1 when the config is invalid."""
    cfg = load_config(overrides)
    problems = validate_config(cfg)
    if problems:
        print("polyrl: the config is invalid:", file=sys.stderr)
        for problem in problems:
            print(f"  - {problem}", file=sys.stderr)
        return 1
    if str(cfg.trainer.device) == "cpu":
        # DeepSpeed, imported by accelerate whenever a model is saved (the GGUF conversion, the
        # export), warns that it found no GPU unless it is told its accelerator.
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from polyrl.trainer.trainer import run

    run(cfg)
    return 0
