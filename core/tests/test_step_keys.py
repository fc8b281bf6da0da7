"""What the step's stages promise is what a run gets: a stage requiring ``old_log_probs`` gets them
on an on-policy step, the probability-gap metrics are logged whether or not the old log-prob pass
ran, the sampled and the trained scores are told apart, the validation before training is its
own record, and the run summary names only files that exist.

The actor is core's :class:`ActorRole` on 2 data-parallel ranks of the Ray-free worker group, over
an engine that returns fixed log-probs: ``log 0.5`` from its training forward pass, ``log 0.25``
from its log-prob pass, so the numbers below are worked out by hand.
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from polyrl.batch import Batch
from polyrl.config.sections import schema_config
from polyrl.data.training import ValidationResult
from polyrl.interfaces import RolloutEngine, TrainingEngine
from polyrl.registry import get_registry
from polyrl.specs import PluginKind, PolicyLossSpec, RolloutEngineSpec, TrainingEngineSpec
from polyrl.step import PROMPT_BATCH_KEYS, Stage, StepContext, StepPipeline, StepState
from polyrl.step.stages import OldLogProbStage, UpdateActorStage, rollout_mismatch_metrics
from polyrl.testing.plans import worker_plan
from polyrl.trainer.metrics import data_metrics, step_batch_metrics
from polyrl.trainer.trainer import RLTrainer, TrainResult, describe_result
from polyrl.workers.local import LocalWorkerGroup
from polyrl.workers.roles import RoleContext
from polyrl.workers.roles.actor import ActorRole

TRAIN_LOG_PROB = math.log(0.5)  # the engine's training forward pass, every token
EVAL_LOG_PROB = math.log(0.25)  # its log-prob pass (the old_log_prob stage), every token

# Rows x 3 response tokens. Rank 0 gets rows 0-1, rank 1 rows 2-3 (4 and 6 response tokens).
MASK = torch.tensor([[1, 0, 0], [1, 1, 1], [1, 1, 1], [1, 1, 1]], dtype=torch.float32)
# The rollout's probabilities: gaps to the trainer's 0.5 of 0, .1 x 3, (.4, 0, 0), 0 on the
# masked tokens; 0.99 on row 0's padding, which must not count.
ROLLOUT_PROBS = torch.tensor([[0.5, 0.99, 0.99], [0.6, 0.6, 0.6], [0.9, 0.5, 0.5], [0.5, 0.5, 0.5]])
# Over the 10 response tokens: sum .7, mean .07, max .4. (A mean of the ranks' own means would
# be (.3/4 + .4/6) / 2 = .0708, a mean of their maxima .25.)
GAP_MEAN, GAP_MAX = 0.07, 0.4
# Against the log-prob pass's 0.25: .25 x 1, .35 x 3, (.65, .25, .25), .25 x 3: sum 3.2.
OLD_GAP_MEAN, OLD_GAP_MAX = 0.32, 0.65


class FixedEngine(TrainingEngine):
    """Fixed log-probs; each mini-batch reaches the loss one row (micro-batch) at a time."""

    def compute_log_prob(self, batch, *, temperature=1.0, calculate_entropy=False):
        log_prob = torch.full(batch["responses"].shape, EVAL_LOG_PROB)
        return log_prob, (torch.zeros_like(log_prob) if calculate_entropy else None)

    def train_step(self, mini_batch, loss_fn, *, temperature=1.0):
        losses = []
        for row in range(len(mini_batch)):
            micro = mini_batch.select_rows([row])
            log_prob = torch.full(micro["responses"].shape, TRAIN_LOG_PROB, requires_grad=True)
            loss, _ = loss_fn(micro, log_prob, None)
            loss.backward()
            losses.append(float(loss.detach()))
        return {"actor/pg_loss": sum(losses)}

    def named_weights(self):
        yield "w", torch.ones(1)

    def save_checkpoint(self, path):
        pass

    def load_checkpoint(self, path):
        pass

    def export_hf(self, path):
        pass


@pytest.fixture
def fixed_engine(isolated_registry, register_plugin):
    register_plugin(
        [
            TrainingEngineSpec(name="fixed", description="test", engine=FixedEngine),
            RolloutEngineSpec(name="fixed", description="never built", engine=RolloutEngine),
        ]
    )


def config(epochs: int = 1):
    """4 rows, one mini-batch of all of them; ``epochs=1``: on-policy (one optimizer step)."""
    cfg = OmegaConf.merge(
        schema_config(),
        {
            "actor_rollout_ref": {
                "model": {"path": "model"},
                "actor": {"strategy": "fixed", "ppo_epochs": epochs, "ppo_mini_batch_size": 4},
                "rollout": {"name": "fixed", "n": 1},
            },
            "data": {"train_files": "train.parquet", "train_batch_size": 4},
        },
    )
    return OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))


class Roles:
    """The driver's role calls over a local group of 2 actor ranks; records the methods."""

    def __init__(self, cfg) -> None:
        plan = worker_plan(cfg)

        def actor(rank: int, world_size: int) -> ActorRole:
            ctx = RoleContext(
                role="actor",
                cfg=cfg,
                model_path="/models/none",
                rank=rank,
                world_size=world_size,
                device="cpu",
                total_training_steps=1,
                tokens={"pad_token_id": 0, "eos_token_ids": [1]},
                plan=plan,
            )
            return ActorRole(ctx)

        self.group = LocalWorkerGroup(actor, world_size=2)
        self.methods: list[str] = []

    def call(self, role, method, *args, dispatch):
        assert role == "actor"
        self.methods.append(method)
        return self.group.call(method, *args, dispatch=dispatch)

    def dp_size(self, role):
        return 2


def scored_batch() -> Batch:
    rows = len(MASK)
    return Batch(
        {
            "input_ids": torch.ones(rows, 5, dtype=torch.long),
            "attention_mask": torch.cat([torch.ones(rows, 2), MASK], 1),
            "position_ids": torch.zeros(rows, 5, dtype=torch.long),
            "responses": torch.ones(rows, 3, dtype=torch.long),
            "response_mask": MASK.clone(),
            "advantages": torch.ones(rows, 3),
            "rollout_log_probs": ROLLOUT_PROBS.log(),
        }
    )


class ReadsOldLogProbs(Stage):
    """A plugin's stage reading ``old_log_probs`` (a diagnostic, a reward shaping ...)."""

    requires = ("old_log_probs", "response_mask")

    def __init__(self, name: str) -> None:
        self.name = name
        self.seen: list[torch.Tensor] = []

    def run(self, state: StepState, ctx: StepContext) -> None:
        self.seen.append(state.batch["old_log_probs"].clone())


def run_step(cfg, stages):
    roles = Roles(cfg)
    ctx = StepContext(cfg, roles, tokenizer=None, reward=None, next_prompts=None)
    pipeline = StepPipeline(stages)
    keys = (*PROMPT_BATCH_KEYS, "responses", "response_mask", "advantages", "rollout_log_probs")
    assert pipeline.check(keys) == []
    state = pipeline.run(StepState(step=1, batch=scored_batch()), ctx)
    return state, roles


# ---- old_log_probs: provided whenever a stage other than the update reads them --------------


@pytest.mark.parametrize("where", ["before", "after"])
def test_a_plugin_stage_gets_old_log_probs_on_an_on_policy_step(fixed_engine, where):
    cfg = config(epochs=1)
    reader = ReadsOldLogProbs("diagnostic")
    update = UpdateActorStage(cfg)
    stages = (
        [OldLogProbStage(), reader, update]
        if where == "before"
        else [
            OldLogProbStage(),
            update,
            reader,
        ]
    )
    state, roles = run_step(cfg, stages)
    assert roles.methods == ["compute_log_prob", "update"]
    (seen,) = reader.seen
    assert torch.allclose(seen, torch.full((4, 3), EVAL_LOG_PROB))
    # the old log-prob pass ran, so the gap metrics come from it (the rollout vs 0.25)
    assert state.metrics["training/rollout_probs_diff_mean"] == pytest.approx(OLD_GAP_MEAN)
    assert state.metrics["training/rollout_probs_diff_max"] == pytest.approx(OLD_GAP_MAX)


def test_the_old_log_prob_pass_is_skipped_when_only_the_update_reads_it(fixed_engine):
    cfg = config(epochs=1)
    state, roles = run_step(cfg, [OldLogProbStage(), UpdateActorStage(cfg)])
    assert roles.methods == ["update"]
    assert "old_log_probs" not in state.batch


def test_the_link_follows_an_edited_pipeline(fixed_engine):
    cfg = config(epochs=1)
    stage = OldLogProbStage()
    pipeline = StepPipeline([stage, UpdateActorStage(cfg)])
    pipeline.link()
    assert stage.read_by == ()
    pipeline.append(ReadsOldLogProbs("late_reader"))
    pipeline.link()
    assert stage.read_by == ("late_reader",)


def _on_rollout_loss(batch, log_prob, config):
    """A loss on the rollout's own log-probs (verl's bypass mode): no old ones read."""
    ratio = torch.exp(log_prob - batch["rollout_log_probs"])
    return -batch["advantages"] * ratio, {}


def test_no_old_log_prob_pass_when_no_stage_reads_them(fixed_engine, register_plugin):
    register_plugin(
        PolicyLossSpec(
            name="on_rollout",
            description="reads the rollout's log-probs, not old ones",
            fn=_on_rollout_loss,
            requires=("rollout_log_probs", "advantages", "response_mask"),
        )
    )
    cfg = config(epochs=2)  # two optimizer steps: old log-probs would be needed by PPO
    cfg.actor_rollout_ref.actor.policy_loss.loss_mode = "on_rollout"
    update = UpdateActorStage(cfg)
    loss = get_registry().get(PluginKind.POLICY_LOSS, "on_rollout")
    update.bind(SimpleNamespace(policy_loss=loss))  # the plan's part the update reads
    assert "old_log_probs" not in update.requires
    state, roles = run_step(cfg, [OldLogProbStage(), update])
    assert roles.methods == ["update"]
    assert state.metrics["actor/optimizer_steps"] == 2.0


# ---- the probability-gap metrics on on-policy and off-policy steps ---------------------------


def test_the_gap_metrics_come_from_the_update_on_an_on_policy_step(fixed_engine):
    cfg = config(epochs=1)
    state, roles = run_step(cfg, [OldLogProbStage(), UpdateActorStage(cfg)])
    assert roles.methods == ["update"]
    assert state.metrics["training/rollout_probs_diff_mean"] == pytest.approx(GAP_MEAN)
    assert state.metrics["training/rollout_probs_diff_max"] == pytest.approx(GAP_MAX)
    assert not [k for k in state.metrics if k.startswith("rollout_probs_diff/")]  # parts gone
    assert state.metrics["actor/optimizer_steps"] == 1.0


def test_the_gap_metrics_agree_between_the_update_and_the_old_log_prob_stage():
    batch = scored_batch()
    batch["old_log_probs"] = torch.full((4, 3), TRAIN_LOG_PROB)
    metrics = rollout_mismatch_metrics(batch)
    assert metrics["training/rollout_probs_diff_mean"] == pytest.approx(GAP_MEAN)
    assert metrics["training/rollout_probs_diff_max"] == pytest.approx(GAP_MAX)


def test_an_off_policy_step_takes_the_gap_metrics_from_the_old_log_prob_pass(fixed_engine):
    cfg = config(epochs=2)
    state, roles = run_step(cfg, [OldLogProbStage(), UpdateActorStage(cfg)])
    assert roles.methods == ["compute_log_prob", "update"]
    assert state.metrics["training/rollout_probs_diff_mean"] == pytest.approx(OLD_GAP_MEAN)
    assert state.metrics["training/rollout_probs_diff_max"] == pytest.approx(OLD_GAP_MAX)
    assert state.metrics["actor/optimizer_steps"] == 2.0


def test_no_gap_metrics_without_rollout_log_probs(fixed_engine):
    cfg = config(epochs=1)
    roles = Roles(cfg)
    batch = scored_batch()
    del batch.tensors["rollout_log_probs"]
    state = StepState(step=1, batch=batch)
    UpdateActorStage(cfg).run(state, StepContext(cfg, roles, None, None, None))
    assert not [k for k in state.metrics if "rollout_probs_diff" in k]


# ---- sampled and kept scores ------------------------------------------------------------------


def scores_batch(scores: list[float]) -> Batch:
    rows = len(scores)
    token_scores = torch.zeros(rows, 2)
    token_scores[:, 1] = torch.tensor(scores)
    return Batch(
        {
            "token_level_scores": token_scores,
            "response_mask": torch.ones(rows, 2),
            "attention_mask": torch.ones(rows, 4),
        }
    )


def test_a_filtering_stage_reports_sampled_and_kept_scores():
    sampled = [scores_batch([1.0, 0.0, 0.0, 0.0]), scores_batch([0.0, 0.0, 1.0, 1.0])]
    state = StepState(step=1, batch=scores_batch([1.0, 0.0, 1.0, 1.0]))
    state.record_sampled_scores(*sampled)
    assert state.metrics == {
        "critic/score/mean": 3 / 8,
        "critic/score/max": 1.0,
        "critic/score/min": 0.0,
    }
    kept = step_batch_metrics(state.batch, state.metrics)
    assert kept["critic/kept_score/mean"] == 0.75 and kept["critic/kept_score/min"] == 0.0
    assert "critic/score/mean" not in kept  # the sampled responses' stay as recorded


def test_without_a_filter_the_score_is_the_final_batchs():
    batch = scores_batch([1.0, 0.0, 0.0, 0.0])
    metrics = step_batch_metrics(batch, {"reward/errors": 0.0})
    assert metrics["critic/score/mean"] == 0.25
    assert not [k for k in metrics if k.startswith("critic/kept_score")]
    assert data_metrics(batch) == metrics


# ---- the run's records and summary --------------------------------------------------------


def bare_trainer(tmp_path, *, val_before: bool):
    """RLTrainer's loop around scripted steps and validation, the real jsonl logger."""
    from polyrl.config.loader import load_config

    trainer = RLTrainer.__new__(RLTrainer)
    trainer.cfg = load_config(
        [
            f"trainer.val_before_train={str(val_before).lower()}",
            "trainer.total_training_steps=2",
            "trainer.test_freq=2",
            "trainer.save_freq=-1",
            "trainer.export_hf_model=false",
            "trainer.logger=[jsonl]",
        ]
    )
    trainer.output_dir, trainer.total_steps, trainer.resume_from = str(tmp_path), 2, None
    trainer.plan = SimpleNamespace(loggers=[get_registry().get(PluginKind.LOGGER, "jsonl")])
    trainer.data = SimpleNamespace(validate=object())
    trainer.loader = SimpleNamespace(epoch=0, state_dict=dict)
    trainer.pipeline = SimpleNamespace(state_dict=dict, finish=lambda: None)
    validations = iter([0.25, 0.75])
    trainer._resume = lambda: 0
    trainer._restarts = []  # none while the workers started
    trainer.validate = lambda: ValidationResult(
        {"val-core/digits/reward/mean@1": next(validations)}
    )
    trainer._train_step = lambda step: {"critic/score/mean": step / 10}
    trainer._plot = lambda path: None
    return trainer


def records(tmp_path):
    return [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]


def test_the_validation_before_training_is_the_record_of_step_0(tmp_path):
    result = bare_trainer(tmp_path, val_before=True).fit()
    assert records(tmp_path) == [
        {"step": 0, "val-core/digits/reward/mean@1": 0.25},
        {"step": 1, "critic/score/mean": 0.1, "training/epoch": 0.0},
        {
            "step": 2,
            "critic/score/mean": 0.2,
            "val-core/digits/reward/mean@1": 0.75,
            "training/epoch": 0.0,
        },
    ]
    assert result.val_before == {"val-core/digits/reward/mean@1": 0.25}
    assert "val-core/digits/reward/mean@1: 0.250 before -> 0.750 after" in describe_result(result)


def test_without_validation_before_training_the_records_start_at_step_1(tmp_path):
    bare_trainer(tmp_path, val_before=False).fit()
    assert [r["step"] for r in records(tmp_path)] == [1, 2]


def test_the_summary_lists_only_files_that_exist(tmp_path):
    plot = tmp_path / "reward_curve.png"
    result = TrainResult(
        steps=2,
        output_dir=str(tmp_path),
        checkpoint=None,
        hf_model=None,
        metrics_file=str(tmp_path / "metrics.jsonl"),  # no jsonl logger: never written
        plot=None,
        val_before={},
        val_after={},
    )
    assert "metrics.jsonl" not in describe_result(result)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    plot.write_bytes(b"png")
    result.plot = str(plot)
    lines = describe_result(result).splitlines()
    assert lines[1:] == [
        f"  metrics       {tmp_path / 'metrics.jsonl'}",
        f"  reward curve  {plot}",
    ]
