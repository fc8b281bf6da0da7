"""Episodes of real verifiers environments driven by hand with scripted assistant turns: the
turns the environment answers, where it stops, and the reward against the rubric's own score
(worked out by hand from the reward functions and weights in vf_envs.py)."""

from __future__ import annotations

import asyncio

import pytest

from polyrl.api import (
    END_DONE,
    END_MAX_ASSISTANT_TURNS,
    AssistantTurn,
    EnvironmentContext,
    ToolCall,
)
from polyrl_env_verifiers.environment import VerifiersEnvironment
from polyrl_env_verifiers.settings import check_config


def play(env: VerifiersEnvironment, row: dict, turns: list, reason: str = END_DONE):
    """Start the episode of ``row``, answer each scripted turn (text, or (text, calls)) until it
    is done; the start, the observations and the result."""

    async def run():
        episode = env.episode(row)
        start = await episode.start()
        observations = []
        for index, turn in enumerate(turns):
            text, calls = turn if isinstance(turn, tuple) else (turn, ())
            obs = await episode.step(AssistantTurn(index, text, (), tool_calls=tuple(calls)))
            observations.append(obs)
            if obs.done:
                break
        return start, observations, await episode.finish(reason)

    return asyncio.run(run())


def environment(config_of, name: str, rows: str = "env") -> VerifiersEnvironment:
    return VerifiersEnvironment(EnvironmentContext(config=config_of(f"vf_envs:{name}", rows)))


def test_single_turn_reward_is_the_rubrics_weighted_sum(config_of) -> None:
    env = environment(config_of, "single_turn")
    start, observations, result = play(env, {"index": 1}, ["It is 8 ok"])
    # the env's own example 1, its system prompt prepended by verifiers
    assert start.messages == [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "What is 4 + 4?"},
    ]
    assert [o.done for o in observations] == [True]
    # says_answer 1.0 * 1.0 + brevity 1/(1+4) * 0.5
    assert result.reward == pytest.approx(1.0 + 0.1)
    assert result.metrics["verifiers/says_answer"] == 1.0
    assert result.metrics["verifiers/brevity"] == pytest.approx(0.2)
    assert result.metrics["verifiers/num_turns"] == 1.0  # MultiTurnEnv's monitor rubric
    import vf_envs  # verifiers: imported by the tests that run, not by collecting this file

    completion = [{"role": "assistant", "content": "It is 8 ok"}]
    own = vf_envs.says_answer(completion, "8") + 0.5 * vf_envs.brevity(completion)
    assert result.reward == pytest.approx(own)


def test_single_turn_wrong_answer_scores_only_brevity(config_of) -> None:
    env = environment(config_of, "single_turn")
    _, _, result = play(env, {"index": 3}, ["seven"])  # index 3 wraps to example 0 (answer 5)
    assert result.reward == pytest.approx(0.5 * 0.5)


def test_data_rows_use_the_rows_prompt_and_ground_truth(config_of) -> None:
    env = environment(config_of, "single_turn", rows="data")
    row = {"index": 0, "messages": [{"role": "user", "content": "9 + 1?"}], "ground_truth": "10"}
    start, _, result = play(env, row, ["10"])
    assert start.messages[0] == {"role": "system", "content": "Answer briefly."}
    assert start.messages[1:] == row["messages"]
    assert result.reward == pytest.approx(1.0 + 0.5 * 0.5)


def test_multi_turn_env_response_drives_the_user_turns(config_of) -> None:
    env = environment(config_of, "multi_turn")
    _, observations, result = play(env, {"index": 2}, ["12", "14", "13", "never"])
    assert [o.messages for o in observations] == [
        [{"role": "user", "content": "Wrong, try again."}]
    ] * 2 + [[]]
    assert [o.done for o in observations] == [False, False, True]  # the answered stop condition
    assert result.reward == pytest.approx(1.0 + 1 / 3)  # says_answer + 1 / 3 turns
    assert result.metrics["verifiers/num_turns"] == 3.0


def test_multi_turn_max_turns_ends_it_unanswered(config_of) -> None:
    env = environment(config_of, "multi_turn")
    _, observations, result = play(env, {"index": 0}, ["1", "2", "3"])
    assert [o.done for o in observations] == [False, False, True]  # max_turns=3
    assert result.reward == pytest.approx(0.0 + 1 / 3)


def test_polyrl_limit_ends_it_and_it_is_scored_as_it_stands(config_of) -> None:
    env = environment(config_of, "multi_turn")
    _, observations, result = play(env, {"index": 0}, ["1"], reason=END_MAX_ASSISTANT_TURNS)
    assert [o.done for o in observations] == [False]
    assert result.reward == pytest.approx(0.0 + 1.0)  # wrong, one assistant turn


def test_tool_env_runs_the_tool_and_shows_its_output(config_of) -> None:
    env = environment(config_of, "tool_env")
    call = ToolCall("add", {"a": 7, "b": 6}, "call_0")
    start, observations, result = play(env, {"index": 2}, [("", [call]), "The sum is 13."])
    assert [t["function"]["name"] for t in start.tools] == ["add"]
    assert observations[0].messages == [{"role": "tool", "content": "13", "tool_call_id": "call_0"}]
    assert observations[0].metrics["tool_calls"] == 1.0
    assert observations[1].done  # no tool called: ToolEnv's final answer
    assert result.reward == pytest.approx(2.0)  # says_answer * 2.0
    assert result.metrics["verifiers/total_tool_calls"] == 1.0
    assert result.metrics["verifiers/add_calls"] == 1.0


def test_check_names_what_is_wrong(config_of) -> None:
    assert check_config(config_of("vf_envs:single_turn")) == []
    assert "needs multi_turn.verifiers_env" in check_config(config_of(""))[0]
    assert "cannot import" in check_config(config_of("vf_envs:nope"))[0]
    assert (
        "verifiers_rows=both must be one of env, data"
        in check_config(config_of("vf_envs:single_turn", rows="both"))[0]
    )


def test_building_an_environment_leaves_the_stop_handlers_as_they_were(config_of) -> None:
    """verifiers' Environment sets SIGINT and SIGTERM handlers of its own when built; the driver
    keeps polyrl's (a SIGTERM must finish the step and keep the checkpoint, not exit 143)."""
    import signal

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    environment(config_of, "multi_turn")
    assert {sig: signal.getsignal(sig) for sig in before} == before
