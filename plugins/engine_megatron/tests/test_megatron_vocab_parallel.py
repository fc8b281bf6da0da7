"""Vocab-parallel log-probs and entropy on 2 CPU ranks over gloo (megatron-core's reduce mapping
runs on any backend): equal to a full-vocabulary log-softmax, gradients included, with a padded
vocabulary and a temperature; from the logits, and fused from the hidden states and each rank's
rows of the output embedding (in chunks of tokens)."""

from __future__ import annotations

from importlib.util import find_spec

import pytest
import torch

from polyrl_engine_kit.launch import run_on_ranks
from polyrl_engine_kit.logprob import EntropyMode

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


TOKENS, HIDDEN = 7, 4


def _linear_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    hidden = torch.randn(TOKENS, HIDDEN, generator=generator)
    weight = torch.randn(PADDED, HIDDEN, generator=generator)
    weight[VOCAB:] = 10.0  # the padding row's logits would dominate if they counted
    labels = torch.randint(0, VOCAB, (TOKENS,), generator=generator)
    labels[0], labels[1] = 0, VOCAB - 1
    return hidden, weight, labels


def _fused_scenario(rank: int, world: int) -> dict:
    import torch.distributed as dist

    from polyrl_engine_kit import fused_logprob
    from polyrl_engine_megatron import vocab_parallel

    # three tokens per chunk on each rank: the statistics and gradient span chunks
    fused_logprob._CHUNK_ELEMENTS = 3 * (PADDED // world)
    hidden, weight, labels = _linear_inputs()
    width = PADDED // world
    hidden = hidden.requires_grad_(True)
    local = weight[rank * width : (rank + 1) * width].clone().requires_grad_(True)
    group = dist.new_group(list(range(world)))

    def score(mode: EntropyMode) -> tuple[torch.Tensor, torch.Tensor | None]:
        return vocab_parallel.vocab_parallel_linear_log_prob(
            hidden,
            local,
            labels,
            vocab_size=VOCAB,
            temperature=TEMPERATURE,
            entropy=mode,
            group=group,
        )

    def gradients(loss: torch.Tensor) -> dict[str, torch.Tensor]:
        loss.backward()
        grads = {"hidden": hidden.grad, "weight": local.grad}
        hidden.grad, local.grad = None, None
        return grads

    log_prob, entropy = score(EntropyMode.GRAD)
    grads = gradients(log_prob.sum() + 0.5 * entropy.sum())
    only_log_prob, none = score(EntropyMode.NONE)
    assert none is None
    only_log_prob_grads = gradients(only_log_prob.sum())
    beside_detached, detached = score(EntropyMode.DETACHED)
    assert not detached.requires_grad
    return {
        "log_prob": log_prob.detach(),
        "entropy": entropy.detach(),
        "detached": detached,
        "only_log_prob": only_log_prob.detach(),
        "grads": grads,
        "log_prob_grads": only_log_prob_grads,
        "beside_detached_grads": gradients(beside_detached.sum()),
    }


def _reference(with_entropy: bool) -> dict:
    hidden, weight, labels = _linear_inputs()
    hidden.requires_grad_(True)
    weight.requires_grad_(True)
    log_p = torch.log_softmax(hidden @ weight[:VOCAB].t() / TEMPERATURE, dim=-1)
    log_prob = log_p.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    entropy = -(log_p.exp() * log_p).sum(-1)
    loss = log_prob.sum() + (0.5 * entropy.sum() if with_entropy else 0.0)
    loss.backward()
    return {"log_prob": log_prob, "entropy": entropy, "hidden": hidden.grad, "weight": weight.grad}


def test_fused_from_hidden_states_matches_the_full_vocabulary_and_its_gradients() -> None:
    results = run_on_ranks(_fused_scenario, 2, timeout_s=120)
    both, log_prob_only = _reference(with_entropy=True), _reference(with_entropy=False)
    close = {"rtol": 1e-5, "atol": 1e-5}
    for key, reference in (
        ("grads", both),
        ("log_prob_grads", log_prob_only),
        ("beside_detached_grads", log_prob_only),
    ):
        weight_grad = torch.cat([rank[key]["weight"] for rank in results])
        torch.testing.assert_close(weight_grad, reference["weight"], **close)
        assert (weight_grad[VOCAB:] == 0).all()
        for rank in results:  # the hidden states' gradient summed over both ranks' slices
            torch.testing.assert_close(rank[key]["hidden"], reference["hidden"], **close)
    for rank in results:
        for name in ("log_prob", "only_log_prob"):
            torch.testing.assert_close(rank[name], both["log_prob"].detach(), **close)
        for name in ("entropy", "detached"):
            torch.testing.assert_close(rank[name], both["entropy"].detach(), **close)
