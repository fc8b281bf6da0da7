"""``polyrl train``: compose the config, validate it before any device is taken, train."""

from __future__ import annotations

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
    from polyrl.trainer.trainer import run

    run(cfg)
    return 0
