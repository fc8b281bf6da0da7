"""``recipe=calc_smollm2`` without training: the recipe composes and validates, its data are
reasoning-gym rows, and the ``calculator`` environment with the recipe's prompt keys drives real
multi-turn rollouts (scripted turns, the tiny model's ChatML tokenizer): the prefill ends the
prompt and is never in the loss mask, a call the model ends after its JSON runs the calculator,
a call followed by other text does not parse, a call the calculator answers earns the shaping
reward, and the answer copied from the tool scores 1."""

from __future__ import annotations

from importlib.util import find_spec

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoTokenizer

from polyrl.api import (
    Batch,
    ChatTokens,
    EnvironmentContext,
    MultiTurnRollout,
    SamplingParams,
    assemble,
    default_compute_score,
    load_config,
)
from polyrl.config.validate import validate_config
from polyrl.data.generate import reasoning_gym_rows
from polyrl.data.sources import parse_builtin
from polyrl.models.tiny import EOS_TOKEN_ID, PAD_TOKEN_ID, build_tiny_model
from polyrl_env_tools.calculator import CalculatorEnvironment
from polyrl_env_tools.evaluate import hf_generate

# Located, not imported: collecting this file must not load reasoning_gym into every test process.
pytestmark = pytest.mark.skipif(
    find_spec("reasoning_gym") is None, reason="pip install 'polyrl[reasoning-gym]'"
)


@pytest.fixture(scope="module")
def cfg():
    return load_config(["recipe=calc_smollm2"])


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return AutoTokenizer.from_pretrained(build_tiny_model(str(tmp_path_factory.mktemp("tiny"))))


def test_recipe_validates_and_selects_the_calculator(cfg):
    assert validate_config(cfg) == []
    multi_turn = cfg.actor_rollout_ref.rollout.multi_turn
    assert multi_turn.enable and multi_turn.environment == "calculator"
    assert multi_turn.prefill.endswith('"arguments": {"expression": "')
    assert assemble(cfg).environment.load() is CalculatorEnvironment


def recipe_rows(spec: str, size: int) -> list[dict]:
    """``size`` rows of the recipe's data spec, as an episode gets them."""
    _, task, params = parse_builtin(spec)
    options = {k: v for k, v in params.items() if k not in ("train_size", "val_size", "seed")}
    style = options.pop("prompt_style")
    rows = reasoning_gym_rows(
        str(task), size=size, seed=1, split="val", task_config=options, prompt_style=style
    )
    return [
        {
            "messages": list(r["prompt"]),
            "data_source": r["data_source"],
            "ground_truth": r["reward_model"]["ground_truth"],
            "extra_info": r["extra_info"],
        }
        for r in rows
    ]


def scripted(tokenizer, rounds, contexts):
    """Answers round ``k``'s live rows with ``rounds[k]``; keeps each round's input ids."""

    def generate(batch, params):
        contexts.append(batch["input_ids"])
        texts = rounds[len(contexts) - 1]
        ids = [tokenizer(t, add_special_tokens=False)["input_ids"] + [EOS_TOKEN_ID] for t in texts]
        width = max(map(len, ids))
        responses = torch.full((len(ids), width), PAD_TOKEN_ID)
        mask = torch.zeros((len(ids), width), dtype=torch.long)
        for i, row in enumerate(ids):
            responses[i, : len(row)] = torch.tensor(row)
            mask[i, : len(row)] = 1
        return Batch({"responses": responses, "response_mask": mask})

    return generate


def test_episodes_of_the_recipe_data_call_the_calculator(cfg, tokenizer):
    rows = recipe_rows(str(cfg.data.val_files), 3)
    questions = [r["messages"][-1]["content"] for r in rows]
    assert all(q.startswith("Calculate ") for q in questions)
    expressions = [q.removeprefix("Calculate ").rstrip(".") for q in questions]
    answers = [str(r["ground_truth"]) for r in rows]
    # The tiny model's tokenizer (a small BPE) takes ~4x SmolLM2's tokens for the same text:
    # the recipe's token limits, scaled.
    multi_turn = OmegaConf.merge(
        cfg.actor_rollout_ref.rollout.multi_turn,
        {"max_tokens_per_turn": 4 * cfg.actor_rollout_ref.rollout.multi_turn.max_tokens_per_turn},
    )
    env = CalculatorEnvironment(EnvironmentContext(config=cfg))
    chat = ChatTokens(tokenizer, [EOS_TOKEN_ID])
    rollout = MultiTurnRollout(
        env,
        chat,
        multi_turn,
        max_response_length=4 * int(cfg.data.max_response_length),
        max_prompt_length=4 * int(cfg.data.max_prompt_length),
    )
    rounds = [
        # ended after the JSON; the wrong expression; followed by other text
        [f'{expressions[0]}"}}}}', '1 + 1"}}', f'{expressions[2]}"}}}} The result is'],
        [answers[0], "2", "0"],  # the error message answers the broken call
    ]
    contexts = []
    trajectories, metrics = rollout.run(
        rows, [[EOS_TOKEN_ID]] * 3, scripted(tokenizer, rounds, contexts), SamplingParams()
    )
    prefill = chat.encode(str(multi_turn.prefill))
    schemas = [t.schema for t in env.tools.values()]
    for traj in trajectories:
        assert traj.prompt_ids[-len(prefill) :] == prefill  # the prefill is prompt, not sampled
        system = {"role": "system", "content": multi_turn.system_prompt}
        expected = chat.prompt_ids([system, traj.row["messages"][-1]], schemas)
        assert traj.prompt_ids[: -len(prefill)] == expected
        assert sum(traj.assistant) < len(traj.tokens)  # observation tokens are not trained on
    assert contexts[0][0, -len(prefill) :].tolist() == prefill
    first, wrong, broken = trajectories
    assert first.end_reason == "done" and first.last_text == answers[0]
    assert answers[0] in tokenizer.decode(first.tokens)  # the tool's message, in context...
    assistant_text = tokenizer.decode([t for t, a in zip(first.tokens, first.assistant) if a])
    assert answers[0] in assistant_text.removeprefix(f'{expressions[0]}"}}}}')  # ...and copied
    assert first.metrics["tool_success"] == 1 and first.metrics["tool_result_correct"] == 1
    assert wrong.metrics["tool_success"] == 1 and wrong.metrics["tool_result_correct"] == 0
    assert broken.metrics["tool_success"] == 0 and broken.metrics["tool_errors"] == 1
    assert metrics["multi_turn/tool_success/mean"] == pytest.approx(2 / 3)
    shaping = float(multi_turn.tool_success_reward)
    assert shaping > 0  # on the call's turn (its last token), added to the answer's score
    assert list(first.turn_rewards.values()) == list(wrong.turn_rewards.values()) == [shaping]
    assert broken.turn_rewards == {}
    row = first.row
    score = default_compute_score(
        row["data_source"], first.last_text, row["ground_truth"], row["extra_info"]
    )
    assert float(score["score"] if isinstance(score, dict) else score) == 1.0


def test_hf_generate_masks_after_the_end_of_turn():
    class Model:
        def generate(self, input_ids, **kw):
            tail = torch.tensor([[5, 6, EOS_TOKEN_ID, EOS_TOKEN_ID], [7, 8, 9, 10]])
            return torch.cat([input_ids, tail], dim=1)

    generate = hf_generate(Model(), PAD_TOKEN_ID, EOS_TOKEN_ID)
    ones = torch.ones(2, 3, dtype=torch.long)
    prompts = Batch({"input_ids": ones, "attention_mask": ones})
    out = generate(prompts, SamplingParams(max_new_tokens=4, greedy=True))
    assert out["response_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert out["responses"][0].tolist() == [5, 6, EOS_TOKEN_ID, 0]
