"""The reward model: its worker role on a real sequence-classification model, the stage that
combines its score with the rule-based one, the config switch, and (slow) a GRPO run on the
tiny model whose reward-model score rises."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf

from polyrl.api.testing import IN_PROCESS_OVERRIDES, run_polyrl_here
from polyrl.batch import Batch
from polyrl.config.loader import load_config
from polyrl.config.validate import validate_config
from polyrl.errors import ConfigError
from polyrl.models.resolve import resolve_model_path
from polyrl.models.tiny import EOS_TOKEN_ID, PAD_TOKEN_ID
from polyrl.plan import build_pipeline
from polyrl.step.pipeline import StepState
from polyrl.step.reward_model import RewardModelStage
from polyrl.workers.roles.base import RoleContext
from polyrl.workers.roles.reward_model import RewardModelRole
from polyrl_algo_dpo.preference import PreferencePair, collate_pairs


@pytest.fixture(scope="module")
def untrained_reward_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny reward model's architecture and tokenizer with an untrained head (fast)."""
    from polyrl.models.tiny_reward_model import build_tiny_reward_model

    return build_tiny_reward_model(str(tmp_path_factory.mktemp("rm")), steps=0)


def rm_config(path: str, *overrides: str) -> Any:
    return load_config(
        ["recipe=tiny", "reward_model.enable=true", f"reward_model.model.path={path}", *overrides]
    )


def role_context(cfg: Any) -> RoleContext:
    return RoleContext(
        role="reward_model",
        cfg=OmegaConf.create(OmegaConf.to_container(cfg, resolve=True)),
        model_path=resolve_model_path("builtin:tiny"),
        rank=0,
        world_size=1,
        device="cpu",
        tokens={"pad_token_id": PAD_TOKEN_ID, "eos_token_ids": [EOS_TOKEN_ID]},
    )


def rollout_rows() -> Batch:
    """Three prompt + response rows of different lengths in the rollout's layout (left-padded
    prompts, right-padded responses)."""
    pairs = [
        PreferencePair([1, 40, 41, 42], [7, 8, 9, EOS_TOKEN_ID], [50, EOS_TOKEN_ID], 0),
        PreferencePair([1, 43], [60, 61, 62, 63, 64, 65], [70], 1),
    ]
    return collate_pairs(pairs, PAD_TOKEN_ID).slice(0, 3)


def test_role_scores_each_row_as_the_model_scores_it_alone(untrained_reward_model: str) -> None:
    from transformers import AutoModelForSequenceClassification

    cfg = rm_config(untrained_reward_model, "reward_model.micro_batch_size_per_gpu=2")
    role = RewardModelRole(role_context(cfg))
    batch = rollout_rows()
    scores = role.compute_rm_score(batch)["rm_scores"]
    model = AutoModelForSequenceClassification.from_pretrained(untrained_reward_model).eval()
    for row in range(len(batch)):
        tokens = batch["input_ids"][row][batch["attention_mask"][row].bool()]
        with torch.no_grad():
            alone = model(input_ids=tokens.unsqueeze(0)).logits[0, 0]
        assert scores[row].item() == pytest.approx(alone.item(), abs=1e-5)


def test_role_refuses_a_reward_model_with_another_tokenizer(
    untrained_reward_model: str, tmp_path: Path
) -> None:
    import shutil

    from transformers import AutoTokenizer

    other = tmp_path / "other_vocab"
    shutil.copytree(untrained_reward_model, other)
    tokenizer = AutoTokenizer.from_pretrained(other)
    tokenizer.add_tokens(["<new_word>"])
    tokenizer.save_pretrained(other)
    with pytest.raises(ConfigError, match="has a tokenizer other than the policy's"):
        RewardModelRole(role_context(rm_config(str(other))))


class FixedScores:
    """A stand-in for the worker group that returns given reward-model scores (a unit test of
    the stage's arithmetic; the role itself is tested above on a real model)."""

    def __init__(self, scores: list[float]) -> None:
        self.scores = torch.tensor(scores)
        self.calls: list[tuple[str, str, list[str]]] = []

    def call(self, role: str, method: str, batch: Batch, **_: Any) -> Batch:
        self.calls.append((role, method, sorted(batch.tensors)))
        return Batch({"rm_scores": self.scores})


def scored_batch() -> Batch:
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    rule = torch.tensor([[0.0, 0.5, 0.0], [1.0, 0.0, 0.0]])
    shaped = rule.clone()
    shaped[0, 0] = -0.25  # a penalty an earlier stage put on the rewards
    zeros = torch.zeros(2, 5, dtype=torch.long)
    return Batch(
        {
            "input_ids": zeros,
            "attention_mask": zeros,
            "position_ids": zeros,
            "response_mask": mask,
            "token_level_scores": rule,
            "token_level_rewards": shaped,
        }
    )


@pytest.mark.parametrize(
    ("combine", "scores"),
    [("replace", [[0.0, 2.0, 0.0], [-1.0, 0.0, 0.0]]), ("sum", [[0.0, 2.5, 0.0], [0.0, 0.0, 0.0]])],
)
def test_stage_puts_the_score_on_the_last_token_and_combines(
    combine: str, scores: list[list[float]], tmp_path: Path
) -> None:
    (tmp_path / "config.json").write_text("{}")
    cfg = rm_config(str(tmp_path), f"reward_model.combine={combine}")
    workers = FixedScores([2.0, -1.0])
    state = StepState(step=1, batch=scored_batch())
    RewardModelStage(cfg).run(state, SimpleNamespace(workers=workers, cfg=cfg))
    batch = state.batch
    assert workers.calls == [
        ("reward_model", "compute_rm_score", ["attention_mask", "input_ids", "position_ids"])
    ]
    assert batch["rm_scores"].tolist() == [[0.0, 2.0, 0.0], [-1.0, 0.0, 0.0]]
    assert batch["token_level_scores"].tolist() == scores
    # The rewards move by exactly the change of the scores: the earlier penalty stays.
    expected_rewards = torch.tensor(scores)
    expected_rewards[0, 0] = -0.25
    assert batch["token_level_rewards"].tolist() == expected_rewards.tolist()
    assert state.metrics == {
        "reward_model/score/mean": 0.5,
        "reward_model/score/max": 2.0,
        "reward_model/score/min": -1.0,
    }


def test_enable_inserts_the_stage_after_reward_and_checks_its_keys(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    cfg = rm_config(str(tmp_path))
    assert validate_config(cfg) == []
    names = build_pipeline(cfg).names()
    assert names[names.index("reward") + 1] == "reward_model"
    assert "reward_model" not in build_pipeline(load_config(["recipe=tiny"])).names()
    (line,) = validate_config(load_config(["recipe=tiny", "reward_model.enable=true"]))
    assert line.startswith("reward_model.enable=true needs reward_model.model.path")
    (line,) = validate_config(rm_config(str(tmp_path), "reward_model.combine=max"))
    assert line == "reward_model.combine='max': use one of replace, sum"
    (line,) = validate_config(rm_config("/tmp"))
    assert "is not a Hugging Face model folder" in line


# ---- slow: the trained tiny reward model, and a run that raises its score ----------------------
@pytest.fixture(scope="module")
def reward_model_path() -> str:
    from polyrl.models.tiny_reward_model import tiny_reward_model_path

    return tiny_reward_model_path()


@pytest.mark.slow
def test_tiny_reward_model_prefers_digits(reward_model_path: str) -> None:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(reward_model_path)
    model = AutoModelForSequenceClassification.from_pretrained(reward_model_path).eval()
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Repeat 7:"}], add_generation_prompt=True, tokenize=False
    )

    def score(response: str) -> float:
        ids = tokenizer(prompt + response, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            return model(input_ids=torch.tensor([[*ids, EOS_TOKEN_ID]])).logits[0, 0].item()

    digits = [score(r) for r in ("7777777", "999", "4181")]
    mixed = [score(r) for r in ("12 ab 34", "a1b2c3d4")]
    words = [score(r) for r in ("hello there friend", "the answer is", "yes no")]
    assert min(digits) > max(mixed) and min(mixed) > max(words), (digits, mixed, words)


@pytest.mark.slow
def test_grpo_on_the_reward_model_raises_its_score(reward_model_path: str, tmp_path: Path) -> None:
    """recipe=tiny with the reward model replacing the rule-based score: the policy's
    reward-model score rises, and the rule-based scorer (still run, its extras logged) sees the
    share of digits it was trained to prefer rise with it."""
    out = tmp_path / "run"
    proc = run_polyrl_here(
        "train",
        "recipe=tiny",
        *IN_PROCESS_OVERRIDES,  # its point is the stage and the role, not Ray
        "reward_model.enable=true",
        f"reward_model.model.path={reward_model_path}",
        "reward_model.combine=replace",
        "trainer.total_training_steps=30",
        "trainer.save_freq=-1",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        f"trainer.default_local_dir={out}",
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 31))
    rm = [r["reward_model/score/mean"] for r in records]
    # With combine=replace the score the advantages see is the model's.
    assert all(
        r["critic/score/mean"] == pytest.approx(r["reward_model/score/mean"]) for r in records
    )
    first, last = sum(rm[:5]) / 5, sum(rm[-5:]) / 5
    assert last > first + 0.15, f"reward-model score did not rise: {rm}"
    digit_frac = [r["reward_extra/digit_frac/mean"] for r in records]
    assert sum(digit_frac[-5:]) / 5 > sum(digit_frac[:5]) / 5 + 0.1, digit_frac
