"""verl's Megatron LoRA group through the Megatron engine on CUDA (tensor parallelism over 2
GPUs when there are 2): at init the LoRA engine's log-probs are the base engine's; training steps
move the adapters only; the streamed (merged) weights loaded into transformers give the engine's
float32 log-probs; a checkpoint resumes them; the export is the merged model. Run on the GPU
machine with ``pytest -m gpu plugins/engine_megatron``; the CPU half is test_megatron_lora.py."""

from __future__ import annotations

import pytest
import torch
from test_megatron_cuda import ENGINE, _batch, _weights, _world, noisy_loss

from polyrl.api.testing import build_tiny_model
from polyrl_engine_kit.launch import run_on_ranks
from polyrl_engine_kit.testing import composed_context

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
LORA = {"rank": 4, "alpha": 8, "lora_A_init_method": "kaiming"}


def _context(path: str, rank: int, world: int, lora: dict):
    actor = {
        "strategy": "megatron",
        "megatron": {"tensor_model_parallel_size": world},
        **ENGINE,
    }
    return composed_context(
        path,
        model={"dtype": "float32", "lora": lora},
        actor=actor,
        device="cuda",
        rank=rank,
        world_size=world,
    )


def _scenario(rank: int, world: int, path: str, ckpt: str, export: str) -> dict:
    from polyrl_engine_megatron.engine import MegatronEngine

    base = MegatronEngine(_context(path, rank, world, {})).compute_log_prob(_batch(0))[0]
    engine = MegatronEngine(_context(path, rank, world, LORA))
    at_init = engine.compute_log_prob(_batch(0))[0]
    before = {n: p.detach().clone() for n, p in engine.model.named_parameters()}
    for seed in (1, 2):
        engine.train_step(_batch(seed), noisy_loss)
    changed = {n for n, p in engine.model.named_parameters() if not torch.equal(p, before[n])}
    trained = {n for n, p in engine.model.named_parameters() if p.requires_grad}
    merged = _weights(engine)
    log_prob = engine.compute_log_prob(_batch(0))[0]
    engine.save_checkpoint(ckpt)
    engine.export_hf(export)
    resumed = MegatronEngine(_context(path, rank, world, LORA))
    resumed.load_checkpoint(ckpt)
    return {
        "returns_output": engine.data_parallel_rank().returns_output,
        "base": base,
        "at_init": at_init,
        "changed": changed,
        "trained": trained,
        "merged": merged,
        "log_prob": log_prob,
        "resumed": resumed.compute_log_prob(_batch(0))[0],
    }


def _hf_log_probs(model, batch) -> torch.Tensor:
    logits = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
    ).logits[:, 5:-1]
    log_p = torch.log_softmax(logits.float(), dim=-1)
    expected = log_p.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)
    return expected * batch["response_mask"]


def test_lora_engine_trains_adapters_and_streams_the_merged_model(tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    path = build_tiny_model(str(tmp_path / "tiny"))
    export = str(tmp_path / "export")
    results = run_on_ranks(
        _scenario,
        _world(),
        path,
        str(tmp_path / "ckpt"),
        export,
        backend="nccl",
        timeout_s=600,
    )
    (last,) = [rank for rank in results if rank["returns_output"]]
    torch.testing.assert_close(last["at_init"], last["base"], rtol=0, atol=1e-6)
    for rank in results:
        assert rank["trained"] and all(".adapter.lora_" in name for name in rank["trained"])
        assert rank["changed"] and rank["changed"] <= rank["trained"]
        assert rank["merged"].keys() == results[0]["merged"].keys()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.load_state_dict(last["merged"])
    with torch.no_grad():
        expected = _hf_log_probs(model, _batch(0))
    torch.testing.assert_close(last["log_prob"], expected, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(last["log_prob"], last["base"], atol=1e-4)  # the adapters act
    assert torch.equal(last["resumed"], last["log_prob"])
    exported = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32)
    with torch.no_grad():
        torch.testing.assert_close(
            _hf_log_probs(exported, _batch(0)), expected, rtol=1e-4, atol=1e-4
        )
