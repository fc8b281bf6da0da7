"""The reward curve of a run as a PNG, drawn from its ``metrics.jsonl``.

Drawn from the jsonl file (not from live metrics) so that it can be redrawn for any finished or
crashed run, and so the plot shows exactly what was recorded. Uses matplotlib's object API with
the Agg canvas directly instead of ``pyplot``: no global backend switch, no GUI, safe in a
headless process and next to other code that uses pyplot. matplotlib is an extra of polyrl
(``pip install 'polyrl[plot]'``); without it a finished run just has no PNG.
"""

from __future__ import annotations

import math
import os

from polyrl.errors import DataError
from polyrl.loggers.jsonl import read_metrics
from polyrl.loggers.values import TRAIN_REWARD_KEY, val_rewards


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def load_reward_series(
    metrics_jsonl: str,
) -> tuple[list[tuple[int, float]], dict[str, list[tuple[int, float]]]]:
    """``(train, val)``: the ``critic/score/mean`` points and, per validation data source, the
    ``val-core/<source>/reward/mean@<n>`` points, each as ``(step, value)`` sorted by step.
    Null (non-finite) values are skipped."""
    if not os.path.isfile(metrics_jsonl):
        raise DataError(
            f"no metrics file at {metrics_jsonl}; run with trainer.logger including jsonl"
        )
    train: list[tuple[int, float]] = []
    val: dict[str, list[tuple[int, float]]] = {}
    for record in read_metrics(metrics_jsonl):
        step = record["step"]
        if _finite(record.get(TRAIN_REWARD_KEY)):
            train.append((step, float(record[TRAIN_REWARD_KEY])))
        numbers = {k: v for k, v in record.items() if _finite(v)}
        for source, value in val_rewards(numbers).items():
            val.setdefault(source, []).append((step, float(value)))
    train.sort()
    for points in val.values():
        points.sort()
    return train, val


def plot_reward_curve(metrics_jsonl: str, out_png: str) -> str:
    """Draw train reward per step (line) and validation reward (markers, one series per data
    source) from ``metrics_jsonl`` into ``out_png``; return ``out_png``.

    Raises :class:`polyrl.errors.DataError` when the file is missing or holds no reward metric,
    or when matplotlib is not installed.
    """
    from polyrl.preflight import require_extra

    require_extra("the reward-curve PNG", ("matplotlib",), DataError)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    train, val = load_reward_series(metrics_jsonl)
    if not train and not val:
        raise DataError(
            f"{metrics_jsonl} holds no {TRAIN_REWARD_KEY} nor val-core/<source>/reward/mean@1 "
            "values, so there is no reward curve to draw"
        )
    fig = Figure(figsize=(8, 4.5), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    if train:
        steps, values = zip(*train)
        ax.plot(steps, values, marker="." if len(train) < 50 else None, label="train reward")
    for source, points in sorted(val.items()):
        steps, values = zip(*points)
        ax.plot(steps, values, marker="o", linestyle="--", label=f"val reward ({source})")
    ax.set_xlabel("training step")
    ax.set_ylabel("mean reward")
    run = os.path.basename(os.path.dirname(os.path.abspath(metrics_jsonl)))
    ax.set_title(f"Reward per step — {run}")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best")
    fig.tight_layout()
    folder = os.path.dirname(os.path.abspath(out_png))
    os.makedirs(folder, exist_ok=True)
    fig.savefig(out_png, format="png")
    return out_png
