"""End to end: ``polyrl train recipe=ppo`` (PPO with a critic, GAE), as a user runs it: over
Ray with 2 CPU workers the policy learns, verl's critic metrics are logged on every step, the
critic is checkpointed (both ranks' shards) in each step folder next to the actor; and with one
worker in the run's process, a resumed run continues bitwise like an uninterrupted one, critic
included."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_train_tiny import polyrl_train, read_records, split_records, train_straight_and_resumed

pytestmark = pytest.mark.slow

VAL_REWARD = "val-core/polyrl/tiny_digits/reward/mean@1"
CRITIC_METRICS = (
    "critic/vf_loss",
    "critic/vf_clipfrac",
    "critic/vpred_mean",
    "critic/values/mean",
    "critic/returns/mean",
    "critic/vf_explained_var",
    "critic/grad_norm",
    "critic/lr",
    "timing_s/values",
    "timing_s/update_critic",
)


@pytest.fixture(scope="module")
def learning_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ppo_learning")
    polyrl_train(out, "recipe=ppo", "trainer.logger=[jsonl]", over_ray=True)
    return out


def test_ppo_learns_with_the_critic_metrics_on_every_step(learning_run: Path) -> None:
    val_before, records = split_records(read_records(learning_run))
    assert [r["step"] for r in records] == list(range(1, 31))
    for record in records:
        missing = [name for name in CRITIC_METRICS if name not in record]
        assert not missing, f"step {record['step']} lacks {missing}"
    scores = [r["critic/score/mean"] for r in records]
    first, last = sum(scores[:6]) / 6, sum(scores[-6:]) / 6
    assert last > first + 0.1, f"reward did not rise: first steps {scores[:6]}, last {scores[-6:]}"
    assert val_before is not None
    before, after = val_before[VAL_REWARD], records[-1][VAL_REWARD]
    assert after > before + 0.2, f"validation reward {before} -> {after}"
    # the critic learns: its loss falls from the first steps (a fresh head) to the last
    losses = [r["critic/vf_loss"] for r in records]
    assert sum(losses[-6:]) < sum(losses[:6])


def test_the_critic_is_checkpointed_in_each_step_folder(learning_run: Path) -> None:
    for step in (10, 20, 30):
        folder = learning_run / f"global_step_{step}"
        assert (folder / "actor" / ".metadata").is_file()
        assert (folder / "critic" / ".metadata").is_file()
        assert sorted(p.name for p in (folder / "critic").glob("*.distcp")) == [
            "__0_0.distcp",
            "__1_0.distcp",
        ]


def test_resume_continues_bitwise_like_an_uninterrupted_run_critic_included(
    tmp_path: Path,
) -> None:
    """Shuffled off-policy updates of both the actor and the critic, and a critic warm-up that
    holds the actor at step 1: the critic's weights, optimizer and the step's plan must all
    resume exactly for the values (and so the advantages) of steps 3 and 4 to match."""
    steps = (
        "recipe=ppo",
        "trainer.save_freq=2",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        "trainer.critic_warmup=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.actor.ppo_epochs=2",
        "actor_rollout_ref.actor.shuffle=true",
        "critic.ppo_mini_batch_size=2",
        "critic.ppo_micro_batch_size_per_gpu=4",
        "critic.shuffle=true",
    )
    straight_records, resumed_records = train_straight_and_resumed(tmp_path, steps)
    assert [r["step"] for r in resumed_records] == [1, 2, 3, 4]
    assert "actor/pg_loss" not in straight_records[0]  # step 1: the critic's warm-up
    assert all("actor/pg_loss" in r for r in straight_records[1:])
    for x, y in zip(straight_records[2:], resumed_records[2:], strict=True):
        compared = [k for k in x if k.startswith(("critic/", "actor/"))]
        assert {k: x[k] for k in compared} == {k: y[k] for k in compared}
    assert all(r["critic/optimizer_steps"] == 8 for r in straight_records)
