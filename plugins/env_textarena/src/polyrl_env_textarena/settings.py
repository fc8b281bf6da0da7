"""The TextArena environment's key, mounted beside verl's in
``actor_rollout_ref.rollout.multi_turn``. Light on purpose: imported whenever a config is composed
(``textarena`` is imported only by the check, which runs when the environment is selected)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class TextArenaSettings:
    """``textarena_env_id``: the TextArena game of rows whose ``extra_info`` names none
    (``extra_info.env_id`` wins), as ``textarena.make`` spells it: ``GuessTheNumber-v0``; the
    ``-train`` / ``-raw`` variants pick TextArena's other observation wrappers."""

    textarena_env_id: str = "GuessTheNumber-v0"


def check_config(cfg: Any) -> list[str]:
    """The default game's problems, one line each, for ``polyrl validate`` (before Ray starts):
    it must be registered in TextArena and playable by one player."""
    from polyrl_env_textarena.game import single_player_problem

    env_id = str(cfg.actor_rollout_ref.rollout.multi_turn.textarena_env_id)
    problem = single_player_problem(env_id)
    return [f"multi_turn.textarena_env_id={env_id}: {problem}"] if problem else []
