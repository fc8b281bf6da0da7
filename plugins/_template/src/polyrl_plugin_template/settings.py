"""The plugin's own config sections, ``plugins.template_reinforce.*`` and
``plugins.template_keyword.*``.

They are plain dataclasses without heavy imports: ``polyrl validate`` imports them (through the
specs' ``config_class``) to reject misspelled keys before a run starts.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ReinforceBaselineSettings:
    """``leave_one_out``: each sample's baseline is the mean score of the *other* samples of the
    batch (an unbiased baseline, as in RLOO but over the batch) instead of the mean of all.
    ``normalize``: divide by the batch's score standard deviation (plus ``epsilon``)."""

    leave_one_out: bool = False
    normalize: bool = False
    epsilon: float = 1e-6


@dataclass
class KeywordRewardSettings:
    """``max_chars``: length budget of a response; every character beyond it costs
    ``penalty_per_char`` (the penalty never exceeds ``max_penalty``)."""

    max_chars: int = 400
    penalty_per_char: float = 0.001
    max_penalty: float = 0.5
    case_sensitive: bool = False
