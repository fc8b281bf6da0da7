"""The judge's rules for a run config (``RewardProviderSpec.config_check``), run by ``polyrl
validate`` and before Ray starts when ``reward_model.reward_manager=judge``. Light (no torch):
the judge model itself is loaded only when the run builds its reward."""

from __future__ import annotations

import re
from typing import Any

from polyrl.api import Checker, PluginKind, at_least, get_registry
from polyrl_reward_judge.prompt import placeholders
from polyrl_reward_judge.settings import BACKENDS, PLACEHOLDERS, SECTION, VERDICTS


def check_config(cfg: Any) -> list[str]:
    """One line per problem of ``reward_model.judge``."""
    c = Checker(cfg, get_registry())
    backend = c.choice(f"{SECTION}.backend", BACKENDS)
    if backend == "rollout":
        _check_rollout(c)
    elif backend == "openai":
        _check_openai(c)
    _check_template(c)
    verdict = c.choice(f"{SECTION}.verdict", VERDICTS)
    if verdict == "score":
        _check_pattern(c, "score_pattern", groups=1)
    if verdict in ("score", "json"):
        _check_range(c)
    if verdict == "json" and not str(c.get(f"{SECTION}.json_field") or "").strip():
        c.add(f"{SECTION}.json_field is empty: name the verdict's field, e.g. json_field=score")
    if verdict == "pass_fail":
        _check_pattern(c, "pass_pattern")
        _check_pattern(c, "fail_pattern")
    c.number(f"{SECTION}.max_new_tokens", at_least(1), ">= 1", integer=True)
    c.number(f"{SECTION}.max_unparsed_frac", lambda v: 0 <= v <= 1, "in [0, 1]")
    return c.problems


def _check_rollout(c: Checker) -> None:
    if c.get(f"{SECTION}.model_path") in (None, ""):
        c.add(
            f"{SECTION}.model_path is not set: the rollout backend serves the judge model "
            f"from it, e.g. {SECTION}.model_path=builtin:tiny or a Hugging Face folder"
        )
    c.number(f"{SECTION}.max_prompt_tokens", at_least(1), ">= 1", integer=True)
    name = c.get(f"{SECTION}.rollout")
    installed = c.registry.names(PluginKind.ROLLOUT_ENGINE)
    if str(name) not in installed:
        c.add(
            f"{SECTION}.rollout={name!r} is not an installed rollout engine; use one of "
            f"{', '.join(installed) or '(none installed: pip install polyrl-rollout-hf)'}"
        )


def _check_openai(c: Checker) -> None:
    for key, example in (("base_url", "http://127.0.0.1:8000/v1"), ("model", "judge")):
        if c.get(f"{SECTION}.{key}") in (None, ""):
            c.add(
                f"{SECTION}.{key} is not set: the openai backend needs it, e.g. "
                f"{SECTION}.{key}={example}"
            )
    if not str(c.get(f"{SECTION}.api_key_env") or "").strip():
        c.add(f"{SECTION}.api_key_env is empty: name the environment variable holding the key")
    c.number(f"{SECTION}.timeout_s", lambda v: v > 0, "> 0")
    c.number(f"{SECTION}.max_concurrency", at_least(1), ">= 1", integer=True)


def _check_template(c: Checker) -> None:
    template = str(c.get(f"{SECTION}.template") or "")
    unknown = [name for name in placeholders(template) if name not in PLACEHOLDERS]
    if unknown:
        c.add(
            f"{SECTION}.template uses unknown placeholder(s) {', '.join(unknown)}; the "
            f"placeholders are {', '.join('{' + p + '}' for p in PLACEHOLDERS)}"
        )
    elif "response" not in placeholders(template):
        c.add(f"{SECTION}.template has no {{response}}: the judge would not see the response")


def _check_pattern(c: Checker, key: str, *, groups: int | None = None) -> None:
    value = str(c.get(f"{SECTION}.{key}") or "")
    try:
        compiled = re.compile(value)
    except re.error as exc:
        c.add(f"{SECTION}.{key}={value!r} is not a valid regex ({exc})")
        return
    if groups is not None and compiled.groups != groups:
        c.add(
            f"{SECTION}.{key}={value!r} has {compiled.groups} capture groups; it needs exactly "
            f"{groups}, around the number, e.g. 'Score:\\s*(\\d+)'"
        )


def _check_range(c: Checker) -> None:
    low = c.number(f"{SECTION}.score_min", lambda v: True, "a number")
    high = c.number(f"{SECTION}.score_max", lambda v: True, "a number")
    if low is not None and high is not None and not low < high:
        c.add(f"{SECTION}.score_min={low} must be below score_max={high}")
