"""``polyrl data``: write verl-format train/val parquet files offline.

    polyrl data reasoning-gym --task chain_sum --task-config '{"max_terms": 2}' \\
        --train-size 512 --val-size 64 --seed 1 --out data/chain_sum
    polyrl data tiny --out data/tiny
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from polyrl.errors import DataError


def add_subcommand(subparsers: argparse._SubParsersAction) -> None:
    """Add ``polyrl data`` and its sub-commands to the CLI's subparsers."""
    data = subparsers.add_parser(
        "data",
        help="write train/val parquet files (reasoning-gym tasks, the tiny synthetic task)",
        description="Write verl-format train.parquet and val.parquet files, offline.",
    )
    kinds = data.add_subparsers(dest="data_command", metavar="KIND", required=True)

    rg = kinds.add_parser(
        "reasoning-gym",
        help="problems of a reasoning-gym task with its verifiable scorer",
        description="Problems of a reasoning-gym task. Rows get data_source "
        "reasoning_gym/<task>; the reward uses the task's own scorer. Needs the reasoning-gym "
        "extra: pip install 'polyrl[reasoning-gym]'.",
    )
    rg.add_argument("--task", required=True, help="task name, e.g. chain_sum, basic_arithmetic")
    rg.add_argument(
        "--task-config",
        default="{}",
        help='JSON object of the task\'s settings, e.g. \'{"min_terms": 2, "max_terms": 2}\'',
    )
    rg.add_argument("--train-size", type=int, default=512)
    rg.add_argument("--val-size", type=int, default=64)
    rg.add_argument("--seed", type=int, default=1)
    rg.add_argument(
        "--prompt-style",
        default="fewshot",
        choices=["fewshot", "system", "plain"],
        help="fewshot: one solved example turn + answer-tag instruction (default); system: the "
        "instruction only; plain: the question only",
    )
    rg.add_argument(
        "--num-examples", type=int, default=2, help="solved examples in fewshot prompts"
    )
    rg.add_argument("--out", required=True, type=Path, help="output folder")
    rg.set_defaults(func=_reasoning_gym)

    tiny = kinds.add_parser(
        "tiny",
        help="the tiny synthetic task (polyrl/tiny_digits) of recipe=tiny",
        description="Prompts naming a digit; reward = share of response characters that are "
        "that digit (1.0) or another digit (0.5).",
    )
    tiny.add_argument("--train-size", type=int, default=256)
    tiny.add_argument("--val-size", type=int, default=32)
    tiny.add_argument("--seed", type=int, default=1)
    tiny.add_argument("--out", required=True, type=Path, help="output folder")
    tiny.set_defaults(func=_tiny)


def _reasoning_gym(args: argparse.Namespace) -> int:
    from polyrl.data.generate import write_reasoning_gym

    try:
        config = json.loads(args.task_config)
    except json.JSONDecodeError as exc:
        raise DataError(f"--task-config is not valid JSON ({exc}): {args.task_config!r}") from exc
    if not isinstance(config, dict):
        raise DataError(f"--task-config must be a JSON object, got {args.task_config!r}")
    paths = write_reasoning_gym(
        args.task,
        args.out,
        train_size=args.train_size,
        val_size=args.val_size,
        seed=args.seed,
        task_config=config,
        prompt_style=args.prompt_style,
        num_examples=args.num_examples,
    )
    _print_written(paths, {"train": args.train_size, "val": args.val_size})
    return 0


def _tiny(args: argparse.Namespace) -> int:
    from polyrl.data.generate import write_tiny_digits

    paths = write_tiny_digits(
        args.out, train_size=args.train_size, val_size=args.val_size, seed=args.seed
    )
    _print_written(paths, {"train": args.train_size, "val": args.val_size})
    return 0


def _print_written(paths: dict[str, Path], sizes: dict[str, int]) -> None:
    for split, path in paths.items():
        print(f"wrote {path} ({sizes[split]} rows)")
    print(
        f"use: data.train_files={paths['train']} data.val_files={paths['val']}",
    )
