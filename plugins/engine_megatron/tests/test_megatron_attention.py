"""The Megatron engine's core attention on the CPU: the mask it is given (hand-derived), and
SDPA in megatron-core's shapes against softmax(QK^T / sqrt(d) + mask) V written out, with grouped
keys and values, left and right padding; a padding position's keys and values reach no other
position (a finite value times a zero weight; the engine's padding positions are finite, as each
attends to itself). (On the GPU the engine's numbers are checked against fsdp2 and transformers.)"""

from __future__ import annotations

import math

import pytest
import torch
from mcore_context import one_rank_model_parallel  # noqa: F401 (a fixture)

from polyrl_engine_megatron.attention import attention_mask

HEADS, GROUPS, HEAD_DIM = 4, 2, 8


def test_mask_is_causal_without_padding_keys_but_never_empty() -> None:
    masked = attention_mask(torch.tensor([[0, 1, 1, 0]]))  # left and right padding
    allowed = (~masked)[0, 0].int()
    expected = torch.tensor(
        [
            [1, 0, 0, 0],  # padding query: only itself
            [0, 1, 0, 0],
            [0, 1, 1, 0],
            [0, 1, 1, 1],  # right padding: the causal keys that are not padding, and itself
        ]
    )
    assert masked.shape == (1, 1, 4, 4)
    assert torch.equal(allowed, expected)


def _core_attention():
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.enums import AttnMaskType

    from polyrl_engine_megatron.attention import sdpa_core_attention

    config = TransformerConfig(
        num_layers=1,
        hidden_size=HEADS * HEAD_DIM,
        num_attention_heads=HEADS,
        num_query_groups=GROUPS,
        kv_channels=HEAD_DIM,
        attention_dropout=0.0,
        hidden_dropout=0.0,
        use_cpu_initialization=True,
    )
    return sdpa_core_attention()(
        config=config, layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self"
    )


def _inputs(seed: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    seq, batch = 5, 2
    query = torch.randn(seq, batch, HEADS, HEAD_DIM, generator=generator, dtype=torch.float64)
    key = torch.randn(seq, batch, GROUPS, HEAD_DIM, generator=generator, dtype=torch.float64)
    value = torch.randn(seq, batch, GROUPS, HEAD_DIM, generator=generator, dtype=torch.float64)
    padding = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 0]])
    return query, key, value, padding


def _written_out(query, key, value, masked) -> torch.Tensor:
    seq, batch = query.shape[:2]
    out = torch.empty(seq, batch, HEADS, HEAD_DIM, dtype=query.dtype)
    for b in range(batch):
        for h in range(HEADS):
            g = h // (HEADS // GROUPS)  # megatron-core's grouping: consecutive heads share
            scores = query[:, b, h] @ key[:, b, g].T / math.sqrt(HEAD_DIM)
            scores = scores.masked_fill(masked[b, 0], float("-inf"))
            out[:, b, h] = torch.softmax(scores, dim=-1) @ value[:, b, g]
    return out.reshape(seq, batch, HEADS * HEAD_DIM)


def test_sdpa_matches_the_written_out_attention(one_rank_model_parallel) -> None:  # noqa: F811
    attention = _core_attention()
    query, key, value, padding = _inputs(0)
    masked = attention_mask(padding)
    out = attention(query, key, value, masked)
    assert out.shape == (5, 2, HEADS * HEAD_DIM)
    torch.testing.assert_close(out, _written_out(query, key, value, masked), rtol=1e-9, atol=1e-9)


def test_padding_reaches_no_real_position(one_rank_model_parallel) -> None:  # noqa: F811
    attention = _core_attention()
    query, key, value, padding = _inputs(1)
    masked = attention_mask(padding)
    out = attention(query, key, value, masked)
    pad = (padding == 0).T  # [s, b]
    key, value = key.clone(), value.clone()
    key[pad], value[pad] = 1e6, -1e6
    changed = attention(query, key, value, masked)
    real = ~pad
    assert torch.equal(changed[real], out[real])
    assert torch.isfinite(out).all()


def test_other_attention_inputs_are_refused(one_rank_model_parallel) -> None:  # noqa: F811
    attention = _core_attention()
    query, key, value, padding = _inputs(2)
    with pytest.raises(ValueError, match="no attention bias"):
        attention(query, key, value, attention_mask(padding), attention_bias=torch.zeros(1))
    with pytest.raises(ValueError, match="takes a padding mask"):
        attention(query, key, value, None)
