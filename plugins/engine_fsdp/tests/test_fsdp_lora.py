"""LoRA on the FSDP2 engine (real peft, 2 CPU ranks over gloo), checked against hand-derived
values: the merged weights are ``W + alpha / r * B @ A`` of the saved base weights and exported
adapters, the merged and adapter exports score like the trained engine, checkpoints hold the
adapters (and their AdamW state) only and resume bitwise, and disabling the adapters gives the
base model (the reference policy).

One spawn of 2 ranks runs :func:`_scenario_lora`; the tests check its results here.
"""

from __future__ import annotations

import os

import pytest
import torch
from fsdp_tiny_model import build_tiny_model, make_batch
from safetensors.torch import load_file

from polyrl.batch import Batch
from polyrl_engine_kit.launch import run_on_ranks
from polyrl_engine_kit.testing import composed_context

torch.set_num_threads(1)
WORLD = 2
PROMPT_W, RESP_W = 6, 7
PROMPT_LENS = [6, 5, 6, 4, 2, 3, 1, 2]
RESP_LENS = [7, 6, 5, 7, 2, 1, 3, 2]
RANK, ALPHA = 4, 8.0
LAYERS = 2 * 7  # the tiny Qwen2's decoder layers x linear layers each (all-linear)


def _full_batch() -> Batch:
    return Batch(make_batch(PROMPT_LENS, RESP_LENS, PROMPT_W, RESP_W, seed=0))


def _context(rank: int, path: str, lora_rank: int = RANK, dtype: str = "float32"):
    model = {
        "dtype": dtype,
        "lora_rank": lora_rank,
        "lora_alpha": ALPHA,
        "export_merged_lora": True,
    }
    actor = {
        "ppo_micro_batch_size_per_gpu": 2,
        "optim": {"lr": 5e-2, "weight_decay": 0.01},
        "fsdp_config": {"mixed_precision": dtype != "float32"},
    }
    return composed_context(path, model=model, actor=actor, rank=rank, world_size=WORLD)


def _loss(micro: Batch, log_prob: torch.Tensor, entropy: torch.Tensor | None):
    """-(token-mean log-prob) with random token weights: resuming must restore the RNG."""
    mask = micro["response_mask"].float() * torch.rand(log_prob.shape)
    return -(log_prob * mask).sum() / micro.meta["mini_batch_response_tokens"], {}


def _scenario_lora(rank: int, world: int, path: str, out: str) -> dict:
    from polyrl.safe_load import SafeFileSystemReader
    from polyrl_engine_fsdp.checkpoint import CheckpointError
    from polyrl_engine_fsdp.engine import FSDPEngine

    batch = _full_batch().chunk(world)[rank]
    engine = FSDPEngine(_context(rank, path))
    result: dict = {"base": engine.compute_log_prob(batch)[0]}
    for _ in range(3):
        engine.train_step(batch, _loss)
    held = {k: v.clone() for k, v in engine._full_weights()}
    result["merged"] = {k: v.clone() for k, v in engine.named_weights()}
    result["held_unchanged"] = all(torch.equal(held[k], v) for k, v in engine._full_weights())
    result["trained"] = engine.compute_log_prob(batch)[0]
    with engine.adapters_disabled():
        result["disabled"] = engine.compute_log_prob(batch)[0]
    result["enabled_again"] = engine.compute_log_prob(batch)[0]
    engine.export_hf(os.path.join(out, "hf"))
    engine.save_checkpoint(os.path.join(out, "ckpt"))
    result["ckpt_keys"] = sorted(
        SafeFileSystemReader(os.path.join(out, "ckpt")).read_metadata().state_dict_metadata
    )
    for _ in range(2):
        engine.train_step(batch, _loss)
    result["straight"] = dict(engine.named_adapter_weights())
    del engine

    torch.manual_seed(99)  # another RNG state: load_checkpoint must restore the saved one
    resumed = FSDPEngine(_context(rank, path))
    resumed.load_checkpoint(os.path.join(out, "ckpt"))
    for _ in range(2):
        resumed.train_step(batch, _loss)
    result["resumed"] = dict(resumed.named_adapter_weights())
    del resumed

    full = FSDPEngine(_context(rank, path, lora_rank=0))
    try:
        full.load_checkpoint(os.path.join(out, "ckpt"))
    except CheckpointError as exc:
        result["full_from_lora"] = str(exc)
    del full

    # bf16 compute, and the reference's pass (adapters off) is the engine's first forward.
    mixed = FSDPEngine(_context(rank, path, dtype="bfloat16"))
    with mixed.adapters_disabled():
        mixed.compute_log_prob(batch)
    result["mixed_step"] = mixed.train_step(batch, _loss)
    return result


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], str, str]:
    root = tmp_path_factory.mktemp("lora")
    model = build_tiny_model(str(root / "model"), tie=True, seed=0)
    results = run_on_ranks(_scenario_lora, WORLD, model, str(root), timeout_s=300)
    return results, model, str(root)


def _hf_log_probs(model: torch.nn.Module) -> torch.Tensor:
    batch = _full_batch()
    with torch.no_grad():
        logits = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
        ).logits[:, PROMPT_W - 1 : -1]
    log_p = torch.log_softmax(logits.float(), dim=-1)
    lp = log_p.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)
    return lp * batch["response_mask"]


def _both_ranks(results: list[dict], key: str) -> torch.Tensor:
    return torch.cat([r[key] for r in results])


def test_merged_weights_are_base_plus_scaled_low_rank_update(lora_run) -> None:
    results, model, root = lora_run
    base = load_file(os.path.join(model, "model.safetensors"))
    adapters = load_file(os.path.join(root, "hf", "adapter_model.safetensors"))
    merged = results[0]["merged"]
    assert merged.keys() == results[1]["merged"].keys()
    adapted = 0
    for name, tensor in merged.items():
        a_name = f"base_model.model.{name.removesuffix('.weight')}.lora_A.weight"
        expected = base.get(name, base.get("model.embed_tokens.weight"))  # lm_head is tied
        if a_name in adapters:
            b = adapters[a_name.replace("lora_A", "lora_B")]
            assert b.abs().max() > 1e-3, f"{name}: training left lora_B at zero"
            expected = expected + (ALPHA / RANK) * b @ adapters[a_name]
            adapted += 1
        torch.testing.assert_close(tensor, expected, atol=1e-6, rtol=0, msg=name)
    assert adapted == LAYERS
    assert all(r["held_unchanged"] for r in results), "streaming merged weights modified them"


def test_disabled_adapters_give_the_base_model_and_switch_back(lora_run) -> None:
    results, _, _ = lora_run
    for r in results:
        assert torch.equal(r["disabled"], r["base"])
        assert torch.equal(r["enabled_again"], r["trained"])
        assert (r["trained"] - r["base"]).abs().max() > 0.05


def test_exports_score_like_the_trained_engine(lora_run) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    results, model, root = lora_run
    trained = _both_ranks(results, "trained")
    merged = AutoModelForCausalLM.from_pretrained(os.path.join(root, "hf", "merged"))
    torch.testing.assert_close(_hf_log_probs(merged), trained, atol=2e-5, rtol=1e-5)
    base = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    with_adapter = PeftModel.from_pretrained(base, os.path.join(root, "hf"))
    torch.testing.assert_close(_hf_log_probs(with_adapter), trained, atol=2e-5, rtol=1e-5)
    assert os.path.isfile(os.path.join(root, "hf", "tokenizer.json"))


def test_checkpoint_holds_adapters_and_their_optimizer_state_only(lora_run) -> None:
    results, _, _ = lora_run
    keys = results[0]["ckpt_keys"]
    model_keys = [k for k in keys if k.startswith("model.")]
    assert len(model_keys) == 2 * LAYERS
    assert all(k.endswith((".lora_A.default.weight", ".lora_B.default.weight")) for k in model_keys)
    optim_state = {k.rsplit(".", 1)[0] for k in keys if k.startswith("optim.state.")}
    assert optim_state == {f"optim.state.{k.removeprefix('model.')}" for k in model_keys}


def test_bf16_training_after_a_reference_pass_first(lora_run) -> None:
    """FSDP2 fixes which parameters train at its first forward: peft's adapter switch must not
    hide the adapters from it (their bf16 gradients would then miss the cast to fp32)."""
    results, _, _ = lora_run
    for r in results:
        assert 0 < r["mixed_step"]["actor/grad_norm"] < float("inf")


def test_resume_is_bitwise_and_a_full_engine_refuses_the_adapter_checkpoint(lora_run) -> None:
    results, _, _ = lora_run
    for r in results:
        assert r["straight"].keys() == r["resumed"].keys() and len(r["straight"]) == 2 * LAYERS
        for name, tensor in r["straight"].items():
            assert torch.equal(tensor, r["resumed"][name]), name
        assert "lora_rank" in r["full_from_lora"] and "lacks" in r["full_from_lora"]


# ---- refusals, before any rank starts ---------------------------------------------------------
@pytest.mark.parametrize(
    ("targets", "message"),
    [
        (["no_such_proj"], r"target_modules=\['no_such_proj'\] selects no layer of Qwen2"),
        (["embed_tokens"], r"selects non-linear layers \(Embedding\).*linear layers only"),
    ],
)
def test_target_modules_that_select_no_linear_layer_are_one_line(tmp_path, targets, message):
    from transformers import AutoModelForCausalLM

    from polyrl.errors import ConfigError
    from polyrl_engine_fsdp.lora import apply_lora
    from polyrl_engine_kit.config import LoraSettings

    model = AutoModelForCausalLM.from_pretrained(build_tiny_model(str(tmp_path / "m")))
    settings = LoraSettings(RANK, ALPHA, tuple(targets), 0.0, export_merged=False)
    with pytest.raises(ConfigError, match=message):
        apply_lora(model, settings)


def test_validate_names_the_extra_when_peft_is_missing(monkeypatch) -> None:
    import importlib.util

    from polyrl.config import load_config
    from polyrl_engine_fsdp.checks import check_config

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "peft" else find_spec(name)
    )
    assert check_config(load_config(["recipe=grpo_lora"])) == [
        "actor_rollout_ref.model.lora_rank=8 needs peft, which is not installed: "
        "pip install 'polyrl-engine-fsdp[lora]'"
    ]
    assert check_config(load_config(["recipe=tiny"])) == []
