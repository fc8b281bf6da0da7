"""verl's ``actor_rollout_ref.model.enable_activation_offload`` in the FSDP engine: during a
training step the tensors autograd saves for the backward go through torch's ``save_on_cpu``
(counted here), and the step's loss, gradient norm and updated weights are bitwise those of the
same step without it, with and without gradient checkpointing. The reference (no backward)
offloads nothing."""

from __future__ import annotations

import pytest
import torch
from test_fsdp_engine import _full_batch, mean_logprob_loss

from polyrl.api import load_config
from polyrl.config.validate import validate_config


def _step(path: str, offload: bool, checkpointing: bool) -> tuple[dict, dict]:
    from polyrl_engine_fsdp.engine import FSDPEngine
    from polyrl_engine_kit.testing import composed_context

    model = {
        "dtype": "float32",
        "enable_activation_offload": offload,
        "enable_gradient_checkpointing": checkpointing,
    }
    actor = {"ppo_micro_batch_size_per_gpu": 2, "fsdp_config": {"mixed_precision": False}}
    engine = FSDPEngine(composed_context(path, model=model, actor=actor))
    metrics = engine.train_step(_full_batch(), mean_logprob_loss)
    return metrics, {name: w.clone() for name, w in engine.named_weights()}


def _critic_offloads(path: str) -> bool:
    """A critic gets the actor's model node: the actor's key must not turn its offload on
    (verl's critic has its own key)."""
    from dataclasses import replace

    from polyrl.api import ModelHead
    from polyrl_engine_fsdp.engine import FSDPEngine
    from polyrl_engine_kit.testing import composed_context

    model = {"dtype": "float32", "enable_activation_offload": True}
    ctx = composed_context(path, model=model, actor={"fsdp_config": {"mixed_precision": False}})
    return FSDPEngine(replace(ctx, role="critic", head=ModelHead.VALUE)).activation_offload


def _scenario(rank: int, world: int, path: str) -> dict:
    packed: list[torch.device] = []
    original = torch.autograd.graph.save_on_cpu

    class Counting(original):  # type: ignore[misc, valid-type]
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)
            pack = self.pack_hook
            self.pack_hook = lambda tensor: (packed.append(tensor.device), pack(tensor))[1]

    torch.autograd.graph.save_on_cpu = Counting
    out: dict = {"critic_offloads": _critic_offloads(path)}
    for checkpointing in (False, True):
        start = len(packed)
        off = _step(path, offload=False, checkpointing=checkpointing)
        out[f"packed_off_{checkpointing}"] = len(packed) - start
        on = _step(path, offload=True, checkpointing=checkpointing)
        out[f"packed_on_{checkpointing}"] = len(packed) - start
        out[f"same_{checkpointing}"] = off[0] == on[0] and all(
            torch.equal(off[1][name], on[1][name]) for name in off[1]
        )
        out[f"metrics_{checkpointing}"] = (off[0], on[0])
    return out


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict:
    from fsdp_tiny_model import scenario_on_one_rank

    return scenario_on_one_rank(tmp_path_factory, _scenario)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_offloaded_activations_give_the_same_step(result: dict, checkpointing: bool) -> None:
    assert result[f"packed_off_{checkpointing}"] == 0
    assert result[f"packed_on_{checkpointing}"] > 0  # the saved tensors went through the hook
    assert result[f"same_{checkpointing}"], result[f"metrics_{checkpointing}"]


def test_fewer_tensors_are_saved_with_gradient_checkpointing(result: dict) -> None:
    assert result["packed_on_True"] < result["packed_on_False"]


def test_the_actors_key_leaves_a_critics_activations_alone(result: dict) -> None:
    assert result["critic_offloads"] is False


def test_the_actors_key_validates_and_the_critics_is_refused() -> None:
    key = "model.enable_activation_offload=true"
    assert validate_config(load_config(["recipe=tiny", f"actor_rollout_ref.{key}"])) == []
    problems = validate_config(load_config(["recipe=tiny", f"critic.{key}"]))
    assert len(problems) == 1 and "activation offload of the critic" in problems[0], problems


def test_under_another_strategy_the_key_is_one_notice() -> None:
    from polyrl.config.verl_compat import strategy_notices

    key = "actor_rollout_ref.model.enable_activation_offload=true"
    megatron = load_config(["recipe=tiny", key, "actor_rollout_ref.actor.strategy=megatron"])
    assert strategy_notices(megatron) == [
        "actor_rollout_ref.model.enable_activation_offload=True (verl) has no effect with "
        "actor_rollout_ref.actor.strategy=megatron: only the FSDP engine offloads activations, "
        "as in verl"
    ]
    assert strategy_notices(load_config(["recipe=tiny", key])) == []
