"""Rows that cannot teach, caught when the data loads rather than after steps of training on them.

A preference pair whose chosen and rejected responses are the same (or one is empty) has no
preference to learn: DPO's loss stays at ln 2 whatever the policy does. A prompt whose
``data_source`` no scorer knows gets the failure score on every sample: zero advantage. A few such
rows in a large file are noise and are dropped with a count; above ``data.max_unteachable_share``
of the rows the file is most likely not what the run needs (a wrong column, a wrong
``data_source``, a missing scorer plugin), and the run refuses in one line before Ray starts.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from polyrl.errors import ConfigError, DataError

SHARE_KEY = "data.max_unteachable_share"


def settle_unteachable(
    reasons: Counter[str], rows: int, max_share: float, files: Sequence[str]
) -> None:
    """Refuse (:class:`DataError`) when the rows counted in ``reasons`` (reason -> rows) are more
    than ``max_share`` of ``rows``; else say how many were dropped, and why."""
    if not 0 <= max_share <= 1:
        raise ConfigError(f"{SHARE_KEY}={max_share} must be a share between 0 and 1 (e.g. 0.1)")
    count = sum(reasons.values())
    if not count:
        return
    why = "; ".join(f"{reason} ({n})" for reason, n in reasons.most_common())
    where = ", ".join(files)
    if count > max_share * rows or count == rows:
        raise DataError(
            f"{count} of {rows} rows of {where} cannot teach anything: {why}. That is more than "
            f"{SHARE_KEY}={max_share:g} of the rows (or all of them): fix the data (or its "
            f"columns), or raise {SHARE_KEY} to drop them and train on the rest"
        )
    print(
        f"polyrl: dropped {count} of {rows} rows that cannot teach ({where}): {why}",
        file=sys.stderr,
    )


def scorer_check(cfg: Any) -> Callable[[str], bool] | None:
    """``has_scorer(data_source)`` for the run's rule-based reward, or None where any source may
    be scored: a custom reward function, a reward provider other than the built-in ``naive``, or
    a reward model whose score replaces the rule's."""
    rm = cfg.reward_model
    if cfg.custom_reward_function.path or str(rm.reward_manager) != "naive":
        return None
    if rm.enable and str(rm.combine) == "replace":
        return None
    from polyrl.rewards.scorers import builtin_scorer, plugin_scorer_refs

    plugin_sources = set(plugin_scorer_refs(rm))
    return lambda source: source in plugin_sources or builtin_scorer(source) is not None
