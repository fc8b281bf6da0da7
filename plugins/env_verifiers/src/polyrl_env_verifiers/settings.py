"""The verifiers environment's keys, mounted beside verl's in
``actor_rollout_ref.rollout.multi_turn``. Light on purpose: imported whenever a config is composed
(``verifiers`` is imported only by the check, which runs when the environment is selected)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ROWS = ("env", "data")


@dataclass
class VerifiersSettings:
    """``verifiers_env``: the verifiers environment, as ``module:function`` (a function returning
    a ``vf.Environment``) or as an installed verifiers environment id (``vf.load_environment``:
    the module ``<id>`` with ``-`` read as ``_``, whose ``load_environment`` builds it).
    ``verifiers_env_args``: keyword arguments of that function.
    ``verifiers_rows``: where an episode's prompt, answer and info come from. ``env``: the
    environment's own dataset, its example ``extra_info.example_id`` of the sampled row, else the
    row's ``index`` modulo the dataset's length (so any polyrl dataset, ``builtin:tiny`` too,
    drives the environment's examples, and the ``rollout.n`` samples of a row share one);
    ``data``: the sampled row itself (its chat prompt, ``ground_truth`` as the answer,
    ``extra_info`` as the info)."""

    verifiers_env: str | None = None
    verifiers_env_args: dict[str, Any] = field(default_factory=dict)
    verifiers_rows: str = "env"


def check_config(cfg: Any) -> list[str]:
    """The verifiers keys' problems, one line each, for ``polyrl validate`` (before Ray starts):
    the environment must load and be one this adapter can drive."""
    from polyrl_env_verifiers.loading import env_problems, load_env

    settings = cfg.actor_rollout_ref.rollout.multi_turn
    name = settings.get("verifiers_env")
    if not name:
        return [
            "multi_turn.environment=verifiers needs multi_turn.verifiers_env=module:function "
            "(returning a vf.Environment) or an installed verifiers environment id"
        ]
    rows = str(settings.verifiers_rows)
    if rows not in ROWS:
        return [f"multi_turn.verifiers_rows={rows} must be one of {', '.join(ROWS)}"]
    try:
        env = load_env(str(name), dict(settings.get("verifiers_env_args") or {}))
    except Exception as exc:  # noqa: BLE001 - any failure to build it is the config's problem
        return [f"multi_turn.verifiers_env={name}: {exc}"]
    return [f"multi_turn.verifiers_env={name}: {p}" for p in env_problems(env, rows)]
