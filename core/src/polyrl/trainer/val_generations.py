"""Which validation samples go to the loggers (``trainer.log_val_generations``: verl's key).

Reading a few prompts with their outputs and scores shows what a reward figure hides (a
format the scorer rejects, answers cut off at ``max_response_length``). To compare them step
to step, every validation of a run must show the same prompts: as verl does, the samples are
sorted by prompt and then sampled with a fixed seed (``trainer.seed``), so the choice does
not depend on the order the validation files list their rows in, nor on the outputs. With
``rollout.val_kwargs.n > 1`` a prompt's answers keep their generation order under the stable
sort, so the same one of them is shown each time.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def generation_rows(
    data_sources: list[Any], prompts: list[str], outputs: list[str], scores: list[float]
) -> list[dict[str, Any]]:
    """One row per generated sample, as the loggers receive it (without the step, which
    :meth:`polyrl.loggers.LoggerGroup.log_generations` adds)."""
    return [
        {"data_source": str(source), "prompt": prompt, "output": output, "score": float(score)}
        for source, prompt, output, score in zip(data_sources, prompts, outputs, scores)
    ]


def pick_generations(rows: list[dict[str, Any]], count: int, seed: int) -> list[dict[str, Any]]:
    """``count`` of ``rows`` (all when there are fewer): sorted by prompt, a seeded sample of
    that order, returned in prompt order."""
    if count <= 0:
        return []
    ordered = sorted(rows, key=lambda row: row["prompt"])
    if count >= len(ordered):
        return ordered
    chosen = np.random.default_rng(seed).choice(len(ordered), size=count, replace=False)
    return [ordered[i] for i in sorted(chosen.tolist())]
