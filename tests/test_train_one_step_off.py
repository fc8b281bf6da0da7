"""End to end: one-step off-policy training (``trainer.async_mode=one_step_off``) on
``recipe=tiny`` with split placement on CPU: 1 trainer and 1 rollout worker, each in a pool of
its own, hosted in the test's process (``trainer.worker_backend=in_process``, as
:func:`~test_train_tiny.polyrl_train` runs it).

One 24-step run learns; a second run resumed from its step-18 checkpoint (into another folder)
must finish bitwise equal to it: the checkpoint holds the batch generated ahead by a policy it no
longer has, and the loader, the stages and the policy versions must line up with it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_train_tiny import final_weights, polyrl_train, read_records

pytestmark = pytest.mark.slow

ONE_STEP_OFF = (
    "actor_rollout_ref.hybrid_engine=false",
    "actor_rollout_ref.rollout.n_gpus_per_node=1",
    "trainer.n_gpus_per_node=1",
    "trainer.async_mode=one_step_off",
    "actor_rollout_ref.actor.tis_imp_ratio_cap=2.0",
    "trainer.total_training_steps=24",
    "trainer.save_freq=18",
    "trainer.test_freq=-1",
    "trainer.val_before_train=false",
)


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("one_step_off")
    polyrl_train(out, *ONE_STEP_OFF)
    return out


def test_one_step_off_learns_on_samples_one_version_behind(straight: Path) -> None:
    records = read_records(straight)
    assert [r["step"] for r in records] == list(range(1, 25))
    assert [r["async/staleness/max"] for r in records] == [0.0] + [1.0] * 23
    assert [r["async/policy_version"] for r in records] == [float(s) for s in range(24)]
    for record in records[1:]:
        assert 0.0 <= record["actor/tis_clipfrac"] <= 1.0
        assert record["actor/tis_weight_mean"] > 0.0
        assert "timing_s/gen_wait" in record and "timing_s/update_weights" in record
    scores = [r["critic/score/mean"] for r in records]
    first, last = sum(scores[:6]) / 6, sum(scores[-6:]) / 6
    assert last > first + 0.1, f"reward did not rise: first steps {scores[:6]}, last {scores[-6:]}"


def test_resume_from_the_middle_is_bitwise_like_the_straight_run(
    straight: Path, tmp_path: Path
) -> None:
    resumed = tmp_path / "resumed"
    run = polyrl_train(
        resumed,
        *ONE_STEP_OFF,
        "trainer.resume_mode=resume_path",
        f"trainer.resume_from_path={straight / 'global_step_18'}",
    )
    assert "resumed from" in run.stderr
    records = read_records(resumed)
    assert [r["step"] for r in records] == list(range(19, 25))
    for x, y in zip(read_records(straight)[18:], records, strict=True):
        for name in ("critic/score/mean", "actor/pg_loss", "actor/tis_weight_mean"):
            assert x[name] == y[name], (x["step"], name)
    a, b = final_weights(straight), final_weights(resumed)
    different = [name for name in a if not (a[name] == b[name]).all()]
    assert a.keys() == b.keys() and not different, f"weights differ after resume: {different[:5]}"
