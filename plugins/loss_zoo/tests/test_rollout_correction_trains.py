"""End to end: verl's two rollout-correction examples (examples/rollout_correction/*.sh), their
``algorithm.rollout_correction.*`` lines as written, and the decoupled mode train the
tiny_digits task and learn, in one process without Ray (``IN_PROCESS_OVERRIDES``). Four
mini-batches per step make the later ones off-policy to the rollout, so the weights and the
rejection have something to correct."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polyrl.api.testing import IN_PROCESS_OVERRIDES, run_polyrl_here

pytestmark = pytest.mark.slow

RC = "algorithm.rollout_correction"
VAL_REWARD = "val-core/polyrl/tiny_digits/reward/mean@1"
MIN_GAIN = 0.2  # greedy reward before training is 0.0; these runs reach about 0.5
MINI_BATCHES = (
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
)
EXAMPLES = {
    # run_with_rollout_corr.sh: RLOO, self-normalised sequence IS, REINFORCE
    "rloo": (
        f"{RC}.rollout_is=sequence",
        f"{RC}.rollout_is_threshold=2.0",
        f"{RC}.rollout_is_batch_normalize=true",
        f"{RC}.rollout_rs=null",
        f"{RC}.rollout_rs_threshold=null",
        f"{RC}.bypass_mode=true",
        f"{RC}.loss_type=reinforce",
    ),
    # run_with_rollout_corr_multi_rs.sh: GRPO, PPO-clip, token_k1 and seq_max_k2 rejection
    "grpo": (
        f"{RC}.rollout_is=token",
        f"{RC}.rollout_is_threshold=2.0",
        f"{RC}.rollout_is_batch_normalize=false",
        f"{RC}.rollout_rs='token_k1,seq_max_k2'",
        f"{RC}.rollout_rs_threshold='0.6_1.6,2.5'",
        f"{RC}.bypass_mode=true",
        f"{RC}.loss_type=ppo_clip",
    ),
    # the decoupled mode (bypass_mode=false): a stage before adv, the weights on vanilla PPO
    "grpo-decoupled": (
        f"{RC}.rollout_is=sequence",
        f"{RC}.rollout_is_batch_normalize=true",
        f"{RC}.rollout_rs='token_k1,seq_max_k2'",
        f"{RC}.rollout_rs_threshold='0.6_1.6,2.5'",
    ),
}
IS_METRICS = ("rollout_corr/rollout_is_mean", "rollout_corr/kl", "rollout_corr/chi2_token")
RS_METRICS = ("rollout_corr/rollout_rs_masked_fraction", "rollout_corr/rollout_rs_token_k1_mean")
METRICS = {
    "rloo": (*IS_METRICS, "rollout_corr/rollout_is_batch_norm_factor"),
    "grpo": (*IS_METRICS, *RS_METRICS),
    "grpo-decoupled": (
        *IS_METRICS,
        *RS_METRICS,
        "rollout_corr/rollout_is_batch_norm_factor",
        "timing_s/rollout_correction",
    ),
}


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_verls_example_trains_and_logs_verls_metrics(example: str, tmp_path: Path) -> None:
    proc = run_polyrl_here(  # in this test process: no interpreter start-up
        "train",
        f"recipe={example.split('-')[0]}",
        *EXAMPLES[example],
        *MINI_BATCHES,
        *IN_PROCESS_OVERRIDES,
        "trainer.logger=[jsonl]",
        f"trainer.default_local_dir={tmp_path}",
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    before, steps = records[0], records[1:]
    assert steps[-1][VAL_REWARD] > before[VAL_REWARD] + MIN_GAIN
    for name in METRICS[example]:
        assert all(name in step for step in steps), name
    assert all(step["actor/optimizer_steps"] == 4 for step in steps)
    if not example.endswith("decoupled"):
        # per micro-batch against the current policy: the later mini-batches train on a policy
        # the rollout did not sample from (the decoupled stage weighs the old policy, which in
        # sync mode sampled the batch itself)
        assert max(step["rollout_corr/rollout_is_max"] for step in steps) > 1.01
