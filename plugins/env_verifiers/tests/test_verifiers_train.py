"""End to end: ``polyrl train`` on a verifiers MultiTurnEnv, as a user runs it (recipe=tiny: the
random builtin:tiny model, one worker in the run's process: the environment's plumbing is the
point, not Ray).

The tiny model seldom writes the answer (a digit, by chance: one episode of 32 did in a measured
run), so most episodes are RetryEnv's user answering "Wrong, try again." until its max_turns=2
stops them. What this shows is the plumbing: the run exits 0, episodes span up to two assistant
turns with the environment's user turn between them, the environment's stop conditions end them
(never polyrl's limit of 4), and the score the trainer sees is the rubric's weighted sum
(says_answer + turns_left, weights 1 and 1, averaged over the batch).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from polyrl.api.testing import IN_PROCESS_OVERRIDES

MULTI_TURN = "actor_rollout_ref.rollout.multi_turn"


@pytest.mark.slow
def test_two_steps_on_a_verifiers_multi_turn_env(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "polyrl",
        "train",
        "recipe=tiny",
        *IN_PROCESS_OVERRIDES,
        "data.max_response_length=64",
        f"{MULTI_TURN}.enable=true",
        f"{MULTI_TURN}.environment=verifiers",
        f"{MULTI_TURN}.verifiers_env=vf_envs:multi_turn",
        f"+{MULTI_TURN}.verifiers_env_args.max_turns=2",
        f"{MULTI_TURN}.max_assistant_turns=4",
        f"{MULTI_TURN}.max_tokens_per_turn=8",
        "trainer.total_training_steps=2",
        "trainer.val_before_train=false",
        "trainer.test_freq=0",
        "trainer.save_freq=0",
        "trainer.logger=[jsonl]",
        f"trainer.default_local_dir={tmp_path / 'run'}",
    ]
    path = os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stderr[-6000:]}"
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        turns = r["multi_turn/assistant_turns/mean"]
        assert 1.0 < turns <= 2.0, r
        assert r["multi_turn/user_turns/mean"] == pytest.approx(turns - 1.0)
        assert r["multi_turn/observation_tokens/mean"] > 0
        assert r["multi_turn/end/done"] == 1.0
        assert r["multi_turn/verifiers/num_turns/mean"] == pytest.approx(turns)
        assert r["multi_turn/verifiers/scored/mean"] == 1.0
        rubric = (
            r["multi_turn/verifiers/says_answer/mean"] + r["multi_turn/verifiers/turns_left/mean"]
        )
        assert r["critic/score/mean"] == pytest.approx(rubric)
