"""End to end: ``polyrl train`` on TextArena episodes, as a user runs it (one worker in the
run's process: the environment's plumbing is the point, not Ray).

The tiny random model hardly ever writes a valid ``[n]`` guess, so an episode is mostly two
invalid moves: TextArena warns after the first and ends the game after the second, scoring 0
(no guess to score). What this shows is the plumbing: the run exits 0, episodes span several
turns with the game's messages in them, the game ends them and its reward is the score; learning
is not expected of this model here. The rows are files of :mod:`polyrl_env_textarena.data`, so
the loader's acceptance of ``data_source: textarena`` is covered too.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polyrl.api.testing import IN_PROCESS_OVERRIDES, run_polyrl_here
from polyrl_env_textarena.data import write_games

MULTI_TURN = "actor_rollout_ref.rollout.multi_turn"


@pytest.mark.slow
def test_two_steps_of_guess_the_number_episodes(tmp_path: Path) -> None:
    files = write_games(tmp_path / "games", train_size=8, val_size=4, seed=0)
    args = [
        "train",
        "recipe=tiny",
        *IN_PROCESS_OVERRIDES,
        f"data.train_files={files['train']}",
        f"data.val_files={files['val']}",
        "data.max_prompt_length=320",  # the game's rules are 310 tokens of the tiny tokenizer
        "data.max_response_length=256",
        # 4 prompts x 2 samples: the steps take a few seconds
        "data.train_batch_size=4",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        f"{MULTI_TURN}.enable=true",
        f"{MULTI_TURN}.environment=textarena",
        f"{MULTI_TURN}.max_assistant_turns=3",
        f"{MULTI_TURN}.max_tokens_per_turn=8",
        "trainer.total_training_steps=2",
        "trainer.val_before_train=false",
        "trainer.test_freq=0",
        "trainer.save_freq=0",
        "trainer.logger=[jsonl]",
        f"trainer.default_local_dir={tmp_path / 'run'}",
    ]
    proc = run_polyrl_here(*args)  # in this test process: no interpreter start-up
    assert proc.returncode == 0, f"{' '.join(proc.args)} failed:\n{proc.stderr[-6000:]}"
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert r["multi_turn/assistant_turns/mean"] > 1, r
        assert r["multi_turn/user_turns/mean"] >= 1 and r["multi_turn/observation_tokens/mean"] > 0
        assert r["multi_turn/end/done"] + r.get("multi_turn/end/max_assistant_turns", 0) == 1.0
        assert r["multi_turn/textarena/game_over/mean"] > 0
        assert r["multi_turn/textarena/invalid_moves/mean"] >= 1
        assert r["critic/score/mean"] == pytest.approx(r["multi_turn/textarena/reward/mean"])
