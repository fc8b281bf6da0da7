"""verl's LoRA keys on the FSDP2 engine (real peft, one CPU rank over gloo):
``actor_rollout_ref.model.exclude_modules`` (peft's: targeted modules left without an adapter)
and ``lora_adapter_path`` (start from a saved adapter: its weights and its rank, alpha and
targets, with ``lora_rank`` left at 0)."""

from __future__ import annotations

import json
import os

import pytest
import torch
from fsdp_tiny_model import build_tiny_model, make_batch

from polyrl.api import load_config
from polyrl.batch import Batch
from polyrl.config.validate import validate_config
from polyrl_engine_kit.launch import run_on_ranks
from polyrl_engine_kit.testing import composed_context

RANK, ALPHA = 4, 8.0


def _batch() -> Batch:
    return Batch(make_batch([6, 5, 2, 3], [7, 6, 2, 1], 6, 7, seed=0))


def _engine(path: str, **model: object):
    from polyrl_engine_fsdp.engine import FSDPEngine

    actor = {
        "ppo_micro_batch_size_per_gpu": 2,
        "optim": {"lr": 5e-2, "weight_decay": 0.01},
        "fsdp_config": {"mixed_precision": False},
    }
    return FSDPEngine(composed_context(path, model={"dtype": "float32", **model}, actor=actor))


def _adapted(engine) -> list[str]:
    """The module names (in the base model) that carry a LoRA adapter."""
    from peft.tuners.lora import Linear as LoraLinear

    return sorted(
        name.removeprefix("_fsdp_wrapped_module.").removeprefix("base_model.model.")
        for name, module in engine.model.named_modules()
        if isinstance(module, LoraLinear)
    )


def _loss(micro: Batch, log_prob: torch.Tensor, entropy: torch.Tensor | None):
    mask = micro["response_mask"].float()
    return -(log_prob * mask).sum() / micro.meta["mini_batch_response_tokens"], {}


def _scenario(rank: int, world: int, path: str, out: str) -> dict:
    batch = _batch()
    result: dict = {}
    lora = {"lora_rank": RANK, "lora_alpha": ALPHA}
    result["all"] = _adapted(_engine(path, **lora))
    result["listed"] = _adapted(_engine(path, **lora, exclude_modules=["down_proj", "o_proj"]))
    regex = r".*layers\.0\.self_attn\..*"
    result["regex"] = _adapted(_engine(path, **lora, exclude_modules=regex))
    # an adapter trained a little (B != 0), exported, then started from
    first = _engine(path, **lora, exclude_modules=["o_proj"])
    for _ in range(2):
        first.train_step(batch, _loss)
    result["saved"] = {k: v.clone() for k, v in first.named_adapter_weights()}
    result["saved_lp"] = first.compute_log_prob(batch)[0]
    first.export_hf(out)
    del first
    second = _engine(path, lora_adapter_path=out)
    result["settings"] = second.lora
    result["loaded"] = {k: v.clone() for k, v in second.named_adapter_weights()}
    result["loaded_lp"] = second.compute_log_prob(batch)[0]
    result["loaded_adapted"] = _adapted(second)
    result["trains"] = {
        p.requires_grad for n, p in second.model.named_parameters() if "lora_" in n
    } == {True}
    return result


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("lora_verl")
    path = build_tiny_model(str(root / "tiny"), tie=True, seed=0)
    return run_on_ranks(_scenario, 1, path, str(root / "adapter"), timeout_s=300)[0]


def test_excluded_modules_get_no_adapter(result: dict) -> None:
    every = result["all"]
    assert any(n.endswith("down_proj") for n in every) and any(n.endswith("o_proj") for n in every)
    listed = result["listed"]
    assert listed and not [n for n in listed if n.endswith(("down_proj", "o_proj"))]
    assert set(listed) == {n for n in every if not n.endswith(("down_proj", "o_proj"))}
    regex = result["regex"]
    assert not [n for n in regex if "layers.0.self_attn." in n]
    assert set(regex) == {n for n in every if "layers.0.self_attn." not in n}


def test_a_saved_adapter_loads_with_its_weights_and_settings(result: dict) -> None:
    settings = result["settings"]
    assert (settings.rank, settings.alpha) == (RANK, ALPHA)
    assert settings.exclude_modules == ("o_proj",)
    assert result["loaded_adapted"] == [n for n in result["all"] if not n.endswith("o_proj")]
    saved, loaded = result["saved"], result["loaded"]
    assert saved.keys() == loaded.keys() and saved
    assert any(k.endswith("lora_B.weight") and v.abs().sum() > 0 for k, v in saved.items())
    for name, tensor in saved.items():
        assert torch.equal(loaded[name], tensor), name
    assert torch.equal(result["loaded_lp"], result["saved_lp"])
    assert result["trains"]


def _tiny_cfg(*overrides: str):
    return load_config(["recipe=tiny", "actor_rollout_ref.actor.strategy=fsdp2", *overrides])


def test_validate_takes_the_adapters_settings_and_names_bad_input(tmp_path) -> None:
    from polyrl.lora import describe_lora, lora_rank

    folder = tmp_path / "adapter"
    folder.mkdir()
    saved = {"peft_type": "LORA", "r": 8, "lora_alpha": 32, "target_modules": ["q_proj"]}
    (folder / "adapter_config.json").write_text(json.dumps(saved))
    cfg = _tiny_cfg(f"actor_rollout_ref.model.lora_adapter_path={folder}")
    assert lora_rank(cfg.actor_rollout_ref.model) == 8
    assert not [p for p in validate_config(cfg) if "lora" in p.lower() or "adapter" in p]
    assert describe_lora(cfg).startswith(f"LoRA from the adapter {folder}: rank 8, alpha 32")
    conflict = _tiny_cfg(
        f"actor_rollout_ref.model.lora_adapter_path={folder}", "actor_rollout_ref.model.lora_rank=4"
    )
    (line,) = [p for p in validate_config(conflict) if "lora_rank" in p]
    assert "differs from the rank 8" in line
    missing = _tiny_cfg(f"actor_rollout_ref.model.lora_adapter_path={os.path.join(folder, 'x')}")
    (line,) = [p for p in validate_config(missing) if "adapter" in p]
    assert "has no adapter_config.json" in line
    bad = _tiny_cfg(
        "actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.exclude_modules=[]"
    )
    (line,) = [p for p in validate_config(bad) if "exclude_modules" in p]
    assert "must be a regex" in line
