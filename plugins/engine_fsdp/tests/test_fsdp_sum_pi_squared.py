"""``sum_pi_squared`` (verl's ``actor.calculate_sum_pi_squared``) from the FSDP engine, on each of
its scoring paths (padded rows, one packed row through the head, the fused log-probs), against
a hand computation from the Hugging Face model's own logits: ``sum_v softmax(z / T)_v^2`` at
every response position, zero on padding. One rank, in-process, float32."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from polyrl_engine_kit.testing import composed_context, ragged_batch, tiny_model

torch.set_num_threads(1)

TEMPERATURE = 0.7
PROMPTS, RESPONSES = [4, 2, 3], [3, 5, 1]
PROMPT_WIDTH, RESPONSE_WIDTH = 4, 5


def _batch():
    return ragged_batch(
        PROMPTS, RESPONSES, PROMPT_WIDTH, RESPONSE_WIDTH, torch.Generator().manual_seed(1)
    )


@pytest.fixture(scope="module")
def by_hand() -> torch.Tensor:
    """From the model's logits, row by row (each row alone, only its real tokens)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model("spp_"), torch_dtype=torch.float32)
    batch = _batch()
    out = torch.zeros(len(PROMPTS), RESPONSE_WIDTH)
    with torch.no_grad():
        for i, (p, r) in enumerate(zip(PROMPTS, RESPONSES)):
            ids = batch["input_ids"][i, PROMPT_WIDTH - p : PROMPT_WIDTH + r][None]
            logits = model(input_ids=ids).logits[0].double()
            # the logits at the positions that predict the response tokens
            probs = torch.softmax(logits[p - 1 : p - 1 + r] / TEMPERATURE, dim=-1)
            out[i, :r] = (probs**2).sum(-1).float()
    return out


@pytest.mark.parametrize(
    "model",
    [
        {"use_remove_padding": False},
        {"use_remove_padding": True, "use_fused_kernels": False},
        {"use_remove_padding": True, "use_fused_kernels": True},
    ],
    ids=["padded", "packed", "fused"],
)
def test_engine_sum_pi_squared_equals_the_models_logits(by_hand: torch.Tensor, model: dict) -> None:
    from polyrl_engine_fsdp.engine import FSDPEngine

    ctx = composed_context(
        tiny_model("spp_"),
        model={"dtype": "float32", **model},
        actor={"log_prob_micro_batch_size_per_gpu": 2, "fsdp_config": {"mixed_precision": False}},
    )
    engine = FSDPEngine(ctx)
    try:
        assert engine.paths.packed == model["use_remove_padding"]
        assert engine.paths.fused == model.get("use_fused_kernels", False)
        batch = _batch()
        log_prob, entropy, squares = engine.compute_log_prob_and_sum_pi_squared(
            batch, temperature=TEMPERATURE, calculate_entropy=True
        )
        plain_log_prob, plain_entropy = engine.compute_log_prob(
            batch, temperature=TEMPERATURE, calculate_entropy=True
        )
    finally:
        dist.destroy_process_group()
    torch.testing.assert_close(squares, by_hand, atol=1e-6, rtol=1e-5)
    # a probability's square sums to at most 1, and at least 1 / vocabulary
    real = batch["response_mask"].bool()
    assert (squares[real] <= 1).all() and (squares[real] > 0).all()
    assert (squares[~real] == 0).all()
    # the same pass gives the same log-probs and entropy as compute_log_prob
    torch.testing.assert_close(log_prob, plain_log_prob, atol=0, rtol=0)
    torch.testing.assert_close(entropy, plain_entropy, atol=0, rtol=0)
