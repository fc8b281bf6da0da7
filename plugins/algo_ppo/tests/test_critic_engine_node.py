"""The critic's own engine settings reach its engine: the FSDP engine's Ulysses size
(``critic.ulysses_sequence_parallel_size``) and the Megatron engine's ``critic.megatron``, each
following the actor's unless set. On 2 CPU ranks (gloo), a critic with Ulysses size 2 beside an
actor without sequence parallelism splits its rows (one data-parallel rank) and gives the
values of the same critic without it."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from polyrl.config.loader import load_config
from polyrl_algo_ppo.critic import critic_engine_node

SP = "ulysses_sequence_parallel_size"
PPO = ["recipe=ppo", "trainer.n_gpus_per_node=2", "actor_rollout_ref.model.use_remove_padding=true"]


def test_the_critic_ulysses_size_follows_the_actor_unless_set() -> None:
    cfg = load_config([*PPO, f"actor_rollout_ref.actor.{SP}=2"])
    assert critic_engine_node(cfg, 5)[SP] == 2
    cfg = load_config([*PPO, f"critic.{SP}=2"])
    assert cfg.actor_rollout_ref.actor[SP] == 1
    assert critic_engine_node(cfg, 5)[SP] == 2


def test_the_critic_megatron_node_is_its_own() -> None:
    actor = "actor_rollout_ref.actor.megatron"
    common = [
        *PPO,
        f"{actor}.tensor_model_parallel_size=2",
        f"+{actor}.override_transformer_config.recompute_granularity=full",
    ]
    node = critic_engine_node(load_config(common), 5).megatron
    assert node.tensor_model_parallel_size == 2 and node.param_offload is False
    # an empty critic override dict keeps the actor's, as verl's default interpolates it
    assert node.override_transformer_config == {"recompute_granularity": "full"}
    node = critic_engine_node(
        load_config(
            [
                *common,
                "critic.megatron.tensor_model_parallel_size=1",
                "critic.megatron.param_offload=true",
                "critic.megatron.optimizer_offload=true",
                "+critic.megatron.override_transformer_config.recompute_granularity=selective",
            ]
        ),
        5,
    ).megatron
    assert node.tensor_model_parallel_size == 1
    assert node.param_offload is True and node.optimizer_offload is True
    # the critic's own dict replaces the actor's (verl: the key is given, not interpolated)
    assert node.override_transformer_config == {"recompute_granularity": "selective"}


def _critic_values(rank: int, world: int, path: str, sizes: tuple[int, ...]) -> dict[str, Any]:
    """For each critic Ulysses size: the critic role on this rank's share of 2 ranks, its
    data-parallel position and its values of one fixed batch."""
    from test_critic_role import rollout_batch

    from polyrl.api import assemble
    from polyrl.workers.roles.base import RoleContext
    from polyrl_algo_ppo.critic import CriticRole

    out: dict[str, Any] = {}
    for size in sizes:
        cfg = load_config([*PPO, f"critic.{SP}={size}", "critic.model.path=null"])
        ctx = RoleContext(
            role="critic",
            cfg=cfg,
            model_path=path,
            rank=rank,
            world_size=world,
            device="cpu",
            total_training_steps=5,
            plan=assemble(cfg, check=False).worker_plan(),
        )
        torch.manual_seed(0)  # the fresh value head
        role = CriticRole(ctx)
        position = role.data_parallel_rank()
        out[size] = {
            "ulysses": role.engine.ulysses,
            "position": (position.dp_rank, position.dp_size),
            "values": role.compute_values(rollout_batch(returns=1.0))["values"],
        }
        del role
    return out


@pytest.mark.slow
def test_a_critic_with_its_own_ulysses_size_on_two_cpu_ranks() -> None:
    from polyrl.models.resolve import resolve_model_path
    from polyrl_engine_kit.launch import run_on_ranks

    path = resolve_model_path("builtin:tiny")
    results = run_on_ranks(_critic_values, 2, path, (1, 2), timeout_s=300)
    for rank, out in enumerate(results):
        assert out[1]["ulysses"] == 1 and out[1]["position"] == (rank, 2)
        assert out[2]["ulysses"] == 2 and out[2]["position"] == (0, 1)
        torch.testing.assert_close(out[2]["values"], out[1]["values"], atol=2e-5, rtol=1e-5)
