"""The FSDP engine's plugin registration and its config check (no process group)."""

from __future__ import annotations

import subprocess
import sys

from omegaconf import OmegaConf

from polyrl.api import Notice
from polyrl.api.testing import schema_config
from polyrl.registry import discover
from polyrl.specs import PluginKind
from polyrl_engine_fsdp.checks import check_config


# ---- registration -------------------------------------------------------------------------------
def test_fsdp2_and_alias_registered_with_capabilities():
    registry = discover()
    for name in ("fsdp2", "fsdp"):
        reg = registry.get(PluginKind.TRAINING_ENGINE, name)
        assert reg.provenance.distribution == "polyrl-engine-fsdp"
        assert reg.spec.engine == "polyrl_engine_fsdp.engine:FSDPEngine"
        flags = reg.spec.capability_flags()
        assert flags["cpu"] and flags["cuda"] and flags["weight_sync"] and flags["checkpoint"]
    assert "FSDP2" in registry.get(PluginKind.TRAINING_ENGINE, "fsdp").spec.description
    engine_cls = registry.load(PluginKind.TRAINING_ENGINE, "fsdp")
    assert engine_cls.__name__ == "FSDPEngine"


# ---- the plugin's config check ------------------------------------------------------------------
def _check(*overrides: str) -> list[str]:
    cfg = OmegaConf.merge(schema_config(), OmegaConf.from_dotlist(list(overrides)))
    return check_config(cfg)


def test_config_check_is_registered_and_light():
    reg = discover().get(PluginKind.TRAINING_ENGINE, "fsdp2")
    assert reg.spec.config_check == "polyrl_engine_fsdp.checks:check_config"
    code = "import sys, polyrl_engine_fsdp.checks; print(int('torch' in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0"]


def test_config_check_fsdp_rules():
    assert _check() == []
    # hybrid sharding: a divisor of the world is accepted, another size is one line
    assert (
        _check("trainer.n_gpus_per_node=4", "actor_rollout_ref.actor.fsdp_config.fsdp_size=2") == []
    )
    (line,) = _check("trainer.n_gpus_per_node=4", "actor_rollout_ref.actor.fsdp_config.fsdp_size=3")
    assert line.startswith("actor_rollout_ref.actor.fsdp_config.fsdp_size=3 does not divide")
    assert "(world size 4 = trainer.nnodes 1 x trainer.n_gpus_per_node 4)" in line
    # the ref follows the actor's FSDP settings unless set: one line per node
    found = _check("trainer.n_gpus_per_node=4", "actor_rollout_ref.ref.fsdp_config.fsdp_size=3")
    assert [p.split("=")[0] for p in found] == ["actor_rollout_ref.ref.fsdp_config.fsdp_size"]
    # offload keys set apart: a notice (both are offloaded), not a problem
    (line,) = _check("actor_rollout_ref.actor.fsdp_config.optimizer_offload=true")
    assert isinstance(line, Notice)
    assert "param_offload=False with .optimizer_offload=True" in line
    assert line.endswith("so both are offloaded")
    assert (
        _check(
            "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
            "actor_rollout_ref.actor.fsdp_config.param_offload=true",
        )
        == []
    )
    (line,) = _check("actor_rollout_ref.model.dtype=int8")
    assert line.startswith("actor_rollout_ref.model.dtype='int8' is not a dtype the engines")
    (line,) = _check("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=0")
    assert line == (
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu must be a positive integer, got 0"
    )


def test_offload_keys_set_apart_validate_with_one_notice_and_offload_both(caplog):
    """verl's param_offload without optimizer_offload (or the reverse): accepted, one notice
    per run, and the engine offloads both (FSDP2's CPUOffloadPolicy moves them together)."""
    import logging

    from polyrl.api import load_config
    from polyrl.config.validate import validate_config
    from polyrl_engine_kit.config import resolve_settings

    key = "actor_rollout_ref.actor.fsdp_config.param_offload"
    cfg = load_config(["recipe=tiny", f"{key}=true"])
    with caplog.at_level(logging.WARNING):
        problems = validate_config(cfg)
        validate_config(cfg)
    assert not [p for p in problems if "offload" in p]
    noticed = [r.getMessage() for r in caplog.records if "so both are offloaded" in r.getMessage()]
    assert noticed == [
        f"{key}=True with .optimizer_offload=False: FSDP2's CPU offload moves parameters, "
        f"gradients and the optimizer step together, so both are offloaded"
    ]
    arr = cfg.actor_rollout_ref
    assert resolve_settings(arr.model, arr.actor, 1, world_size=1).param_offload
