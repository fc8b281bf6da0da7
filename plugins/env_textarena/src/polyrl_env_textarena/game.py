"""One TextArena game, single-player, with its own randomness.

Why each game keeps its own ``random`` state: TextArena seeds and draws from Python's global
``random`` (``textarena.State.__init__`` calls ``random.seed(seed)``; GuessTheNumber then draws
its target with ``random.randint``). Episodes of a batch advance in turns, so without isolation
one game's draws would shift another's and a seed would no longer fix a game. Every call here
restores the game's state of ``random`` first, saves it after, and puts the process's own state
back, so a seed gives the same game whatever else the process draws. The calls are synchronous;
the episode runs them on the environment's one worker thread (:mod:`polyrl_env_textarena.
environment`), one at a time, which these swaps of a process-wide state need.
"""

from __future__ import annotations

import difflib
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")
PLAYER = 0  # the policy is player 0 of a one-player game


@dataclass(frozen=True)
class Move:
    """What the game made of one action. ``done``: the game is over by its own rules;
    ``text``: its answer, the part of the observation new since the last one ("" when done);
    ``invalid``: the game did not take the move (it asked for another, or ended over it)."""

    done: bool
    text: str
    invalid: bool


@dataclass(frozen=True)
class Outcome:
    """How the game ended: ``reward`` of player 0 as ``env.close()`` returned it (None: the
    game was not over), and TextArena's ``game_info`` of player 0 (``invalid_move``,
    ``turn_count``, ``reason``)."""

    reward: float | None
    info: dict[str, Any]


class Game:
    """``textarena.make(env_id)`` reset for one player with ``seed``, played move by move."""

    def __init__(self, env_id: str, seed: int) -> None:
        self.env_id = env_id
        self.seed = int(seed)
        self.env: Any = None
        self.shown = ""  # the whole observation text TextArena gave last
        self._random: Any = None

    def reset(self) -> str:
        """Make and reset the game; its first observation (the rules, the first board)."""

        def reset() -> str:
            import textarena as ta

            self.env = ta.make(self.env_id)
            self.env.reset(num_players=1, seed=self.seed)
            return self._observe()

        return self._isolated(reset)

    def move(self, action: str) -> Move:
        """Play ``action`` (the assistant's whole text: the game finds its move in it)."""

        def move() -> Move:
            before = int(self._info()["turn_count"])
            done, _ = self.env.step(action=action)
            info = self._info()
            # A single-player game counts a turn only for a move it took; a move that ends the
            # game for being invalid is counted, but flagged.
            invalid = int(info["turn_count"]) == before or bool(done and info["invalid_move"])
            return Move(bool(done), "" if done else self._observe(), invalid)

        return self._isolated(move)

    def close(self) -> Outcome:
        """End the game: player 0's reward (None when it was not over) and its game info."""

        def close() -> Outcome:
            rewards, info = self.env.close()
            reward = None if rewards is None else float(rewards[PLAYER])
            return Outcome(reward, dict(info[PLAYER]))

        return self._isolated(close)

    def _info(self) -> dict[str, Any]:
        return self.env.state.game_info[PLAYER]

    def _observe(self) -> str:
        """The observation's new part. TextArena's LLM wrappers repeat the whole history in each
        observation, which the conversation already holds; a wrapper that shows only the current
        board gives a text that does not extend the last one, and it is passed whole."""
        _, text = self.env.get_observation()
        new = text[len(self.shown) :] if text.startswith(self.shown) else text
        self.shown = text
        return new.strip() or text.strip()

    def _isolated(self, call: Callable[[], T]) -> T:
        outer = random.getstate()
        try:
            if self._random is not None:
                random.setstate(self._random)
            return call()
        finally:
            self._random = random.getstate()
            random.setstate(outer)


def single_player_problem(env_id: str) -> str | None:
    """None if TextArena registers ``env_id`` and it resets for one player; else what is wrong
    and how to fix it, in one line."""
    import textarena  # noqa: F401 - registers the games
    from textarena.envs.registration import ENV_REGISTRY

    if env_id not in ENV_REGISTRY:
        close = difflib.get_close_matches(env_id, list(ENV_REGISTRY), n=3)
        hint = f"did you mean {', '.join(close)}?" if close else "e.g. GuessTheNumber-v0"
        return f"not a TextArena game ({hint})"
    try:
        Game(env_id, 0).reset()
    except Exception as exc:  # noqa: BLE001 - any failure means the game cannot be played here
        return (
            f"TextArena cannot start it for one player ({type(exc).__name__}: {exc}); "
            "choose a single-player game such as GuessTheNumber-v0"
        )
    return None
