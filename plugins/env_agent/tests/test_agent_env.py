"""The agent environment with the real ``openai`` client against its loopback server."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

from polyrl.api import AssistantTurn, ConfigError, EnvironmentContext, ToolCall
from polyrl_env_agent.environment import AgentEnvironment, load_agent_function

AGENTS = Path(__file__).with_name("agent_functions.py")


def _env(name: str, timeout_s: float = 5.0, limit: int | None = None) -> AgentEnvironment:
    multi_turn = {
        "agent_function": f"{AGENTS}:{name}",
        "agent_timeout_s": timeout_s,
        "agent_max_concurrency": limit,
    }
    config = SimpleNamespace(
        actor_rollout_ref=SimpleNamespace(rollout=SimpleNamespace(multi_turn=_Node(multi_turn)))
    )
    return AgentEnvironment(EnvironmentContext(config=config))


class _Node(dict):
    __getattr__ = dict.__getitem__


def test_tool_agent_turns_observations_and_reward():
    env = _env("tool_agent")

    async def drive():
        episode = env.episode({"question": "what is the secret?"})
        start = await episode.start()
        assert start.messages == [{"role": "user", "content": "what is the secret?"}]
        assert start.tools[0]["function"]["name"] == "lookup"
        call = ToolCall(name="lookup", arguments={}, id="call_0_0")
        text = '<tool_call>{"name": "lookup", "arguments": {}}</tool_call>'
        obs = await episode.step(AssistantTurn(0, text, (1, 2, 3), tool_calls=(call,)))
        assert obs.messages == [
            {"role": "tool", "tool_call_id": "call_0_0", "content": "secret is 7"}
        ]
        assert not obs.done
        obs = await episode.step(AssistantTurn(1, "It is 7.", (4, 5)))
        assert obs.done and obs.end_reason == "done"
        return await episode.finish("done")

    try:
        result = asyncio.run(drive())
    finally:
        env.close()
    assert result.reward == 1.0 and result.metrics == {"x": 2.0}


@pytest.mark.parametrize(
    ("name", "reason"),
    [("raises", "agent_error"), ("hangs", "agent_timeout"), ("rewrites", "agent_history_mismatch")],
)
def test_a_failing_agent_ends_only_its_episode(name, reason):
    env = _env(name, timeout_s=0.5)
    good = _env("tool_agent")

    async def drive():
        bad_episode = env.episode({"question": "q"})
        ok = good.episode({"question": "q"})
        await ok.start()
        if name == "rewrites":
            await bad_episode.start()
            obs = await bad_episode.step(AssistantTurn(0, "x", (1,)))
            assert obs.done and obs.end_reason == reason
            return await bad_episode.finish(reason)
        with pytest.raises(RuntimeError, match="before its first request"):
            await bad_episode.start()
        assert bad_episode.failure == reason
        result = await bad_episode.finish("env_error")
        obs = await ok.step(AssistantTurn(0, "no tool", (1,)))  # the other episode goes on
        assert not obs.done
        return result

    try:
        result = asyncio.run(drive())
    finally:
        env.close()
        good.close()
    assert result.reward == 0.0 or reason == "agent_history_mismatch"


def test_binds_loopback_only():
    env = _env("tool_agent")
    try:
        port = env.server.port
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            pass
        addresses = {a[0] for a in env.server._runner.addresses}
        assert addresses == {"127.0.0.1"}
    finally:
        env.close()


def test_bad_function_paths_are_one_line_errors(tmp_path):
    with pytest.raises(ConfigError, match="module:function"):
        load_agent_function("no_colon")
    with pytest.raises(ConfigError, match="no file"):
        load_agent_function(f"{tmp_path}/missing.py:f")
    with pytest.raises(ConfigError, match="async def"):
        load_agent_function(f"{AGENTS}:not_async")


@pytest.mark.parametrize(("limit", "most"), [(2, 2), (None, 4)])
def test_max_concurrency_bounds_the_agents_own_work_not_the_turns(limit, most):
    env = _env("busy_agent", limit=limit)
    working = env.function.__globals__["WORKING"]

    async def drive():
        episodes = [env.episode({}) for _ in range(4)]
        await asyncio.gather(*(e.start() for e in episodes))
        for index in range(2):  # every episode asks for each turn: none is starved by the limit
            turns = await asyncio.gather(
                *(e.step(AssistantTurn(index, "x", (1,))) for e in episodes)
            )
        assert all(obs.done for obs in turns)
        return await asyncio.gather(*(e.finish("done") for e in episodes))

    try:
        results = asyncio.run(asyncio.wait_for(drive(), 20))
    finally:
        env.close()
    assert [r.reward for r in results] == [1.0] * 4
    assert working["most"] == most and working["now"] == 0


def test_the_agent_keys_are_checked_before_the_run():
    from polyrl_env_agent.settings import check_config

    bad = {
        "agent_function": None,
        "agent_timeout_s": 0,
        "agent_max_concurrency": 0,
        "interaction_config_path": "interactions.yaml",
    }
    config = SimpleNamespace(
        actor_rollout_ref=SimpleNamespace(rollout=SimpleNamespace(multi_turn=_Node(bad)))
    )
    problems = check_config(config)
    assert len(problems) == 4
    assert "needs multi_turn.agent_function" in problems[0]
    assert "agent_timeout_s=0 must be > 0" in problems[1]
    assert "agent_max_concurrency=0 must be >= 1" in problems[2]
    assert "interaction_config_path (verl's interactions) is read by the tools" in problems[3]
