"""Vocab-parallel log-probs and entropy on 2 CPU ranks over gloo (megatron-core's reduce mapping
runs on any backend): equal to a full-vocabulary log-softmax, gradients included, with a padded
vocabulary and a temperature."""

from __future__ import annotations

from importlib.util import find_spec

import pytest
import torch

from polyrl_engine_fsdp.launch import run_on_ranks
from polyrl_engine_fsdp.logprob import EntropyMode

# Located, not imported: collecting this file must not load megatron into the test process.
pytestmark = pytest.mark.skipif(
    find_spec("megatron") is None, reason="pip install 'polyrl-engine-megatron[cpu]'"
)

VOCAB, PADDED, TEMPERATURE = 21, 22, 0.7  # 22 rows split over 2 ranks; the last one is padding


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, PADDED, generator=generator) * 3
    logits[..., VOCAB:] = 50.0  # padding must not count, however large its logits
    labels = torch.randint(0, VOCAB, (3, 5), generator=generator)
    labels[0, 0], labels[1, 1] = 0, VOCAB - 1  # the first and the last real token
    return logits, labels


def _scenario(rank: int, world: int) -> dict:
    import torch.distributed as dist

    from polyrl_engine_megatron.vocab_parallel import vocab_parallel_logprob_entropy

    logits, labels = _inputs()
    width = PADDED // world
    local = logits[..., rank * width : (rank + 1) * width].clone().requires_grad_(True)
    group = dist.new_group(list(range(world)))
    log_prob, entropy = vocab_parallel_logprob_entropy(
        local,
        labels,
        vocab_size=VOCAB,
        temperature=TEMPERATURE,
        entropy=EntropyMode.GRAD,
        group=group,
    )
    (log_prob.sum() + 0.5 * entropy.sum()).backward()
    _, detached = vocab_parallel_logprob_entropy(
        local.detach(),
        labels,
        vocab_size=VOCAB,
        temperature=TEMPERATURE,
        entropy=EntropyMode.DETACHED,
        group=group,
    )
    return {
        "log_prob": log_prob.detach(),
        "entropy": entropy.detach(),
        "detached": detached,
        "grad": local.grad,
    }


def test_matches_full_vocabulary_log_softmax_and_its_gradient() -> None:
    results = run_on_ranks(_scenario, 2, timeout_s=120)
    logits, labels = _inputs()
    full = logits.clone().requires_grad_(True)
    log_p = torch.log_softmax(full[..., :VOCAB] / TEMPERATURE, dim=-1)
    log_prob = log_p.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    entropy = -(log_p.exp() * log_p).sum(-1)
    (log_prob.sum() + 0.5 * entropy.sum()).backward()
    grad = torch.cat([r["grad"] for r in results], dim=-1)
    for rank in results:
        torch.testing.assert_close(rank["log_prob"], log_prob.detach(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(rank["entropy"], entropy.detach(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(rank["detached"], entropy.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad, full.grad, rtol=1e-5, atol=1e-6)
    assert (grad[..., VOCAB:] == 0).all()
