"""Per-token log-probs and entropy from logits whose vocabulary is split over tensor-parallel ranks.

Each rank holds logits ``[b, r, V/tp]`` for its slice of the vocabulary; no rank ever builds the
full ``[b, r, V]``. The softmax normaliser ``Z``, the chosen token's logit and the entropy's
``sum(exp(l) * l)`` are sums over the vocabulary: each rank sums its slice and one all-reduce
adds them (megatron's ``reduce_from_tensor_model_parallel_region``, whose backward passes the
gradient through unchanged: every rank computes the same loss from the reduced values, so each
rank's slice gets its own gradient). That holds only if every reduced summand depends on this
rank's logits alone, so anything that uses a reduced value (dividing by ``Z``) comes after the
reduction. The maximum subtracted for stability is a constant (no gradient). Vocabulary padding
(rows added so that the vocabulary splits evenly) is left out.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from polyrl_engine_fsdp.logprob import EntropyMode


def _reduce(tensor: torch.Tensor, group: Any) -> torch.Tensor:
    from megatron.core.tensor_parallel import reduce_from_tensor_model_parallel_region

    return reduce_from_tensor_model_parallel_region(tensor, group=group)


def vocab_parallel_logprob_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    vocab_size: int,
    temperature: float,
    entropy: EntropyMode,
    group: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log softmax(logits / T)`` at ``labels`` ``[b, r]`` (float32) and, unless
    :attr:`EntropyMode.NONE`, the entropy of the distribution (with grad for
    :attr:`EntropyMode.GRAD`). ``logits``: this rank's ``[b, r, V/tp]`` slice; ``vocab_size``:
    the real vocabulary (the padded tail is ignored)."""
    if temperature <= 0:
        raise ValueError(
            f"temperature must be > 0 to score tokens (got {temperature}); greedy decoding "
            f"corresponds to no temperature scaling, pass 1.0"
        )
    rank, width = dist.get_rank(group), logits.shape[-1]
    start = rank * width
    real = min(width, vocab_size - start)  # the padding (< tp rows) never fills a whole slice
    scaled = logits[..., :real].float()
    if temperature != 1.0:
        scaled = scaled / temperature
    with torch.no_grad():
        top = scaled.max(dim=-1).values
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
    shifted = scaled - top.unsqueeze(-1)
    exp = shifted.exp()
    log_z = _reduce(exp.sum(dim=-1), group).log()
    local = labels.long() - start
    here = (local >= 0) & (local < real)
    picked = shifted.gather(-1, local.clamp(0, real - 1).unsqueeze(-1)).squeeze(-1)
    log_prob = _reduce(picked * here, group) - log_z
    if entropy == EntropyMode.NONE:
        return log_prob, None
    if entropy == EntropyMode.DETACHED:
        with torch.no_grad():
            return log_prob, _entropy(shifted.detach(), exp.detach(), log_z.detach(), group)
    return log_prob, _entropy(shifted, exp, log_z, group)


def _entropy(
    shifted: torch.Tensor, exp: torch.Tensor, log_z: torch.Tensor, group: Any
) -> torch.Tensor:
    """``H = log Z - sum_v exp_v * l_v / Z`` (logits ``l`` shifted by the maximum). The sum is
    reduced before dividing by ``Z``: each reduced summand must depend on this rank's logits
    only, or the pass-through backward would drop the other ranks' dependence on ``Z``."""
    return log_z - _reduce((exp * shifted).sum(dim=-1), group) / log_z.exp()
