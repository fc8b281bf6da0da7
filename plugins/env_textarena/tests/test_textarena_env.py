"""The textarena environment driving real TextArena GuessTheNumber-v0 games by hand.

The assistant turns are scripted texts, so what is checked is the adapter: the game's text is
what the policy sees, the assistant's text is the game's action, the reward is what TextArena
returned. GuessTheNumber-v0 is 1..20 within 10 turns; ``reset(seed=s)`` calls ``random.seed(s)``
and then draws the target with ``random.randint(1, 20)``, so ``random.Random(s).randint(1, 20)``
is the target (13 for seed 0), derived here without asking the game.
"""

from __future__ import annotations

import asyncio
import random
import re

import pytest

from polyrl.api import AssistantTurn, EpisodeResult, Observation
from polyrl_env_textarena.settings import check_config

GAME = "GuessTheNumber-v0"


def target(seed: int) -> int:
    return random.Random(seed).randint(1, 20)


def play(env, row, texts):
    """Start the row's episode, send ``texts`` until the game is over, finish it."""

    async def drive():
        episode = env.episode(row)
        await episode.start()
        observations = []
        for index, text in enumerate(texts):
            obs = await episode.step(AssistantTurn(index, text, (1,)))
            observations.append(obs)
            if obs.done:
                break
        reason = "done" if observations and observations[-1].done else "max_assistant_turns"
        return observations, await episode.finish(reason)

    return asyncio.run(drive())


def test_binary_search_reads_the_hints_and_wins(env):
    async def drive():
        episode = env.episode({"index": 0, "extra_info": {"seed": 0}})
        start = await episode.start()
        low, high, guesses, obs = 1, 20, [], Observation()
        while not obs.done:
            guess = (low + high) // 2
            guesses.append(guess)
            obs = await episode.step(AssistantTurn(len(guesses) - 1, f"I guess [{guess}]", (1,)))
            if not obs.done:
                (message,) = obs.messages
                assert message["role"] == "user"
                hint = re.search(r"The target number is (higher|lower)\.", message["content"])
                low, high = (guess + 1, high) if hint.group(1) == "higher" else (low, guess - 1)
        return start, guesses, obs, await episode.finish("done")

    start, guesses, obs, result = asyncio.run(drive())
    (first,) = start.messages
    assert first["role"] == "user" and "between 1 and 20 within 10 turns" in first["content"]
    assert guesses == [10, 15, 12, 13] and guesses[-1] == target(0) == 13
    assert obs.metrics == {"textarena/invalid_moves": 0.0}
    assert result == EpisodeResult(
        reward=1.0,
        metrics={
            "textarena/game_over": 1.0,
            "textarena/reward": 1.0,
            "textarena/ended_on_invalid_move": 0.0,
        },
    )


def test_garbage_gets_the_games_invalid_move_handling_and_its_reward(env):
    # [10] is 3 below 13: "higher". One invalid move is answered with a warning (TextArena's
    # error allowance is 1); the second in a row ends the game, which then scores the last
    # guess: 1 - |10 - 13| / (20 - 1) = 16/19.
    observations, result = play(
        env, {"index": 0, "extra_info": {"seed": 0}}, ["[10]", "no idea", "still no idea", "[13]"]
    )
    assert len(observations) == 3 and observations[-1].done
    assert observations[0].messages[0]["content"].endswith("The target number is higher.")
    warning = observations[1].messages[0]["content"]
    assert warning.startswith("[Player] [no idea]\n[GAME] You attempted an invalid move.")
    assert "Invalid move format" in warning
    assert [o.metrics["textarena/invalid_moves"] for o in observations] == [0.0, 1.0, 1.0]
    assert result.reward == pytest.approx(16 / 19)
    assert result.metrics["textarena/ended_on_invalid_move"] == 1.0
    assert result.metrics["textarena/game_over"] == 1.0


def test_out_of_range_and_repeated_guesses_are_the_games_invalid_moves(env):
    observations, _ = play(env, {"index": 0, "extra_info": {"seed": 0}}, ["[10]", "[10]", "[50]"])
    assert "already guessed" in observations[1].messages[0]["content"]
    assert observations[2].done  # the second invalid move in a row ends it


def test_a_game_stopped_by_polyrls_limits_scores_zero(env):
    observations, result = play(env, {"index": 0, "extra_info": {"seed": 0}}, ["[10]"])
    assert not observations[0].done
    assert result.reward == 0.0 and result.metrics["textarena/game_over"] == 0.0


def test_games_leave_the_process_random_stream_alone(env):
    """TextArena calls ``random.seed`` in every reset; the process's own draws go on as if no
    game had run, and two episodes of one seed play one game."""
    random.seed(123)
    expected = [random.random() for _ in range(2)]
    random.seed(123)

    async def drive():
        first, second = (env.episode({"index": 0, "extra_info": {"seed": 7}}) for _ in range(2))
        await first.start()
        drawn = random.random()
        await second.start()
        win = AssistantTurn(0, f"[{target(7)}]", (1,))
        return drawn, await first.step(win), await second.step(win)

    drawn, first, second = asyncio.run(drive())
    assert [drawn, random.random()] == expected
    assert first.done and second.done


def test_rows_without_a_seed_get_one_per_prompt_from_the_run_seed(env):
    row = {"index": 3, "extra_info": {"split": "train"}}
    assert env.game_of(row) == env.game_of({**row, "sample": 1})
    assert env.game_of(row) != env.game_of({"index": 3, "extra_info": {"split": "val"}})
    assert env.game_of({"index": 0, "extra_info": {"env_id": "Wordle-v0", "seed": 4}}) == (
        "Wordle-v0",
        4,
    )


def test_a_game_textarena_cannot_make_fails_its_start_and_scores_zero(env):
    async def drive():
        episode = env.episode({"index": 0, "extra_info": {"env_id": "NoSuchGame-v0"}})
        with pytest.raises(ValueError, match="not found in registry"):
            await episode.start()  # the rollout ends this episode only, with env_error
        return await episode.finish("env_error")

    assert asyncio.run(drive()).reward == 0.0


def test_the_default_game_is_checked_before_the_run(config_of):
    assert check_config(config_of()) == []
    (problem,) = check_config(config_of("GuessTheNumbr-v0"))
    assert problem.startswith("multi_turn.textarena_env_id=GuessTheNumbr-v0: not a TextArena game")
    assert "did you mean GuessTheNumber-v0" in problem
    (problem,) = check_config(config_of("TicTacToe-v0"))  # a two-player game
    assert "cannot start it for one player" in problem
