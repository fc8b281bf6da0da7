"""Roles of a LoRA run (``actor_rollout_ref.model.lora_rank > 0``) over recording engines: the
reference builds no engine and scores with the actor's, adapters disabled; weight sync sends
merged weights, or the adapters alone to a rollout plugin that declares it takes them. The LoRA
keys are a plugin's, not core's: the recording engine declares the one the roles read, as the
first-party engines declare the engine kit's section."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import pytest
import torch
from test_workers_roles import (
    RECORDING_SECTIONS,
    RecordingEngine,
    RecordingRollout,
    context,
    train_batch,
)

from polyrl.specs import RolloutEngineSpec, TrainingEngineSpec
from polyrl.workers.roles.actor import ActorRole
from polyrl.workers.roles.ref import RefRole

LORA = {"actor_rollout_ref": {"model": {"lora_rank": 4}}}


@dataclass
class LoraKeys:
    """The LoRA key of ``actor_rollout_ref.model`` that a LoRA engine plugin declares."""

    lora_rank: int = 0


class LoraRecordingEngine(RecordingEngine):
    """Log-probs -1 with adapters, -2 without; named weights say which view was asked for."""

    built = 0

    def __init__(self, ctx):
        super().__init__(ctx)
        LoraRecordingEngine.built += 1
        self.adapters_on = True

    def compute_log_prob(self, batch, *, temperature=1.0, calculate_entropy=False):
        log_prob, entropy = super().compute_log_prob(
            batch, temperature=temperature, calculate_entropy=calculate_entropy
        )
        return log_prob * (1 if self.adapters_on else 2), entropy

    @contextmanager
    def adapters_disabled(self):
        self.adapters_on = False
        try:
            yield
        finally:
            self.adapters_on = True

    def named_weights(self):
        yield "merged", torch.ones(2)

    def named_adapter_weights(self):
        yield "adapter", torch.ones(2)


@pytest.fixture
def lora_engines(isolated_registry, register_plugin):
    register_plugin(
        [
            TrainingEngineSpec(
                name="recording",
                description="test",
                engine=LoraRecordingEngine,
                supports_lora=True,
                config_sections={**RECORDING_SECTIONS, "actor_rollout_ref.model": LoraKeys},
            ),
            RolloutEngineSpec(name="recording", description="test", engine=RecordingRollout),
            RolloutEngineSpec(
                name="adapters",
                description="test",
                engine=RecordingRollout,
                supports_lora_adapters=True,
            ),
        ]
    )
    LoraRecordingEngine.built = 0


def _with_peers(*roles: str, **overrides):
    """Roles built as a worker builds them: in order, each seeing the ones built so far."""
    peers: dict = {}
    for role in roles:
        ctx = context(role, **{**LORA, **overrides})
        ctx.peers = peers
        peers[role] = (RefRole if role == "ref" else ActorRole)(ctx)
    return peers


def test_lora_reference_scores_with_the_actors_engine_and_adapters_off(lora_engines) -> None:
    roles = _with_peers("ref", "actor")  # the actor may come after the reference
    ref, actor = roles["ref"], roles["actor"]
    assert LoraRecordingEngine.built == 1, "the reference must not load a second model"
    assert ref.engine is actor.engine
    assert ref.data_parallel_rank() == actor.data_parallel_rank()
    assert (ref.compute_log_prob(train_batch())["log_probs"] == -2.0).all()
    assert (actor.compute_log_prob(train_batch())["log_probs"] == -1.0).all()
    assert actor.engine.temperature == 0.7


def test_lora_reference_without_a_colocated_actor_says_what_to_do(lora_engines) -> None:
    ref = _with_peers("ref")["ref"]
    with pytest.raises(RuntimeError, match=r"hosts no actor role .*trainer.role_pools"):
        ref.compute_log_prob(train_batch())


@pytest.mark.parametrize(("rollout", "sent"), [("recording", "merged"), ("adapters", "adapter")])
def test_weight_sync_sends_what_the_rollout_plugin_declares(lora_engines, rollout, sent) -> None:
    rollout_node = {"actor_rollout_ref": {"model": {"lora_rank": 4}, "rollout": {"name": rollout}}}
    actor = _with_peers("actor", **rollout_node)["actor"]
    assert [name for name, _ in actor.named_weights()] == [sent]


def test_lora_is_off_where_no_installed_plugin_declares_its_keys(isolated_registry) -> None:
    from omegaconf import OmegaConf

    from polyrl.config.checks.checker import Checker
    from polyrl.config.checks.lora import check_lora
    from polyrl.config.sections import schema_config
    from polyrl.lora import describe_lora, lora_problems, lora_rank

    cfg = schema_config()  # core's schema alone: the keys are the engines', not core's
    model = cfg.actor_rollout_ref.model
    assert "lora_rank" not in model
    assert lora_rank(model) == 0 and lora_problems(model) == []
    assert describe_lora(cfg) is None
    checker = Checker(cfg, isolated_registry)
    check_lora(checker, {}, None)
    assert not checker.problems
    with pytest.raises(Exception, match="lora_rank"):  # setting one is an unknown key
        OmegaConf.merge(cfg, LORA)
