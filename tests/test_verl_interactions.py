"""verl's interactions (``multi_turn.interaction_config_path``) in the ``tools`` environment:
the row's interaction answers each turn without tool calls as the user, its score is the
episode's reward, and a verl interaction config (verl's own GSM8K class under verl's name, or a
user's class from a file) works as written.

The rollout checks script the model's turns (what they test is the environment's handling); the
training run is real: the tiny model in a 2-step GRPO run whose rewards are exactly the scores
a user's interaction class gave.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_multi_turn_rollout import env_context, rows_and_prompts, scripted, settings
from test_recipes_policy_gradient import train

from polyrl.config import load_config
from polyrl.config.validate import validate_config
from polyrl.envs.chat import ChatTokens
from polyrl.envs.rollout import MultiTurnRollout
from polyrl.errors import ConfigError
from polyrl.interfaces import SamplingParams
from polyrl.models.tiny import EOS_TOKEN_ID, build_tiny_model
from polyrl_env_tools.environment import ToolEnvironment
from polyrl_env_tools.gsm8k_interaction import CORRECT, INCORRECT
from polyrl_env_tools.interactions import default_name, load_class, read_interaction_config

TEACHER = Path(__file__).parents[1] / "plugins" / "env_tools" / "tests" / "digit_interaction.py"
VERL_GSM8K = "verl.interactions.gsm8k_interaction.Gsm8kInteraction"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(build_tiny_model(str(tmp_path_factory.mktemp("tiny"))))


def interaction_rollout(tokenizer, multi_turn) -> tuple[ToolEnvironment, MultiTurnRollout]:
    """The tools environment without tools, its interactions from ``multi_turn``."""
    env = ToolEnvironment(env_context(multi_turn), tools=[])
    chat = ChatTokens(tokenizer, [EOS_TOKEN_ID])
    return env, MultiTurnRollout(
        env, chat, multi_turn, max_response_length=200, max_prompt_length=64
    )


def write_config(path: Path, *entries: dict) -> str:
    import yaml

    path.write_text(yaml.safe_dump({"interaction": list(entries)}))
    return str(path)


def test_verls_gsm8k_interaction_plays_the_user_and_scores_the_episode(tokenizer, tmp_path):
    path = write_config(tmp_path / "i.yaml", {"name": "gsm8k", "class_name": VERL_GSM8K})
    env, rollout = interaction_rollout(tokenizer, settings(interaction_config_path=path))
    rows, prompts = rows_and_prompts(tokenizer, 3)
    kwargs = {"name": "gsm8k", "query": "q", "ground_truth": "72"}
    rows[0]["extra_info"] = rows[1]["extra_info"] = {"interaction_kwargs": kwargs}
    # row 2 names no interaction: verl refuses such a row; here its episode alone ends
    generate = scripted(tokenizer, [["#### 72", "#### 5"], ["so #### 72"]])
    trajectories, metrics = rollout.run(rows, prompts, generate, SamplingParams())
    right, retried, _ = trajectories
    assert [t.end_reason for t in trajectories] == ["done", "done", "env_error"]
    assert right.result.reward == 1.0 and retried.result.reward == 1.0
    assert right.assistant_turns == 1 and retried.assistant_turns == 2
    # the interaction's answer to the wrong turn is the next user message, masked out
    feedback = [tok for tok, sampled in zip(retried.tokens, retried.assistant) if not sampled]
    assert INCORRECT in tokenizer.decode(feedback)
    assert CORRECT not in tokenizer.decode(right.tokens)  # a finished episode takes no message
    # verl's turn scores, summed per episode: 1 (right at once), 0 + 1 (right on the retry)
    assert metrics["multi_turn/interaction_turn_score/mean"] == pytest.approx(2 / 3)
    assert metrics["multi_turn/error/ValueError/mean"] == pytest.approx(1 / 3)
    assert env.interactions["gsm8k"]._instances == {}  # every episode finalized


def test_a_wrong_answer_to_the_last_turn_scores_zero(tokenizer, tmp_path):
    path = write_config(tmp_path / "i.yaml", {"class_name": VERL_GSM8K})  # named by its class
    _, rollout = interaction_rollout(
        tokenizer, settings(interaction_config_path=path, max_assistant_turns=2)
    )
    rows, prompts = rows_and_prompts(tokenizer, 1)
    rows[0]["extra_info"] = {"interaction_kwargs": {"name": "gsm8k", "ground_truth": "72"}}
    generate = scripted(tokenizer, [["#### 72 maybe #### 7"], ["#### 9"]])
    (traj,), metrics = rollout.run(rows, prompts, generate, SamplingParams())
    assert traj.end_reason == "max_assistant_turns" and traj.result.reward == 0.0
    assert metrics["multi_turn/interaction_turn_score/mean"] == 0.0


def test_an_interaction_config_is_read_as_verl_reads_it(tmp_path):
    assert default_name("pkg.mod.Gsm8kInteraction") == "gsm8k"
    assert default_name("my_file.py:Teacher") == "teacher"
    path = write_config(
        tmp_path / "i.yaml",
        {"class_name": VERL_GSM8K, "config": {"k": 1}},
        {"name": "t", "class_name": f"{TEACHER}:DigitTeacherInteraction"},
    )
    entries = read_interaction_config(path)
    assert [(e.name, e.config) for e in entries] == [
        ("gsm8k", {"k": 1, "name": "gsm8k"}),
        ("t", {"name": "t"}),
    ]
    assert load_class(entries[1].class_name, "here").__name__ == "DigitTeacherInteraction"


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        ([{"config": {}}], "interaction[0] needs a class_name"),
        ([{"class_name": VERL_GSM8K}, {"name": "gsm8k", "class_name": VERL_GSM8K}], "used twice"),
        (
            [{"class_name": "verl.interactions.weather_interaction.WeatherInteraction"}],
            "is verl's, and verl is not installed",
        ),
        ([{"class_name": "no_such_module_xyz.Thing"}], "no module no_such_module_xyz"),
        ([{"class_name": "/no/such/file.py:Thing"}], "no file /no/such/file.py"),
    ],
)
def test_a_bad_interaction_config_is_one_line_in_validate(tmp_path, entries, expected):
    path = write_config(tmp_path / "i.yaml", *entries)
    cfg = load_config(
        [
            "recipe=tiny",
            "actor_rollout_ref.rollout.multi_turn.enable=true",
            f"actor_rollout_ref.rollout.multi_turn.interaction_config_path={path}",
        ]
    )
    problems = validate_config(cfg)
    assert len(problems) == 1 and expected in problems[0], problems


def test_a_class_without_verls_methods_is_refused_in_one_line(tmp_path):
    module = tmp_path / "half.py"
    module.write_text("class Half:\n    async def start_interaction(self, i, **k): return i\n")
    with pytest.raises(ConfigError, match="missing or not async: generate_response, calculate"):
        load_class(f"{module}:Half", "here")


@pytest.mark.slow
def test_a_run_trains_on_the_interactions_scores(tmp_path):
    """recipe=tiny's model in two-turn episodes where a user's interaction class (from a file)
    plays the user: 2 GRPO steps, each step's mean score is the mean of the scores the class
    gave its episodes."""
    rows = [
        {
            "data_source": "polyrl/tiny_digits",
            "prompt": [{"role": "user", "content": f"Write the digit {i % 10}:"}],
            "reward_model": {"style": "rule", "ground_truth": str(i % 10)},
            "extra_info": {
                "index": i,
                "interaction_kwargs": {"name": "teacher", "ground_truth": str(i % 10)},
            },
        }
        for i in range(16)
    ]
    data = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), data)
    log = tmp_path / "scores.jsonl"
    config = write_config(
        tmp_path / "interactions.yaml",
        {
            "name": "teacher",
            "class_name": f"{TEACHER}:DigitTeacherInteraction",
            "config": {"score_log": str(log)},
        },
    )
    records = train(
        "tiny",
        tmp_path / "run",
        f"data.train_files={data}",
        "data.val_files=null",
        "data.max_response_length=64",
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        f"actor_rollout_ref.rollout.multi_turn.interaction_config_path={config}",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
        "actor_rollout_ref.rollout.multi_turn.max_tokens_per_turn=6",
        "trainer.total_training_steps=2",
        "trainer.val_before_train=false",
        "trainer.test_freq=0",
        "trainer.save_freq=0",
    )
    scores = [json.loads(line)["score"] for line in log.read_text().splitlines()]
    per_step = 8 * 4  # data.train_batch_size x rollout.n episodes
    assert [r["step"] for r in records] == [1, 2] and len(scores) == 2 * per_step
    for record, start in zip(records, (0, per_step)):
        step_scores = scores[start : start + per_step]
        assert record["critic/score/mean"] == pytest.approx(sum(step_scores) / per_step)
        # the interaction spoke as the user, and the model answered it
        assert record["multi_turn/user_turns/mean"] > 0
        assert record["multi_turn/assistant_turns/mean"] > 1
        assert "multi_turn/interaction_turn_score/mean" in record


def test_environments_that_do_not_read_interactions_refuse_them(tmp_path):
    path = write_config(tmp_path / "i.yaml", {"class_name": VERL_GSM8K})
    cfg = load_config(
        [
            "recipe=tool_tiny",
            f"actor_rollout_ref.rollout.multi_turn.interaction_config_path={path}",
        ]
    )
    problems = validate_config(cfg)
    assert len(problems) == 1 and "environment=tool_tiny plays its own task" in problems[0]
