"""End to end: ``polyrl train recipe=tiny actor_rollout_ref.actor.strategy=deepspeed`` over Ray with
2 CPU workers (gloo), as a user runs it: GRPO learns with the DeepSpeed engine (ZeRO-2, the
default stage) for the actor and its frozen reference, the checkpoint is DeepSpeed's and a second
run resumes from it, and the exported model loads with transformers."""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path

import pytest
from test_train_tiny import polyrl_train, read_records, split_records

# Located, not imported: collecting this file must not load DeepSpeed into the test process.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        find_spec("deepspeed") is None, reason="pip install 'polyrl-engine-deepspeed[cpu]'"
    ),
]

STRATEGY = "actor_rollout_ref.actor.strategy=deepspeed"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """20 steps with a checkpoint at 10 and 20, then a run to 22 steps in the same folder."""
    out = tmp_path_factory.mktemp("tiny_deepspeed")
    polyrl_train(
        out, STRATEGY, "trainer.total_training_steps=20", "trainer.save_freq=10", over_ray=True
    )
    resumed = polyrl_train(
        out,
        STRATEGY,
        "trainer.total_training_steps=22",
        "trainer.save_freq=-1",
        "trainer.test_freq=-1",
        over_ray=True,
    )
    return out, resumed.stderr


def test_grpo_learns_with_deepspeed(run: tuple[Path, str]) -> None:
    out, _ = run
    val_before, records = split_records(read_records(out))
    assert val_before is not None
    scores = [r["critic/score/mean"] for r in records[:20]]
    first, last = sum(scores[:5]) / 5, sum(scores[-5:]) / 5
    assert last > first + 0.05, f"reward did not rise: first steps {scores[:5]}, last {scores[-5:]}"
    validation = [
        r["val-core/polyrl/tiny_digits/reward/mean@1"]
        for r in records[:20]
        if any(k.startswith("val-core/") for k in r)
    ]
    assert validation[-1] > 0.3
    assert all(r["actor/grad_norm"] > 0 and "actor/skipped_step" not in r for r in records)


def test_checkpoint_is_deepspeeds_and_a_run_resumes_from_it(run: tuple[Path, str]) -> None:
    out, stderr = run
    actor = out / "global_step_20" / "actor"
    assert (actor / "polyrl" / "mp_rank_00_model_states.pt").is_file()
    assert (actor / "extra_state_rank_1.pt").is_file()
    assert "resumed from" in stderr
    assert [r["step"] for r in read_records(out)] == [0, *range(1, 21), 21, 22]  # 0: val before


def test_exported_model_loads(run: tuple[Path, str]) -> None:
    from transformers import AutoModelForCausalLM

    out, _ = run
    model = AutoModelForCausalLM.from_pretrained(out / "hf_model")
    assert model.config.model_type == "qwen2"
