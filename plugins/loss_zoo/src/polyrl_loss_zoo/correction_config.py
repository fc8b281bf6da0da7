"""verl's rollout-correction settings read and checked without torch: ``bypass_mode=true``
selects the ``bypass_mode`` loss (:func:`implied_settings`), ``polyrl validate``'s check of it
(:func:`check_bypass_config`), and the parsing of ``rollout_rs`` / ``rollout_rs_threshold``
into criteria, with verl's rules, so a bad spec is one line before a run, not an error in the
middle of an update."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from polyrl.api import TIS_CAP_KEY, ConfigError, tis_enabled
from polyrl_loss_zoo.settings import ROLLOUT_CORRECTION, RolloutCorrectionSettings

LOSS_MODE_KEY = "actor_rollout_ref.actor.policy_loss.loss_mode"
BYPASS_LOSS = "bypass_mode"
IS_LEVELS = ("token", "sequence")
LOSS_TYPES = ("ppo_clip", "reinforce")
# verl's rejection criteria: the divergence (k1 = -log r, k2 = (log r)^2 / 2,
# k3 = r - 1 - log r, with r = pi / pi_rollout) per token, or its sum, mean or max per sequence.
TOKEN_CRITERIA = ("token_k1", "token_k2", "token_k3")
SEQUENCE_CRITERIA = (
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
)
RS_CRITERIA = TOKEN_CRITERIA + SEQUENCE_CRITERIA


@dataclass(frozen=True)
class Criterion:
    """One rejection criterion: a token or sequence is kept when its statistic lies in
    ``[lower, upper]``. For ``*k1`` both bounds are logs of the ratio bounds of the spec (k1 is
    a log-ratio); for k2/k3 ``lower`` is None (only an upper bound)."""

    name: str
    lower: float | None
    upper: float

    @property
    def token_level(self) -> bool:
        return self.name in TOKEN_CRITERIA

    @property
    def reduce(self) -> str:
        """``token``, ``sum``, ``mean`` or ``max``: how the token statistic becomes the one
        judged."""
        return "token" if self.token_level else self.name.split("_")[1]

    @property
    def estimator(self) -> str:
        return self.name.rsplit("_", 1)[1]


@dataclass(frozen=True)
class Correction:
    """The parsed settings the ``bypass_mode`` loss applies."""

    rollout_is: str | None
    is_threshold: float
    batch_normalize: bool
    criteria: tuple[Criterion, ...]
    loss_type: str


def _key(name: str) -> str:
    return f"{ROLLOUT_CORRECTION}.{name}"


def parse_criteria(rollout_rs: Any, threshold: Any) -> tuple[Criterion, ...]:
    """``rollout_rs`` ("token_k1,seq_max_k2"; duplicates dropped) with ``rollout_rs_threshold``
    (one entry shared by all criteria or one per criterion, comma-separated) as verl reads
    them: a ``*k1`` entry is ``lower_upper`` ratio bounds, or a single upper bound whose
    reciprocal is the lower one; a k2/k3 entry is one positive upper bound."""
    if rollout_rs is None:
        return ()
    if not isinstance(rollout_rs, str):
        raise ConfigError(
            f"{_key('rollout_rs')}={rollout_rs!r}: give the criteria as a comma-separated "
            f"string, e.g. 'token_k1,seq_max_k2'"
        )
    names = list(dict.fromkeys(part.strip() for part in rollout_rs.split(",") if part.strip()))
    unknown = [name for name in names if name not in RS_CRITERIA]
    if not names or unknown:
        raise ConfigError(
            f"{_key('rollout_rs')}={rollout_rs!r}: unknown criterion {unknown or [rollout_rs]}; "
            f"use one or more of {', '.join(RS_CRITERIA)}, comma-separated"
        )
    if threshold is None or isinstance(threshold, bool):
        raise ConfigError(
            f"{_key('rollout_rs')}={rollout_rs!r} needs {_key('rollout_rs_threshold')}: one "
            f"entry per criterion, e.g. '0.6_1.6,2.5' (lower_upper ratio bounds for *k1, an "
            f"upper bound for k2/k3)"
        )
    if isinstance(threshold, int | float):
        specs = [str(threshold)]
    elif isinstance(threshold, str):
        specs = [part.strip() for part in threshold.split(",") if part.strip()]
    else:
        raise ConfigError(
            f"{_key('rollout_rs_threshold')}={threshold!r}: give a number or a string such "
            f"as '0.6_1.6,2.5'"
        )
    if len(specs) not in (1, len(names)):
        raise ConfigError(
            f"{_key('rollout_rs_threshold')}={threshold!r}: {len(specs)} entries for "
            f"{len(names)} criteria ({', '.join(names)}); give one shared entry or one each"
        )
    specs = specs * len(names) if len(specs) == 1 else specs
    return tuple(_criterion(name, spec) for name, spec in zip(names, specs, strict=True))


def _criterion(name: str, spec: str) -> Criterion:
    where = f"{_key('rollout_rs_threshold')} entry {spec!r} of {name}"
    if name.endswith("k1"):
        lower_text, sep, upper_text = spec.partition("_")
        if not sep:
            upper_text, lower_text = spec, ""
        try:
            upper = float(upper_text)
            lower = float(lower_text) if sep else 1.0 / upper
        except (ValueError, ZeroDivisionError):
            raise ConfigError(
                f"{where}: give 'lower_upper' ratio bounds such as '0.6_1.6', or one upper bound"
            ) from None
        if lower <= 0 or upper <= 0:
            raise ConfigError(f"{where}: ratio bounds must be positive")
        return Criterion(name, math.log(lower), math.log(upper))
    if "_" in spec:
        raise ConfigError(f"{where}: a k2/k3 criterion takes one upper bound, not 'lower_upper'")
    try:
        upper = float(spec)
    except ValueError:
        raise ConfigError(f"{where}: not a number") from None
    if upper <= 0:
        raise ConfigError(f"{where}: the bound must be positive")
    return Criterion(name, None, upper)


def parse_correction(settings: Any) -> Correction:
    """The ``rollout_correction`` node (at ``algorithm.`` or its mirror under the actor's
    ``policy_loss``) as a :class:`Correction`; a bad value raises :class:`ConfigError`."""
    level = settings.rollout_is
    if level not in (None, *IS_LEVELS):
        raise ConfigError(
            f"{_key('rollout_is')}={level!r}: use token, sequence or null (no weights)"
        )
    threshold = settings.rollout_is_threshold
    if isinstance(threshold, bool) or not isinstance(threshold, int | float) or threshold <= 0:
        raise ConfigError(
            f"{_key('rollout_is_threshold')}={threshold!r}: the truncation of the weights must "
            f"be a positive number (2.0 is usual)"
        )
    loss_type = settings.loss_type
    if loss_type not in LOSS_TYPES:
        raise ConfigError(f"{_key('loss_type')}={loss_type!r}: use ppo_clip or reinforce")
    return Correction(
        rollout_is=level,
        is_threshold=float(threshold),
        batch_normalize=bool(settings.rollout_is_batch_normalize),
        criteria=parse_criteria(settings.rollout_rs, settings.rollout_rs_threshold),
        loss_type=str(loss_type),
    )


def changed_settings(cfg: Any) -> list[tuple[str, Any]]:
    """``algorithm.rollout_correction`` keys set away from verl's defaults, ``[(key, value)]``."""
    node = cfg.algorithm.rollout_correction
    defaults = RolloutCorrectionSettings()
    return [
        (_key(f.name), node[f.name])
        for f in fields(RolloutCorrectionSettings)
        if node[f.name] != getattr(defaults, f.name)
    ]


def implied_settings(cfg: Any) -> dict[str, tuple[Any, str]]:
    """``bypass_mode=true`` selects the ``bypass_mode`` loss, which applies the correction, as
    verl's trainer sets ``loss_mode=bypass_mode`` for it. (The decoupled mode keeps the
    selected loss: :mod:`polyrl_loss_zoo.correction_stage` weighs it.)"""
    if not cfg.algorithm.rollout_correction.bypass_mode:
        return {}
    return {LOSS_MODE_KEY: (BYPASS_LOSS, f"{_key('bypass_mode')}=true")}


def check_bypass_config(cfg: Any) -> list[str]:
    """``polyrl validate``'s check of the ``bypass_mode`` loss: it is bypass mode, the settings
    parse, and no second correction is stacked on it."""
    if not cfg.algorithm.rollout_correction.bypass_mode:
        return [
            f"{LOSS_MODE_KEY}={BYPASS_LOSS} is verl's rollout correction in bypass mode: set "
            f"{_key('bypass_mode')}=true (and the other {ROLLOUT_CORRECTION}.* keys) instead "
            f"of selecting the loss"
        ]
    problems = []
    try:
        parse_correction(cfg.algorithm.rollout_correction)
    except ConfigError as exc:
        problems.append(str(exc))
    cap = cfg.actor_rollout_ref.actor.tis_imp_ratio_cap
    if isinstance(cap, int | float) and tis_enabled(cap):
        problems.append(
            f"{_key('bypass_mode')}=true corrects for the rollout's policy itself, and "
            f"{TIS_CAP_KEY}={cap:g} would correct a second time: set {TIS_CAP_KEY}=-1 (use "
            f"{_key('rollout_is')}=token with {_key('rollout_is_threshold')}={cap:g} instead)"
        )
    return problems
