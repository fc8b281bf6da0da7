"""The multi-turn rollout without Ray: trajectories hold exactly what the engine sampled, tool
tokens are masked (for an environment plugin and for agent code through the endpoint alike), and
a hanging, raising or flooding tool ends only its own episode.

The engine is the real hf rollout on the tiny model for the token checks; the fault checks
script the model's turns (token ids of a hermes tool call), since what they test is the
environment's and the rollout's handling, not sampling.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoTokenizer

from polyrl.batch import Batch
from polyrl.envs.chat import ChatTokens
from polyrl.envs.episode import EnvironmentContext
from polyrl.envs.rollout import MultiTurnRollout
from polyrl.interfaces import RolloutContext, SamplingParams
from polyrl.models.tiny import EOS_TOKEN_ID, PAD_TOKEN_ID, build_tiny_model
from polyrl.step.multi_turn import trajectory_batch
from polyrl_env_agent.environment import AgentEnvironment
from polyrl_env_tools.environment import ToolEnvironment
from polyrl_env_tools.tiny import ToolTinyEnvironment
from polyrl_env_tools.tools import function_tool
from polyrl_rollout_hf.engine import HFRolloutEngine

torch.set_num_threads(1)
AGENTS = Path(__file__).parents[1] / "plugins" / "env_agent" / "tests" / "agent_functions.py"


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return build_tiny_model(str(tmp_path_factory.mktemp("tiny")))


@pytest.fixture(scope="module")
def tokenizer(model_path):
    return AutoTokenizer.from_pretrained(model_path)


def settings(**values):
    base = {
        "format": "hermes",
        "env_timeout_s": 30.0,
        "max_assistant_turns": 3,
        "max_user_turns": None,
        "max_tool_response_length": 64,
        "tool_response_truncate_side": "middle",
        "max_tokens_per_turn": None,
        "max_parallel_calls": 1,
        "tool_timeout_s": 1.0,
        "max_tool_output_bytes": 1024,
    }
    return OmegaConf.create({**base, **values})


def env_context(multi_turn):
    cfg = OmegaConf.create({"actor_rollout_ref": {"rollout": {"multi_turn": multi_turn}}})
    return EnvironmentContext(config=cfg)


def rows_and_prompts(tokenizer, count):
    messages = [{"role": "user", "content": "hi"}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prompt = tokenizer(ids, add_special_tokens=False)["input_ids"]
    rows = [
        {"messages": messages, "ground_truth": str(i % 10), "extra_info": {}} for i in range(count)
    ]
    return rows, [prompt] * count


def tool_rollout(env, tokenizer, multi_turn, max_response_length, max_prompt_length):
    return MultiTurnRollout(
        env,
        ChatTokens(tokenizer, [EOS_TOKEN_ID]),
        multi_turn,
        max_response_length=max_response_length,
        max_prompt_length=max_prompt_length,
    )


def tool_tiny(multi_turn):
    return ToolTinyEnvironment(env_context(multi_turn))


def lookup_agent(multi_turn):
    """The same task driven by an agent function through polyrl-env-agent's endpoint."""
    agent = {
        "agent_function": f"{AGENTS}:lookup_agent",
        "agent_timeout_s": 30.0,
        "agent_max_concurrency": None,
    }
    return AgentEnvironment(env_context(OmegaConf.merge(multi_turn, agent)))


@pytest.mark.parametrize("environment", [tool_tiny, lookup_agent])
def test_trajectories_hold_the_sampled_tokens_and_mask_the_tools(
    model_path, tokenizer, environment
):
    engine = HFRolloutEngine(
        RolloutContext(
            model_path=model_path,
            config={"dtype": "float32"},
            device="cpu",
            rank=0,
            world_size=1,
            max_prompt_length=32,
            max_response_length=48,
            pad_token_id=PAD_TOKEN_ID,
            eos_token_ids=[EOS_TOKEN_ID],
        )
    )
    sampled: list[Batch] = []

    def generate(batch, params):
        out = engine.generate(batch, params)
        sampled.append(out)
        return out

    multi_turn = settings(max_assistant_turns=2, max_tokens_per_turn=8)
    env = environment(multi_turn)
    rollout = tool_rollout(env, tokenizer, multi_turn, 48, 32)
    rows, prompts = rows_and_prompts(tokenizer, 3)
    try:
        trajectories, metrics = rollout.run(rows, prompts, generate, SamplingParams(seed=3))
    finally:
        env.close()
    assert len(sampled) == 2  # both turns of all three episodes sampled together
    batch = trajectory_batch(trajectories, 48, PAD_TOKEN_ID)
    for i, traj in enumerate(trajectories):
        first = sampled[0]["responses"][i, : int(sampled[0]["response_mask"][i].sum())].tolist()
        first_lp = sampled[0]["rollout_log_probs"][i, : len(first)]
        second_n = int(sampled[1]["response_mask"][i].sum())
        second = sampled[1]["responses"][i, :second_n].tolist()
        response = batch["responses"][i].tolist()
        mask = batch["response_mask"][i]
        assert response[: len(first)] == first  # exactly what was sampled, never re-tokenized
        assert torch.equal(batch["rollout_log_probs"][i, : len(first)], first_lp)
        n_tokens = len(traj.tokens)
        obs = response[len(first) : n_tokens - len(second)]
        assert response[n_tokens - len(second) : n_tokens] == second
        assert mask[: len(first)].all() and mask[n_tokens - len(second) : n_tokens].all()
        assert not mask[len(first) : n_tokens - len(second)].any()  # the tool's tokens
        text = tokenizer.decode(obs)
        assert f"secret {rows[i]['ground_truth']}" in text and "<|im_start|>tool" in text
        assert batch["attention_mask"][i, -48:][:n_tokens].all()  # the model reads them
    assert metrics["multi_turn/assistant_turns/mean"] == 2.0
    assert metrics["multi_turn/end/done"] == 1.0


def scripted(tokenizer, rounds):
    """A generate function answering the live rows of round ``k`` with ``rounds[k]``."""
    count = {"k": 0}

    def generate(batch, params):
        texts = rounds[count["k"]]
        count["k"] += 1
        assert len(texts) == len(batch)
        ids = [tokenizer(t, add_special_tokens=False)["input_ids"] + [EOS_TOKEN_ID] for t in texts]
        width = max(map(len, ids))
        responses = torch.full((len(ids), width), PAD_TOKEN_ID)
        mask = torch.zeros((len(ids), width), dtype=torch.long)
        for i, row in enumerate(ids):
            responses[i, : len(row)] = torch.tensor(row)
            mask[i, : len(row)] = 1
        log_probs = -mask.float()
        return Batch(
            {"responses": responses, "response_mask": mask, "rollout_log_probs": log_probs}
        )

    return generate


def call(name):
    return f'<tool_call>{{"name": "{name}", "arguments": {{}}}}</tool_call>'


def test_a_hanging_a_raising_and_a_flooding_tool_end_only_their_episodes(tokenizer, capsys):
    def hang():
        time.sleep(30)

    def fail():
        raise RuntimeError("broken tool")

    def flood():
        print("x" * 100_000_000)
        return "done"

    def good():
        return "the answer is 4"

    empty = {"type": "object", "properties": {}}
    tools = [
        function_tool(f, {"name": f.__name__, "description": "", "parameters": empty})
        for f in (hang, fail, flood, good)
    ]
    multi_turn = settings()
    env = ToolEnvironment(env_context(multi_turn), tools=tools)
    rollout = tool_rollout(env, tokenizer, multi_turn, 400, 64)
    rounds = [[call("hang"), call("fail"), call("flood"), call("good")], ["4", "4"]]
    generate = scripted(tokenizer, rounds)
    rows, prompts = rows_and_prompts(tokenizer, 4)
    started = time.monotonic()
    trajectories, metrics = rollout.run(rows, prompts, generate, SamplingParams())
    assert time.monotonic() - started < 10  # the hanging tool cost its 1 s limit, not 30 s
    reasons = [t.end_reason for t in trajectories]
    assert reasons == ["tool_timeout", "tool_error", "done", "done"]
    assert metrics["multi_turn/end/tool_timeout"] == 0.25
    assert metrics["multi_turn/end/tool_error"] == 0.25
    assert trajectories[2].metrics["tool_output_dropped_bytes"] > 99_000_000
    assert "x" * 2000 not in capsys.readouterr().out  # nothing of the flood reached the log
    assert trajectories[3].assistant_turns == 2 and trajectories[3].last_text == "4"


def test_the_gen_stage_releases_the_kept_kv_after_the_last_turn(model_path, tokenizer):
    """``run_episodes`` (the multi-turn gen stage) asks every rollout worker to drop its prefix
    cache once the episodes' last turn is sampled: nothing stays on the device through the
    update."""
    from types import SimpleNamespace

    from polyrl.api.testing import ScriptedRoles
    from polyrl.step.multi_turn import run_episodes

    engine = HFRolloutEngine(
        RolloutContext(
            model_path=model_path,
            config={"dtype": "float32", "engine_kwargs": {"hf": {"prefix_cache": "true"}}},
            device="cpu",
            rank=0,
            world_size=1,
            pad_token_id=PAD_TOKEN_ID,
            eos_token_ids=[EOS_TOKEN_ID],
        )
    )
    kept_at_release: list[int] = []

    def release():
        kept_at_release.append(len(engine.prefix_cache))
        engine.reset_prefix_cache()

    roles = ScriptedRoles(
        {"rollout.generate": engine.generate, "rollout.reset_prefix_cache": release}
    )
    rows, prompts = rows_and_prompts(tokenizer, 2)
    width = max(map(len, prompts))
    ids = torch.tensor([[PAD_TOKEN_ID] * (width - len(p)) + p for p in prompts])
    batch = Batch({"input_ids": ids, "attention_mask": (ids != PAD_TOKEN_ID).long()})
    for key in ("messages", "ground_truth", "extra_info"):
        batch[key] = [row[key] for row in rows]
    multi_turn = settings(max_assistant_turns=2, max_tokens_per_turn=8)
    env = tool_tiny(multi_turn)
    rollout = tool_rollout(env, tokenizer, multi_turn, 48, 32)
    params = SamplingParams(n=2, max_new_tokens=48, greedy=True)
    try:
        run_episodes(SimpleNamespace(workers=roles, tokenizer=tokenizer), rollout, batch, params)
    finally:
        env.close()
    methods = [(call.method, call.dispatch.name) for call in roles.calls]
    assert methods[-1] == ("reset_prefix_cache", "BROADCAST")
    assert [m for m, _ in methods[:-1]] == ["generate", "generate"]  # two turns
    assert kept_at_release[0] > 0 and len(engine.prefix_cache) == 0


def test_model_code_trying_to_escape_the_python_tools_sandbox_stays_in_its_episode(
    tokenizer, tmp_path
):
    """Model-written programs run by the ``python`` tool in polyrl's sandbox: one tries the
    network, one writes outside its folder, one kills the driver (this process), one never ends.
    Each gets its failure as the tool's message, nothing escapes, and every episode goes on to
    answer."""
    import json
    import os
    import socket

    from polyrl_env_tools.builtin_tools import PYTHON_SCHEMA, python

    outside = tmp_path / "escaped.txt"
    programs = {
        "network": "import socket\nsocket.create_connection(('127.0.0.1', PORT), timeout=2)\n"
        "print('connected')",
        "write": f"open({str(outside)!r}, 'w').write('out')\nprint('written')",
        "driver": f"import os, signal\nos.kill({os.getpid()}, signal.SIGKILL)\nprint('killed')",
        "forever": "while True:\n    pass",
    }
    with socket.socket() as listener:  # a server the network attempt would reach
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(0)
        port = listener.getsockname()[1]

        def code_call(code: str) -> str:
            arguments = json.dumps({"code": code.replace("PORT", str(port))})
            return f'<tool_call>{{"name": "python", "arguments": {arguments}}}</tool_call>'

        multi_turn = settings(tool_timeout_s=15.0)
        env = ToolEnvironment(
            env_context(multi_turn), tools=[function_tool(python, PYTHON_SCHEMA["function"])]
        )
        rollout = tool_rollout(env, tokenizer, multi_turn, 600, 64)
        rounds = [[code_call(c) for c in programs.values()], ["4"] * len(programs)]
        rows, prompts = rows_and_prompts(tokenizer, len(programs))
        trajectories, metrics = rollout.run(
            rows, prompts, scripted(tokenizer, rounds), SamplingParams()
        )
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing connected
    assert [t.end_reason for t in trajectories] == ["done"] * len(programs)
    assert all(t.assistant_turns == 2 and t.last_text == "4" for t in trajectories)
    texts = [tokenizer.decode(t.tokens) for t in trajectories]
    replies = [text.split("<|im_start|>tool")[1].split("<|im_end|>")[0] for text in texts]
    for name, reply in zip(programs, replies):
        assert not {"connected", "written", "killed"} & set(reply.split()), (name, reply)
        assert "exit code" in reply or "stopped" in reply, (name, reply)
    assert "stopped: over" in replies[3]
    assert not outside.exists()
    assert metrics["multi_turn/tool_calls/mean"] == 1.0
