"""The Megatron engine's attention on the CPU: the mask it is given (hand-derived), the rotary
embedding (hand-derived angles, and transformers' Qwen2 RoPE), SDPA in megatron-core's shapes
against softmax(QK^T / sqrt(d) + mask) V written out, with grouped keys and values, left and
right padding; the packed row (megatron-core's ``thd`` shapes) gives every real token the output
the padded rows give it; a padding position's keys and values reach no other position (a finite
value times a zero weight; the engine's padding positions are finite, as each attends to
itself). (On the GPU the engine's numbers are checked against fsdp2 and transformers.)"""

from __future__ import annotations

import math

import pytest
import torch
from mcore_context import one_rank_model_parallel  # noqa: F401 (a fixture)

from polyrl_engine_kit.packing import pack_rows
from polyrl_engine_megatron.attention import (
    attention_mask,
    packed_layout,
    padded_layout,
    rotary_tables,
    rotate,
)

HEADS, GROUPS, HEAD_DIM, THETA = 4, 2, 8, 10000.0


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


def test_rotary_turns_each_pair_by_position_times_frequency() -> None:
    # head_dim 4: frequencies 1 and theta^(-1/2) = 0.01; pairs are (x0, x2) and (x1, x3)
    cos, sin = rotary_tables(torch.tensor([0, 2]), 4, THETA)
    x = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 1.0]])
    out = rotate(x, cos, sin)
    assert torch.equal(out[0], x[0])  # position 0: no rotation
    # (1, 0) turned by 2 rad; (0, 1) turned by 0.02 rad
    expected = torch.tensor([math.cos(2), -math.sin(0.02), math.sin(2), math.cos(0.02)])
    torch.testing.assert_close(out[1], expected)


def test_rotary_matches_transformers_qwen2() -> None:
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import (
        Qwen2RotaryEmbedding,
        apply_rotary_pos_emb,
    )

    config = Qwen2Config(hidden_size=HEADS * HEAD_DIM, num_attention_heads=HEADS, rope_theta=THETA)
    positions = torch.tensor([[0, 1, 2, 3, 4], [0, 0, 0, 1, 2]])
    generator = torch.Generator().manual_seed(3)
    query = torch.randn(2, HEADS, 5, HEAD_DIM, generator=generator)
    key = torch.randn(2, GROUPS, 5, HEAD_DIM, generator=generator)
    hf_cos, hf_sin = Qwen2RotaryEmbedding(config)(query, positions)
    hf_query, hf_key = apply_rotary_pos_emb(query, key, hf_cos, hf_sin)
    cos, sin = rotary_tables(positions, HEAD_DIM, THETA)  # [b, s, d]
    torch.testing.assert_close(cos, hf_cos)
    torch.testing.assert_close(sin, hf_sin)
    torch.testing.assert_close(rotate(query, cos[:, None], sin[:, None]), hf_query)
    torch.testing.assert_close(rotate(key, cos[:, None], sin[:, None]), hf_key)


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


PADDING = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 0]])


def _positions(padding: torch.Tensor) -> torch.Tensor:
    return (padding.cumsum(dim=1) - 1).clamp(min=0)


def _inputs(seed: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    seq, batch = PADDING.shape[1], PADDING.shape[0]
    query = torch.randn(seq, batch, HEADS, HEAD_DIM, generator=generator, dtype=torch.float64)
    key = torch.randn(seq, batch, GROUPS, HEAD_DIM, generator=generator, dtype=torch.float64)
    value = torch.randn(seq, batch, GROUPS, HEAD_DIM, generator=generator, dtype=torch.float64)
    return query, key, value, PADDING


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


def _rotated(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``[s, b, n, d]`` rotated at ``[b, s]`` positions, one token at a time."""
    out = torch.empty_like(x)
    for b in range(x.shape[1]):
        for t in range(x.shape[0]):
            cos, sin = rotary_tables(positions[b, t], HEAD_DIM, THETA)
            out[t, b] = rotate(x[t, b], cos, sin)
    return out


def test_sdpa_matches_the_written_out_attention(one_rank_model_parallel) -> None:  # noqa: F811
    attention = _core_attention()
    query, key, value, padding = _inputs(0)
    positions = _positions(padding)
    masked = attention_mask(padding)
    layout = padded_layout(positions, HEAD_DIM, THETA)
    out = attention(query, key, value, masked, packed_seq_params=layout)
    assert out.shape == (5, 2, HEADS * HEAD_DIM)
    expected = _written_out(_rotated(query, positions), _rotated(key, positions), value, masked)
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)


def test_packed_row_gives_each_real_token_its_padded_output(
    one_rank_model_parallel,  # noqa: F811
) -> None:
    attention = _core_attention()
    query, key, value, padding = _inputs(4)
    padded = attention(
        query,
        key,
        value,
        attention_mask(padding),
        packed_seq_params=padded_layout(_positions(padding), HEAD_DIM, THETA),
    )
    ids = torch.arange(padding.numel()).view_as(padding)
    packed = pack_rows(ids, padding, response_width=2)
    real = padding.T.bool()  # [s, b], the order of megatron-core's rows
    order = ids.T[real].argsort()  # packed order: row by row
    q, k, v = (t[real][order] for t in (query, key, value))  # [T, n, d] as megatron squeezes
    out = attention(q, k, v, None, packed_seq_params=packed_layout(packed, HEAD_DIM, THETA))
    assert out.shape == (int(padding.sum()), HEADS * HEAD_DIM)
    torch.testing.assert_close(out, padded[real][order], rtol=1e-9, atol=1e-9)


def test_padding_reaches_no_real_position(one_rank_model_parallel) -> None:  # noqa: F811
    attention = _core_attention()
    query, key, value, padding = _inputs(1)
    masked = attention_mask(padding)
    layout = padded_layout(_positions(padding), HEAD_DIM, THETA)
    out = attention(query, key, value, masked, packed_seq_params=layout)
    pad = (padding == 0).T  # [s, b]
    key, value = key.clone(), value.clone()
    key[pad], value[pad] = 1e6, -1e6
    changed = attention(query, key, value, masked, packed_seq_params=layout)
    real = ~pad
    assert torch.equal(changed[real], out[real])
    assert torch.isfinite(out).all()


def test_other_attention_inputs_are_refused(one_rank_model_parallel) -> None:  # noqa: F811
    attention = _core_attention()
    query, key, value, padding = _inputs(2)
    masked = attention_mask(padding)
    layout = padded_layout(_positions(padding), HEAD_DIM, THETA)
    packed = packed_layout(pack_rows(padding, padding, 2), HEAD_DIM, THETA)
    refused = [
        {"attention_mask": masked, "packed_seq_params": layout, "attention_bias": torch.zeros(1)},
        {"attention_mask": masked, "packed_seq_params": None},  # no positions
        {"attention_mask": None, "packed_seq_params": layout},  # padded rows without a mask
        {"attention_mask": masked, "packed_seq_params": packed},  # a packed row with a mask
    ]
    for inputs in refused:
        mask = inputs.pop("attention_mask")
        with pytest.raises(ValueError, match="engine's sequence layout"):
            attention(query, key, value, mask, **inputs)
