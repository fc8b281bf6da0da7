"""Fast checks of the vLLM plugin that need no vLLM engine: registration, the install message when
vLLM is missing, the config mapping and the output layout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from omegaconf import OmegaConf

from polyrl.api.testing import schema_config
from polyrl.batch import Batch
from polyrl.errors import ConfigError
from polyrl.registry import discover
from polyrl.specs import PluginKind
from polyrl_rollout_vllm.checks import check_config
from polyrl_rollout_vllm.config import (
    CPU_KV_CACHE_MIN_BYTES,
    LOGPROBS_MODE,
    build_engine_args,
    kv_cache_bytes_estimate,
)
from polyrl_rollout_vllm.errors import VLLMRolloutConfigError
from polyrl_rollout_vllm.layout import assemble_rollout, position_ids_for, strip_left_padding


def test_registered_with_capabilities_and_light_entry_point():
    reg = discover().get(PluginKind.ROLLOUT_ENGINE, "vllm")
    assert reg.provenance.distribution == "polyrl-rollout-vllm"
    assert reg.spec.engine == "polyrl_rollout_vllm.engine:VLLMRolloutEngine"
    assert reg.spec.capability_flags() == {
        "cpu": True,
        "cuda": True,
        "weight_sync": True,
        "sleep": True,
        "logprobs": True,
        "lora_adapters": False,
    }
    # Listing plugins must not import vLLM or torch.
    code = (
        "import sys, polyrl_rollout_vllm.plugin; "
        "print(int('vllm' in sys.modules), int('torch' in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0", "0"]


def test_selecting_vllm_without_vllm_names_both_extras():
    # sys.modules[name] = None makes `import vllm` raise ImportError, as on a machine without it.
    code = textwrap.dedent(
        """
        import sys
        sys.modules["vllm"] = None
        from polyrl.registry import discover, PluginBrokenError
        from polyrl.specs import PluginKind
        try:
            discover().load(PluginKind.ROLLOUT_ENGINE, "vllm")
        except PluginBrokenError as exc:
            print(exc)
        """
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    message = out.stdout.strip()
    assert "rollout_engine 'vllm' from package polyrl-rollout-vllm" in message
    assert "VLLMNotInstalledError" in message
    assert "pip install 'polyrl-rollout-vllm[cpu]'" in message
    assert "pip install 'polyrl-rollout-vllm[cuda]'" in message


def _tiny_config_dir(tmp_path, layers=2, kv_heads=2, head_dim=64) -> str:
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "num_hidden_layers": layers,
                "num_attention_heads": 2,
                "num_key_value_heads": kv_heads,
                "head_dim": head_dim,
                "hidden_size": 128,
            }
        )
    )
    return str(tmp_path)


def test_engine_args_from_verl_keys_on_cpu(tmp_path):
    path = _tiny_config_dir(tmp_path)
    cfg = _rollout_node(
        name="vllm",
        dtype="fp32",
        max_num_seqs=8,
        max_num_batched_tokens=100,
        enable_prefix_caching=False,
        seed=5,
        engine_kwargs={"vllm": {"block_size": 32}, "sglang": {"x": 1}},
    )
    args = build_engine_args(cfg, model_path=path, device="cpu", max_model_len=300, seed=0, rank=2)
    assert args["model"] == path and args["tokenizer"] == path
    assert args["dtype"] == "float32"
    assert args["seed"] == 5 + 2 * 1_000_003  # each rank its own default stream
    assert args["max_num_seqs"] == 8
    assert args["max_num_batched_tokens"] == 300  # raised to max_model_len
    assert args["max_model_len"] == 300
    assert args["enable_prefix_caching"] is False
    assert args["enforce_eager"] is True
    assert args["logprobs_mode"] == LOGPROBS_MODE == "processed_logprobs"
    assert args["block_size"] == 32 and "x" not in args  # verl's nested engine_kwargs.vllm
    # CPU: no sleep mode, no GPU fraction; an explicit KV cache: 2 (K,V) x 2 layers x 2 heads x
    # 64 x 4 bytes = 2048 bytes/token x 8 seqs x 300 tokens = 4.9 MB -> raised to the 64 MiB floor.
    assert "enable_sleep_mode" not in args and "gpu_memory_utilization" not in args
    assert args["kv_cache_memory_bytes"] == CPU_KV_CACHE_MIN_BYTES


def test_engine_args_on_cuda_and_flat_passthrough(tmp_path):
    path = _tiny_config_dir(tmp_path)
    cfg = _rollout_node(
        gpu_memory_utilization=0.4,
        tensor_model_parallel_size=2,
        free_cache_engine=True,
        enforce_eager=False,
        engine_kwargs={"swap_space": 0, "enforce_eager": True},
    )
    args = build_engine_args(cfg, model_path=path, device="cuda", max_model_len=64, seed=3)
    assert args["gpu_memory_utilization"] == 0.4
    assert args["tensor_parallel_size"] == 2
    assert args["distributed_executor_backend"] == "external_launcher"
    assert args["enable_sleep_mode"] is True
    assert args["seed"] == 0  # actor_rollout_ref.rollout.seed (the schema's default)
    assert args["swap_space"] == 0 and args["enforce_eager"] is True  # pass-through wins
    assert "kv_cache_memory_bytes" not in args


def _rollout_node(**values):
    """The ``actor_rollout_ref.rollout`` node of the schema with ``values`` merged in."""
    cfg = OmegaConf.merge(schema_config(), {"actor_rollout_ref": {"rollout": values}})
    return cfg.actor_rollout_ref.rollout


def test_partial_dicts_take_the_schema_defaults(tmp_path):
    path = _tiny_config_dir(tmp_path)
    where = {"model_path": path, "max_model_len": 8, "seed": 0}
    args = build_engine_args({"max_num_seqs": 4}, device="cuda", **where)
    assert args["max_num_seqs"] == 4 and args["gpu_memory_utilization"] == 0.5
    with pytest.raises(ConfigError, match=r"Did you mean actor_rollout_ref\.rollout\.max_num_seqs"):
        build_engine_args({"max_num_seq": 4}, device="cpu", **where)


def _check(*overrides: str) -> list[str]:
    dotlist = ["actor_rollout_ref.rollout.name=vllm", *overrides]
    cfg = OmegaConf.merge(schema_config(), OmegaConf.from_dotlist(dotlist))
    return check_config(cfg)


def test_config_check_is_registered_and_light():
    reg = discover().get(PluginKind.ROLLOUT_ENGINE, "vllm")
    assert reg.spec.config_check == "polyrl_rollout_vllm.checks:check_config"
    code = (
        "import sys, polyrl_rollout_vllm.checks; "
        "print(int('vllm' in sys.modules), int('torch' in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0", "0"]


def test_config_check_tensor_parallel_and_dtype():
    assert _check() == []
    cuda = "trainer.device=cuda"
    tp2 = "actor_rollout_ref.rollout.tensor_model_parallel_size=2"
    assert _check(cuda, "trainer.n_gpus_per_node=4", tp2) == []
    assert _check(cuda, "trainer.n_gpus_per_node=3", tp2) == [
        "actor_rollout_ref.rollout.tensor_model_parallel_size 2 does not divide the world size 3 "
        "= trainer.nnodes 1 x trainer.n_gpus_per_node 3"
    ]
    # the rollout's pool decides its world size
    pooled = ["trainer.role_pools={actor: gen, rollout: gen}", "trainer.resource_pools={gen: 3}"]
    (line,) = _check(cuda, *pooled, tp2)
    assert line.endswith("the world size 3 of pool 'gen' (trainer.resource_pools.gen)")
    split = ["actor_rollout_ref.hybrid_engine=false", "actor_rollout_ref.rollout.n_gpus_per_node=3"]
    (line,) = _check(cuda, "trainer.n_gpus_per_node=4", *split, tp2)
    assert line.endswith(
        "the world size 3 = actor_rollout_ref.rollout.nnodes 1 x "
        "actor_rollout_ref.rollout.n_gpus_per_node 3"
    )
    (line,) = _check("trainer.n_gpus_per_node=2", tp2)
    assert "tensor_model_parallel_size=2 is not supported on CPU" in line
    (line,) = _check("actor_rollout_ref.rollout.dtype=int3")
    assert line.startswith("actor_rollout_ref.rollout.dtype='int3' is not a dtype vLLM knows")
    (line,) = _check("actor_rollout_ref.rollout.engine_kwargs={vllm: 3}")
    assert line == "actor_rollout_ref.rollout.engine_kwargs.vllm must be a mapping, got 3"


def test_kv_cache_estimate_by_hand(tmp_path):
    path = _tiny_config_dir(tmp_path, layers=30, kv_heads=3, head_dim=64)
    # 2 x 30 x 3 x 64 x 2 bytes (bf16) = 23040 bytes/token; x 16 seqs x 1024 tokens.
    assert kv_cache_bytes_estimate(path, 16, 1024, "bfloat16") == 23040 * 16 * 1024


def test_bad_config_values_are_reported(tmp_path):
    path = _tiny_config_dir(tmp_path)
    with pytest.raises(VLLMRolloutConfigError, match=r"rollout\.dtype='int3'"):
        build_engine_args({"dtype": "int3"}, model_path=path, device="cpu", max_model_len=8, seed=0)
    with pytest.raises(VLLMRolloutConfigError, match="not supported on CPU"):
        build_engine_args(
            {"tensor_model_parallel_size": 2},
            model_path=path,
            device="cpu",
            max_model_len=8,
            seed=0,
        )
    with pytest.raises(VLLMRolloutConfigError, match=r"engine_kwargs\.vllm must be a mapping"):
        build_engine_args(
            {"engine_kwargs": {"vllm": [1]}}, model_path=path, device="cpu", max_model_len=8, seed=0
        )


def test_strip_left_padding():
    ids = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    assert strip_left_padding(ids, mask) == [[5, 6], [7, 8, 9, 10]]
    with pytest.raises(ValueError, match="no tokens"):
        strip_left_padding(ids, torch.zeros_like(mask))


def test_assemble_rollout_layout_by_hand():
    ids = torch.tensor([[0, 5, 6], [7, 8, 9]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    prompts = Batch({"input_ids": ids, "attention_mask": mask}, {"uid": ["a", "b"]}, {"k": 1})
    samples = [
        ([11, 2], [-0.5, -0.25]),  # prompt 0, sample 0: stopped at EOS 2
        ([12, 13, 14, 15], [-1.0, -2.0, -3.0, -4.0]),  # cut to 3 tokens
        ([16], [-0.125]),
        ([17, 18, 19], [-0.1, -0.2, -0.3]),
    ]
    out = assemble_rollout(prompts, samples, n=2, max_new_tokens=3, pad_token_id=0)
    assert out["prompts"].tolist() == [[0, 5, 6], [0, 5, 6], [7, 8, 9], [7, 8, 9]]
    assert out["responses"].tolist() == [[11, 2, 0], [12, 13, 14], [16, 0, 0], [17, 18, 19]]
    assert out["response_mask"].tolist() == [[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1]]
    assert out["rollout_log_probs"].tolist() == [
        [-0.5, -0.25, 0.0],
        [-1.0, -2.0, -3.0],
        [-0.125, 0.0, 0.0],
        pytest.approx([-0.1, -0.2, -0.3]),
    ]
    assert out["input_ids"].tolist()[0] == [0, 5, 6, 11, 2, 0]
    assert out["attention_mask"].tolist()[0] == [0, 1, 1, 1, 1, 0]
    # Real tokens numbered from 0; padding repeats a neighbour's position (as the hf rollout).
    assert out["position_ids"].tolist()[0] == [0, 0, 1, 2, 3, 3]
    assert out["position_ids"].tolist()[2] == [0, 1, 2, 3, 3, 3]
    assert list(out["uid"]) == ["a", "a", "b", "b"] and out.meta == {"k": 1}
    with pytest.raises(ValueError, match="expected 4 samples"):
        assemble_rollout(prompts, samples[:3], n=2, max_new_tokens=3, pad_token_id=0)


def test_position_ids_by_hand():
    mask = torch.tensor([[0, 0, 1, 1, 0]])
    assert position_ids_for(mask).tolist() == [[0, 0, 0, 1, 1]]


def test_weight_stream_checker_against_the_checkpoint(tmp_path):
    from safetensors.torch import save_file

    from polyrl_rollout_vllm.weights import (
        WeightStreamChecker,
        WeightSyncError,
        checkpoint_manifest,
    )

    save_file({"a.weight": torch.zeros(2, 3), "b.bias": torch.zeros(4)}, tmp_path / "m.safetensors")
    manifest = checkpoint_manifest(str(tmp_path))
    assert manifest == {"a.weight": (2, 3), "b.bias": (4,)}
    checker = WeightStreamChecker(manifest, str(tmp_path))
    checker.check("a.weight", torch.ones(2, 3))
    checker.check("lm_head.weight", torch.ones(5))  # not in the checkpoint: left to vLLM
    assert checker.missing() == ["b.bias"]
    with pytest.raises(WeightSyncError, match=r"'b.bias' has shape \(5,\) from the trainer"):
        checker.check("b.bias", torch.ones(5))
