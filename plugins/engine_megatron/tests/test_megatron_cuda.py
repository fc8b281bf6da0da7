"""The Megatron engine on CUDA over NCCL, split over 2 GPUs when there are 2 (else 1), by
tensor parallelism and by pipeline parallelism (one decoder layer per stage, the tied
embedding on both): weights stream back exactly as the HF checkpoint has them on every rank,
the log-probs match transformers, resuming repeats an uninterrupted run bitwise, and the
export loads with transformers. Run on the GPU machine with
``pytest -m gpu plugins/engine_megatron``. (Its numbers against fsdp2 and deepspeed are checked by
tests/test_engine_equivalence.py.)"""

from __future__ import annotations

import pytest
import torch
from mcore_context import megatron_context

from polyrl.batch import Batch
from polyrl.models.tiny import build_tiny_model
from polyrl_engine_fsdp.launch import run_on_ranks

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
ENGINE = {
    "use_dynamic_bsz": True,
    "ppo_max_token_len_per_gpu": 24,
    "optim": {"lr": 5e-3, "lr_warmup_steps": 2, "lr_scheduler_type": "cosine"},
}


def _world() -> int:
    return 2 if torch.cuda.device_count() >= 2 else 1


def _batch(seed: int) -> Batch:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 400, (6, 12), generator=generator)
    mask = torch.ones_like(ids)
    mask[::2, :3] = 0  # left padding on some prompts
    mask[1::2, -2:] = 0  # right padding on some responses
    return Batch(
        {
            "input_ids": ids * mask,
            "attention_mask": mask,
            "position_ids": (mask.cumsum(1) - 1).clamp(min=0),
            "responses": (ids * mask)[:, 6:].clone(),
            "response_mask": mask[:, 6:].clone(),
        }
    )


def noisy_loss(micro: Batch, log_prob: torch.Tensor, entropy: torch.Tensor | None):
    mask = micro["response_mask"].float() * torch.rand(log_prob.shape, device=log_prob.device)
    return -(log_prob * mask).sum() / micro.meta["mini_batch_response_tokens"], {}


def _weights(engine) -> dict[str, torch.Tensor]:
    return {name: tensor.cpu().clone() for name, tensor in engine.named_weights()}


def _scenario(rank: int, world: int, path: str, ckpt: str, export: str, split: str) -> dict:
    from polyrl_engine_megatron.engine import MegatronEngine

    sizes = {"tensor_parallel": world} if split == "tp" else {"pipeline_parallel": world}

    def build() -> MegatronEngine:
        ctx = megatron_context(path, engine=ENGINE, rank=rank, world_size=world, **sizes)
        return MegatronEngine(ctx)

    batches = [_batch(seed) for seed in range(4)]  # TP peers get the same rows
    first = build()
    out: dict = {"initial": _weights(first), "log_prob": first.compute_log_prob(batches[0])[0]}
    out["returns_output"] = first.data_parallel_rank().returns_output
    for batch in batches[:2]:
        first.train_step(batch, noisy_loss)
    first.save_checkpoint(ckpt)
    for batch in batches[2:]:
        first.train_step(batch, noisy_loss)
    out["w1"] = _weights(first)
    first.export_hf(export)
    del first
    torch.manual_seed(1234)
    second = build()
    second.load_checkpoint(ckpt)
    for batch in batches[2:]:
        second.train_step(batch, noisy_loss)
    out["w2"] = _weights(second)
    out["step"] = second.global_step
    return out


SPLITS = [
    "tp",
    pytest.param(
        "pp",
        marks=pytest.mark.skipif(
            torch.cuda.device_count() < 2, reason="pipeline stages need 2 CUDA devices"
        ),
    ),
]


@pytest.fixture(scope="module", params=SPLITS)
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp(f"mcore_{request.param}")
    path = build_tiny_model(str(root / "tiny"))
    export = str(root / "export")
    results = run_on_ranks(
        _scenario,
        _world(),
        path,
        str(root / "ckpt"),
        export,
        request.param,
        backend="nccl",
        timeout_s=600,
    )
    return path, export, results


def test_weights_stream_back_as_the_hf_checkpoint(run) -> None:
    from transformers import AutoModelForCausalLM

    path, _, results = run
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict()
    for rank in results:
        assert rank["initial"].keys() == hf.keys()
        for name, tensor in hf.items():
            assert torch.equal(rank["initial"][name], tensor), name


def test_log_probs_match_transformers(run) -> None:
    from transformers import AutoModelForCausalLM

    path, _, results = run
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    batch = _batch(0)
    logits = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
    ).logits[:, 5:-1]
    log_p = torch.log_softmax(logits.float(), dim=-1)
    expected = log_p.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)
    expected = expected * batch["response_mask"]
    returning = [rank for rank in results if rank["returns_output"]]
    assert len(returning) == 1
    torch.testing.assert_close(returning[0]["log_prob"], expected, rtol=0.02, atol=0.05)


def test_resume_is_bitwise_identical(run) -> None:
    _, _, results = run
    for rank in results:
        assert rank["step"] == 4
        for name, tensor in rank["w1"].items():
            assert torch.equal(tensor, rank["w2"][name]), name


def test_export_loads_with_transformers(run) -> None:
    from transformers import AutoModelForCausalLM

    _, export, results = run
    model = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32)
    state = model.state_dict()
    for name, tensor in results[0]["w1"].items():
        torch.testing.assert_close(state[name], tensor.to(torch.bfloat16).float(), rtol=0, atol=0)
