"""``polyrl validate`` on DPO configs: the recipe passes, each setting that would split a pair or
mis-weight the loss is one line, and the data files are checked as preference files."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from polyrl.config.loader import load_config
from polyrl.config.validate import validate_config
from polyrl.data.generate import tiny_digits_rows


def problems(*overrides: str) -> list[str]:
    return validate_config(load_config(["recipe=dpo", *overrides]))


def test_the_recipe_is_valid_and_the_algorithm_sets_the_pair_arithmetic() -> None:
    assert problems() == []
    cfg = load_config(["recipe=dpo", "data.train_batch_size=8"])
    actor = cfg.actor_rollout_ref.actor
    assert actor.ppo_mini_batch_size == 8  # one optimizer step per batch of pairs
    assert cfg.actor_rollout_ref.rollout.n == 2
    assert actor.policy_loss.loss_mode == "dpo"
    assert actor.loss_agg_mode == "token-mean"  # a sequence-level loss ignores it
    assert problems("actor_rollout_ref.actor.policy_loss.loss_mode=ipo") == []


def test_settings_that_would_split_pairs_or_misweight_the_loss() -> None:
    found = problems(
        "actor_rollout_ref.actor.shuffle=true",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.actor.policy_loss.loss_mode=vanilla",
        "actor_rollout_ref.rollout.temperature=0.7",
        "plugins.dpo.beta=-1",
    )
    expected = [
        "shuffle=true would separate the two rows of a pair",
        "one optimizer step per batch of pairs",
        "loss_mode='vanilla': algorithm dpo trains with a preference loss, dpo or ipo",
        "rollout.temperature=0.7",
        "plugins.dpo.beta=-1.0 must be > 0",  # typed: the section is DPOSettings
    ]
    for fragment in expected:
        assert any(fragment in line for line in found), (fragment, found)
    odd = problems("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1")
    assert any("ppo_micro_batch_size_per_gpu=1 must be even" in line for line in odd)
    assert any("rollout.n must be 2" in line for line in problems("actor_rollout_ref.rollout.n=4"))
    assert any("unknown key plugins.dpo.bta" in line for line in problems("plugins.dpo.bta=1"))


def test_data_files_are_checked_as_preference_files(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.parquet"
    pq.write_table(pa.Table.from_pylist(tiny_digits_rows(size=4, seed=0, split="train")), prompts)
    (line,) = problems(f"data.train_files={prompts}", "data.val_files=null")
    assert line.startswith(f"data.train_files: '{prompts}' is not a preference file")
    assert "lacks chosen, rejected" in line
    implicit = tmp_path / "implicit.parquet"  # TRL's implicit prompt: no prompt column
    conversation = [{"role": "user", "content": "Repeat 3:"}, {"role": "assistant", "content": "3"}]
    pq.write_table(
        pa.Table.from_pylist([{"chosen": conversation, "rejected": conversation}]), implicit
    )
    assert problems(f"data.train_files={implicit}", f"data.val_files={implicit}") == []


def test_a_step_without_a_reward_model_role_refuses_reward_model_enable() -> None:
    (line,) = problems("reward_model.enable=true", "reward_model.model.path=/nowhere")
    assert line.startswith("reward_model.enable=true: the selected algorithm 'dpo'")
    assert "no 'reward_model' role" in line
