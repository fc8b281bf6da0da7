"""The Megatron engine's config rules (CPU): verl's parallel keys, the dtype, and the one-line
refusal of ``strategy=megatron`` on a CPU machine."""

from __future__ import annotations

import subprocess
import sys

from omegaconf import OmegaConf

from polyrl.api.testing import schema_config
from polyrl.config.validate import validate_config
from polyrl.registry import discover
from polyrl.specs import PluginKind
from polyrl_engine_megatron.checks import check_config

TP = "actor_rollout_ref.actor.megatron.tensor_model_parallel_size"
PP = "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size"
REF_TP = "actor_rollout_ref.ref.megatron.tensor_model_parallel_size"


def _cfg(*overrides: str):
    return OmegaConf.merge(schema_config(), OmegaConf.from_dotlist(list(overrides)))


def test_registered_cuda_only_and_light():
    reg = discover().get(PluginKind.TRAINING_ENGINE, "megatron")
    assert reg.spec.supports_cpu is False and reg.spec.supports_cuda is True
    assert reg.spec.runtime_modules == ("torch", "megatron.core")
    code = (
        "import sys, polyrl_engine_megatron.checks, polyrl_engine_megatron.plugin\n"
        "print(int(any(m in sys.modules for m in ('torch', 'megatron'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0"]


def test_parallel_sizes_against_the_pools():
    assert check_config(_cfg("trainer.n_gpus_per_node=4", f"{TP}=2")) == []
    (line,) = check_config(_cfg("trainer.n_gpus_per_node=4", f"{TP}=3"))
    assert line == (
        f"{TP}=3 does not divide the 4 workers of the actor (world size 4 = trainer.nnodes 1 x "
        f"trainer.n_gpus_per_node 4); the data-parallel size is workers / (tensor x pipeline x "
        f"context parallel size)"
    )
    # a reference on its own pool of 3 workers cannot hold TP=2 either
    (line,) = check_config(
        _cfg(
            "trainer.n_gpus_per_node=4",
            f"{TP}=2",
            "trainer.role_pools.ref=refpool",
            "trainer.resource_pools.refpool=3",
        )
    )
    assert line.startswith(f"{REF_TP}=2 does not divide the 3 workers of the ref")
    (line,) = check_config(_cfg(f"{TP}=0"))
    assert line == f"{TP} must be a positive integer, got 0"
    # pipeline stages count against the workers too: 2 x 2 fits 4 workers, 2 x 3 does not
    assert check_config(_cfg("trainer.n_gpus_per_node=4", f"{TP}=2", f"{PP}=2")) == []
    (line,) = check_config(_cfg("trainer.n_gpus_per_node=4", f"{TP}=2", f"{PP}=3"))
    assert line.startswith(f"{TP}=2 x pipeline_model_parallel_size=3 does not divide the 4 workers")
    (line,) = check_config(_cfg(f"{PP}=0"))
    assert line == f"{PP} must be a positive integer, got 0"


def test_the_reference_has_its_own_sizes_on_a_pool_of_its_own():
    own_pool = ("trainer.role_pools.ref=refpool", "trainer.resource_pools.refpool=2")
    assert (
        check_config(_cfg("trainer.n_gpus_per_node=4", f"{TP}=4", f"{REF_TP}=2", *own_pool)) == []
    )
    (line,) = check_config(_cfg("trainer.n_gpus_per_node=4", f"{TP}=4", f"{REF_TP}=2"))
    assert line.startswith(
        "actor_rollout_ref.ref.megatron tensor x pipeline parallel size 2 x 1 differs from the "
        "actor's 4 x 1, but both run in pool 'global'"
    )
    # the same sizes, written out as verl's scripts do, share the pool
    assert check_config(_cfg("trainer.n_gpus_per_node=4", f"{TP}=2", f"{REF_TP}=2")) == []


def test_a_critic_runs_with_the_actors_megatron_settings():
    assert check_config(_cfg("trainer.n_gpus_per_node=4", f"{TP}=2")) == []
    (line,) = check_config(_cfg("trainer.n_gpus_per_node=4", "critic.megatron.param_offload=true"))
    assert line.startswith(
        "critic.megatron.param_offload=True differs from the actor's False and asks for a critic "
        "split, offloaded or configured otherwise than the actor (verl); polyrl does not support "
        "it"
    )
    # settings that change nothing the engine builds may differ (verl's scripts set the
    # critic's mbridge and seed apart)
    assert check_config(_cfg("critic.megatron.use_mbridge=false", "critic.megatron.seed=7")) == []


def test_override_transformer_config_problems():
    key = "actor_rollout_ref.actor.megatron.override_transformer_config"
    assert check_config(_cfg(f"{key}.recompute_granularity=full")) == [
        f"{key}.recompute_granularity=full needs recompute_method=uniform or block, as in "
        f"megatron-core",
        f"{key}.recompute_num_layers=None: give a positive number of layers",
    ]


def test_dtype_and_fsdp_keys():
    (line,) = check_config(_cfg("actor_rollout_ref.model.dtype=float16"))
    assert line.startswith("actor_rollout_ref.model.dtype='float16': the Megatron engine computes")
    assert check_config(_cfg("actor_rollout_ref.model.dtype=fp32")) == []
    (line,) = check_config(_cfg("actor_rollout_ref.actor.fsdp_config.param_offload=true"))
    assert line.startswith("actor_rollout_ref.actor.fsdp_config.param_offload=true configures")


def test_validate_refuses_megatron_on_cpu_in_one_line():
    cfg = _cfg(
        "actor_rollout_ref.model.path=builtin:tiny",
        "data.train_files=builtin:tiny_digits",
        "actor_rollout_ref.actor.strategy=megatron",
        "trainer.device=cpu",
    )
    problems = [p for p in validate_config(cfg) if "megatron" in p]
    assert problems == [
        "actor_rollout_ref.actor.strategy='megatron' (package polyrl-engine-megatron) does not "
        "support trainer.device=cpu. Engines that do: deepspeed, fsdp, fsdp2."
    ]
