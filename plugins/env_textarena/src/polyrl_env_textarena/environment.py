"""The ``textarena`` environment: the policy plays one single-player TextArena game per row.

An episode is ``textarena.make(env_id)`` reset for one player with the row's seed. The first
user message is the game's first observation (the row's own prompt is replaced); each assistant
turn's whole text is the action (the game finds its move in it, e.g. ``[7]`` in GuessTheNumber,
and answers a malformed or illegal move itself, by its own rules); the game's answer, the part of
its observation new since the last turn, is the next user message. The episode ends when the
game is over (``done``) or at polyrl's limits (``multi_turn.max_assistant_turns``,
``max_user_turns``, the token budget).

The reward is TextArena's final reward of player 0 (``env.close()``), unchanged, on the last
assistant token: GuessTheNumber gives 1 for a win and otherwise
``1 - |last guess - target| / (max - min)``, in [0, 1]; other games have their own scales (some
give -1 for a loss). It is not rescaled because only the game knows its range, and GRPO-style
estimators are invariant to a game's scale within a group anyway. A game polyrl's limits stopped
before it was over has no TextArena reward and scores 0.0; so does a game that raised
(``env_error``, only its own episode ends) or ran past ``multi_turn.env_timeout_s``.

Which game: ``extra_info.env_id`` of the row, else ``multi_turn.textarena_env_id``. Which seed:
``extra_info.seed``, else one derived from the run's seed, the row's ``extra_info.split`` and its
``index``, so the ``rollout.n`` samples of a prompt play the same game (a GRPO group compares
plays of one game) and any dataset's rows (``builtin:tiny_digits``) serve as games.

Every game call runs on the environment's one worker thread: the event loop stays free for the
other episodes, and the games' swaps of Python's global ``random`` (:mod:`polyrl_env_textarena.
game`) never overlap.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from polyrl.api import (
    END_ENV_ERROR,
    END_ENV_TIMEOUT,
    AssistantTurn,
    Environment,
    EnvironmentContext,
    Episode,
    EpisodeResult,
    EpisodeStart,
    Observation,
    derive_seed,
)
from polyrl_env_textarena.game import Game

T = TypeVar("T")


class TextArenaEpisode(Episode):
    """One row's game."""

    def __init__(self, env: TextArenaEnvironment, game: Game) -> None:
        self.env = env
        self.game = game
        self.started = False

    async def start(self) -> EpisodeStart:
        text = await self.env.call(self.game.reset)
        self.started = True
        return EpisodeStart(messages=[{"role": "user", "content": text}])

    async def step(self, turn: AssistantTurn) -> Observation:
        move = await self.env.call(self.game.move, turn.text)
        metrics = {"textarena/invalid_moves": float(move.invalid)}
        if move.done:
            return Observation(done=True, metrics=metrics)
        return Observation([{"role": "user", "content": move.text}], metrics=metrics)

    async def finish(self, reason: str) -> EpisodeResult:
        # A game that raised or hung is left alone: its state is unknown, and a hung call still
        # holds the worker thread.
        if not self.started or reason in (END_ENV_ERROR, END_ENV_TIMEOUT):
            return EpisodeResult(reward=0.0, metrics={"textarena/game_over": 0.0})
        outcome = await self.env.call(self.game.close)
        over = outcome.reward is not None
        return EpisodeResult(
            reward=outcome.reward if over else 0.0,
            metrics={
                "textarena/game_over": float(over),
                "textarena/reward": outcome.reward if over else 0.0,
                "textarena/ended_on_invalid_move": float(bool(outcome.info.get("invalid_move"))),
            },
        )


class TextArenaEnvironment(Environment):
    """TextArena games for every row (see the module's docstring)."""

    def __init__(self, ctx: EnvironmentContext) -> None:
        super().__init__(ctx)
        self.env_id = str(ctx.config.actor_rollout_ref.rollout.multi_turn.textarena_env_id)
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="textarena")

    def episode(self, row: Mapping[str, Any]) -> Episode:
        return TextArenaEpisode(self, Game(*self.game_of(row)))

    def game_of(self, row: Mapping[str, Any]) -> tuple[str, int]:
        """The row's game and seed."""
        extra = dict(row.get("extra_info") or {})
        seed = extra.get("seed")
        if seed is None:
            seed = derive_seed(self.ctx.seed, "textarena", extra.get("split", ""), row["index"])
        return str(extra.get("env_id") or self.env_id), int(seed)

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the worker thread."""
        return await asyncio.get_running_loop().run_in_executor(self.worker, fn, *args)

    def close(self) -> None:
        self.worker.shutdown(wait=False, cancel_futures=True)
