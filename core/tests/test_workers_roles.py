"""Core roles (actor, ref, rollout) over recording engines registered in-process: which engine
settings each role builds, the actor update by a driver-made plan, generation seeds per dp rank."""

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from polyrl.batch import Batch
from polyrl.config.sections import schema_config
from polyrl.interfaces import RolloutEngine, SamplingParams, TrainingEngine
from polyrl.seeding import derive_seed
from polyrl.specs import RolloutEngineSpec, TrainingEngineSpec
from polyrl.step.minibatch import MiniBatchPlan, plan_minibatches
from polyrl.testing.plans import worker_plan
from polyrl.workers.mesh import DataParallelRank
from polyrl.workers.roles import RoleContext
from polyrl.workers.roles.actor import ActorRole, UpdateError
from polyrl.workers.roles.ref import RefRole
from polyrl.workers.roles.rollout import RolloutRole

RESPONSE = 3


class RecordingEngine(TrainingEngine):
    def __init__(self, ctx):
        super().__init__(ctx)
        self.steps: list[dict] = []
        self.saved: list[str] = []

    def compute_log_prob(self, batch, *, temperature=1.0, calculate_entropy=False):
        self.temperature = temperature
        log_prob = torch.full(batch["responses"].shape, -1.0)
        return log_prob, (torch.zeros_like(log_prob) if calculate_entropy else None)

    def train_step(self, mini_batch, loss_fn, *, temperature=1.0):
        log_prob = torch.full(mini_batch["response_mask"].shape, -0.5, requires_grad=True)
        loss, metrics = loss_fn(mini_batch, log_prob, None)
        loss.backward()
        self.steps.append(
            {
                "rows": mini_batch["row"].tolist(),
                "keys": sorted(mini_batch.tensors),
                "loss_norm": dict(mini_batch.meta["loss_norm"]),
                "old": mini_batch["old_log_probs"],
            }
        )
        return {"actor/pg_loss": metrics["actor/pg_loss"], "actor/step": float(len(self.steps))}

    def named_weights(self):
        yield "w", torch.ones(2)

    def save_checkpoint(self, path):
        self.saved.append(path)

    def load_checkpoint(self, path):
        self.saved.append(f"load {path}")

    def export_hf(self, path):
        self.saved.append(f"export {path}")


class RecordingRollout(RolloutEngine):
    tp = 1

    def __init__(self, ctx):
        super().__init__(ctx)
        self.events: list[str] = []

    def data_parallel_rank(self):
        if self.tp == 1:
            return super().data_parallel_rank()
        return DataParallelRank(
            self.ctx.rank // self.tp, self.ctx.world_size // self.tp, self.ctx.rank % self.tp == 0
        )

    def generate(self, prompts, params):
        self.events.append(f"generate seed={params.seed}")
        rows = len(prompts) * params.n
        return Batch(
            {
                "responses": torch.full((rows, RESPONSE), self.ctx.pad_token_id),
                "response_mask": torch.zeros(rows, RESPONSE),
                "input_ids": torch.zeros(rows, 2 + RESPONSE, dtype=torch.long),
                "attention_mask": torch.ones(rows, 2 + RESPONSE),
                "position_ids": torch.zeros(rows, 2 + RESPONSE, dtype=torch.long),
                "engine_internal": torch.zeros(rows),
            }
        )

    def update_weights(self, named_tensors):
        self.events.append(f"weights {[name for name, _ in named_tensors]}")

    def sleep(self, level=1):
        self.events.append(f"sleep {level}")

    def wake_up(self):
        self.events.append("wake_up")

    def close(self):
        self.events.append("close")


class TensorParallelRollout(RecordingRollout):
    tp = 2


@pytest.fixture
def engines(isolated_registry, register_plugin):
    register_plugin(
        [
            TrainingEngineSpec(
                name="recording",
                description="test",
                engine=RecordingEngine,
                config_sections=RECORDING_SECTIONS,
            ),
            RolloutEngineSpec(name="recording", description="test", engine=RecordingRollout),
            RolloutEngineSpec(
                name="recording_tp", description="test", engine=TensorParallelRollout
            ),
        ]
    )


@dataclass
class OffloadSettings:
    """An engine plugin's own section under the actor and the reference (as FSDP's
    fsdp_config): the reference's is merged over the actor's like core's keys."""

    param_offload: bool = False


RECORDING_SECTIONS = {
    "actor_rollout_ref.actor.offload": OffloadSettings,
    "actor_rollout_ref.ref.offload": OffloadSettings,
}


def context(role, rank=0, world_size=1, **overrides):
    cfg = OmegaConf.merge(
        schema_config(),
        {
            "actor_rollout_ref": {
                "model": {"path": "model"},
                "actor": {"strategy": "recording", "ppo_epochs": 2, "ppo_mini_batch_size": 2},
                "ref": {
                    "log_prob_micro_batch_size_per_gpu": 5,
                    "offload": {"param_offload": True},
                },
                "rollout": {
                    "name": "recording",
                    "log_prob_micro_batch_size_per_gpu": 3,
                    "temperature": 0.7,
                },
            },
            "data": {"train_files": "train.parquet", "train_batch_size": 4},
        },
        overrides,
    )
    plain = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))  # as a Worker has it
    return RoleContext(
        role=role,
        cfg=plain,
        model_path="/models/tiny",
        rank=rank,
        world_size=world_size,
        device="cpu",
        total_training_steps=5,
        tokens={"pad_token_id": 9, "eos_token_ids": [2]},
        plan=worker_plan(plain),
    )


def train_batch(rows=4, old=True, extra=False):
    mask = torch.ones(rows, RESPONSE)
    mask[0, 2] = 0
    batch = Batch(
        {
            "row": torch.arange(rows),
            "responses": torch.ones(rows, RESPONSE, dtype=torch.long),
            "response_mask": mask,
            "advantages": torch.ones(rows, RESPONSE),
        }
    )
    if old:
        batch["old_log_probs"] = torch.full((rows, RESPONSE), -0.5)
    if extra:
        batch["custom_key"] = torch.zeros(rows)
    return batch


def test_actor_engine_settings(engines):
    actor = ActorRole(context("actor"))
    ctx = actor.engine.ctx
    assert (ctx.role, ctx.trainable, ctx.model_path) == ("actor", True, "/models/tiny")
    assert ctx.engine.log_prob_micro_batch_size_per_gpu == 3  # from rollout (verl semantics)
    assert ctx.engine.total_optimizer_steps == 2 * (4 // 2) * 5  # epochs x minis x steps
    assert ctx.engine.ppo_mini_batch_size == 2
    assert actor.data_parallel_rank() == DataParallelRank(0, 1, True)


def test_ref_engine_settings_merge_the_ref_node_over_the_actors(engines):
    ref = RefRole(context("ref", rank=1, world_size=2))
    ctx = ref.engine.ctx
    assert (ctx.role, ctx.trainable) == ("ref", False)
    assert ctx.engine.log_prob_micro_batch_size_per_gpu == 5
    assert ctx.engine.offload.param_offload is True
    assert ctx.engine.ppo_epochs == 2  # the rest comes from the actor node
    assert "total_optimizer_steps" not in ctx.engine
    assert ref.data_parallel_rank() == DataParallelRank(1, 2, True)
    out = ref.compute_log_prob(train_batch())
    assert list(out.tensors) == ["log_probs"]
    assert ref.engine.temperature == 0.7


def test_actor_log_probs_use_generic_keys(engines):
    out = ActorRole(context("actor")).compute_log_prob(train_batch())
    assert sorted(out.tensors) == ["entropys", "log_probs"]


def test_actor_asks_its_engine_for_sum_pi_squared_when_configured(engines):
    """actor.calculate_sum_pi_squared: the engine's method that returns it too; an engine that
    does not override it refuses in one line (its config check refuses the key first)."""
    switch = {"actor": {"calculate_sum_pi_squared": True}}
    actor = ActorRole(context("actor", actor_rollout_ref=switch))
    with pytest.raises(NotImplementedError, match="does not compute sum_pi_squared"):
        actor.compute_log_prob(train_batch())
    squares = torch.full((4, RESPONSE), 0.25)
    actor.engine.compute_log_prob_and_sum_pi_squared = lambda batch, **kw: (
        *actor.engine.compute_log_prob(batch, **kw),
        squares,
    )
    out = actor.compute_log_prob(train_batch())
    assert sorted(out.tensors) == ["entropys", "log_probs", "sum_pi_squared"]
    assert torch.equal(out["sum_pi_squared"], squares)


def test_update_follows_the_plan_and_passes_every_key(engines):
    actor = ActorRole(context("actor"))
    plan = MiniBatchPlan(
        ((np.array([2, 0]), np.array([1, 3])), (np.array([3, 1]), np.array([0, 2])))
    )
    metrics = actor.update(train_batch(extra=True), plan)
    steps = actor.engine.steps
    assert [s["rows"] for s in steps] == [[2, 0], [1, 3], [3, 1], [0, 2]]
    assert "custom_key" in steps[0]["keys"]  # no whitelist: the batch holds what the loss needs
    # no process group: this rank is the world; row 0 has 2 tokens, the others 3
    assert steps[0]["loss_norm"] == {
        "num_seqs": 2.0,
        "num_tokens": 5.0,
        "max_len": 256,
        "dp_size": 1,  # token-sum's scale (no gradient average over one rank)
    }
    assert steps[1]["loss_norm"]["num_tokens"] == 6.0
    assert metrics["actor/step"] == 2.5
    assert set(metrics) == {"actor/pg_loss", "actor/step"}


def test_update_with_the_planner_of_the_step(engines):
    actor = ActorRole(context("actor"))
    plan = plan_minibatches(8, 2, 4, epochs=2, shuffle=True, seed=1, step=3)
    actor.update(train_batch(rows=4), plan)
    rows = [s["rows"] for s in actor.engine.steps]
    assert len(rows) == 2 * 2
    assert sorted(rows[0] + rows[1]) == [0, 1, 2, 3]


def test_on_policy_update_takes_detached_current_log_probs(engines):
    actor = ActorRole(context("actor"))
    plan = MiniBatchPlan(((np.arange(4),),))
    assert plan.on_policy
    actor.update(train_batch(old=False), plan)
    old = actor.engine.steps[0]["old"]
    assert torch.equal(old, torch.full((4, RESPONSE), -0.5)) and not old.requires_grad


def test_off_policy_update_without_old_log_probs_is_refused(engines):
    actor = ActorRole(context("actor"))
    plan = MiniBatchPlan(((np.arange(2), np.arange(2, 4)),))
    with pytest.raises(
        UpdateError, match=r"without 'old_log_probs' and a plan of 2 optimizer steps"
    ):
        actor.update(train_batch(old=False), plan)
    assert actor.engine.steps == []


def test_a_plan_for_another_shard_size_is_refused(engines):
    actor = ActorRole(context("actor"))
    with pytest.raises(UpdateError, match="indexes row 5, but this rank's shard has 4 rows"):
        actor.update(train_batch(), MiniBatchPlan(((np.array([0, 5]),),)))


def test_actor_checkpoint_and_export_go_to_the_engine(engines):
    actor = ActorRole(context("actor"))
    assert actor.checkpointed
    actor.save_checkpoint("/c/actor")
    actor.load_checkpoint("/c/actor")
    actor.export_hf("/hf")
    assert actor.engine.saved == ["/c/actor", "load /c/actor", "export /hf"]
    assert [name for name, _ in actor.named_weights()] == ["w"]


def test_generate_seeds_per_dp_rank_wakes_and_sleeps(engines):
    prompts = Batch(
        {"input_ids": torch.zeros(2, 2, dtype=torch.long), "attention_mask": torch.ones(2, 2)}
    )
    params = SamplingParams(n=2, seed=123)
    seeds = []
    for rank in range(2):
        role = RolloutRole(context("rollout", rank=rank, world_size=2))
        out = role.generate(prompts, params)
        assert role.engine.events == [
            "wake_up",
            f"generate seed={derive_seed(123, 'rank', rank)}",
            "sleep 1",
        ]
        seeds.append(role.engine.events[1])
        assert sorted(out.tensors) == sorted(
            ["responses", "response_mask", "input_ids", "attention_mask", "position_ids"]
        )
        assert out["responses"][0, 0].item() == 9  # the pad id reached the engine
    assert seeds[0] != seeds[1]
    assert params.seed == 123  # the caller's params are not changed


def test_tensor_parallel_peers_share_the_seed_and_the_mesh(engines):
    prompts = Batch(
        {"input_ids": torch.zeros(1, 2, dtype=torch.long), "attention_mask": torch.ones(1, 2)}
    )
    overrides = {
        "actor_rollout_ref": {"rollout": {"name": "recording_tp", "free_cache_engine": False}}
    }
    roles = [RolloutRole(context("rollout", rank=r, world_size=4, **overrides)) for r in range(4)]
    assert [r.data_parallel_rank() for r in roles] == [
        DataParallelRank(0, 2, True),
        DataParallelRank(0, 2, False),
        DataParallelRank(1, 2, True),
        DataParallelRank(1, 2, False),
    ]
    events = []
    for role in roles:
        role.generate(prompts, SamplingParams(seed=7))
        events.append(role.engine.events)
    assert events[0] == events[1] != events[2] == events[3]
    assert "sleep 1" not in events[0]
    roles[0].update_weights(iter([("w", torch.ones(1))]))
    roles[0].shutdown()
    assert roles[0].engine.events[-2:] == ["weights ['w']", "close"]
