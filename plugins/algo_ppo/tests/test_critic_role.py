"""The critic role on the real FSDP2 engine, in this process (one rank): how its engine is built
from the ``critic.*`` keys, values, the update by a driver plan, and its checkpoint."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from polyrl.api import assemble
from polyrl.batch import Batch
from polyrl.config.loader import load_config
from polyrl.interfaces.training_engine import ModelHead
from polyrl.models.resolve import resolve_model_path
from polyrl.step.minibatch import MiniBatchPlan
from polyrl.workers.roles.base import RoleContext
from polyrl_algo_ppo.critic import CriticRole

PROMPT, RESPONSE, ROWS = 5, 4, 4


@pytest.fixture(autouse=True)
def _own_process_group() -> Any:
    """The engine makes a 1-rank group when none exists; destroy it after each test."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    existed = dist.is_initialized()
    yield
    if not existed and dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def tiny_path() -> str:
    return resolve_model_path("builtin:tiny")


def critic(tiny_path: str, *overrides: str) -> CriticRole:
    cfg = load_config(["recipe=ppo", "trainer.n_gpus_per_node=1", *overrides])
    ctx = RoleContext(
        role="critic",
        cfg=cfg,
        model_path=tiny_path,
        rank=0,
        world_size=1,
        device="cpu",
        total_training_steps=5,
        plan=assemble(cfg, check=False).worker_plan(),
    )
    return CriticRole(ctx)


def rollout_batch(returns: float) -> Batch:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 60, (ROWS, PROMPT + RESPONSE), generator=gen)
    attention = torch.ones_like(ids)
    attention[1, :2] = 0  # a shorter prompt
    attention[2, -2:] = 0  # a shorter response
    response_mask = attention[:, PROMPT:].float()
    return Batch(
        {
            "input_ids": ids * attention,
            "attention_mask": attention,
            "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),
            "responses": (ids * attention)[:, PROMPT:],
            "response_mask": response_mask,
            "returns": torch.full((ROWS, RESPONSE), returns) * response_mask,
        }
    )


def test_the_engine_is_built_from_the_critic_keys(tiny_path):
    role = critic(
        tiny_path,
        "critic.forward_micro_batch_size_per_gpu=3",
        "critic.grad_clip=0.25",
        "actor_rollout_ref.actor.ppo_epochs=3",
    )
    ctx = role.engine.ctx
    assert (ctx.role, ctx.head, ctx.trainable) == ("critic", ModelHead.VALUE, True)
    assert ctx.model_path == tiny_path  # critic.model.path null: the actor's model
    node = ctx.engine
    assert node.ppo_micro_batch_size_per_gpu == 8 and node.log_prob_micro_batch_size_per_gpu == 3
    assert node.optim.lr == 1e-3 and node.optim.clip_grad == 0.25
    # the critic's own epochs (2) and mini-batches (8 prompts / 4): 4 steps x 5 training steps
    assert node.total_optimizer_steps == 20
    assert role.engine.settings.optim.total_steps == 20
    assert role.checkpointed


def test_values_then_updates_fit_the_returns_and_report_verls_metrics(tiny_path):
    role = critic(tiny_path)
    batch = rollout_batch(returns=1.0)
    mask = batch["response_mask"].bool()
    values = role.compute_values(batch)["values"]
    assert values.shape == (ROWS, RESPONSE) and (values[~mask] == 0).all()
    plan = MiniBatchPlan(((np.array([0, 1]), np.array([2, 3])),))
    errors = []
    for _ in range(4):
        batch["values"] = role.compute_values(batch)["values"]
        errors.append(float((batch["values"] - batch["returns"])[mask].abs().mean()))
        metrics = role.update(batch, plan)
    assert errors[-1] < errors[0]
    assert set(metrics) >= {
        "critic/vf_loss",
        "critic/vf_clipfrac",
        "critic/vpred_mean",
        "critic/grad_norm",
        "critic/lr",
    }
    assert metrics["critic/lr"] == pytest.approx(1e-3)


def test_checkpoint_round_trip(tiny_path, tmp_path):
    role = critic(tiny_path)
    batch = rollout_batch(returns=5.0)
    saved = role.compute_values(batch)["values"]
    role.save_checkpoint(str(tmp_path / "critic"))
    batch["values"] = saved
    role.update(batch, MiniBatchPlan(((np.arange(ROWS),),)))
    assert not torch.equal(role.compute_values(batch)["values"], saved)
    role.load_checkpoint(str(tmp_path / "critic"))
    assert torch.equal(role.compute_values(batch)["values"], saved)


def test_critic_model_path_starts_the_critic_from_another_model(tiny_path):
    role = critic(tiny_path, "critic.model.path=builtin:tiny@2")
    other = resolve_model_path("builtin:tiny@2")
    assert other != tiny_path and role.engine.ctx.model_path == other
