"""Decode attention over the static KV cache as a Triton kernel: one pass over the columns that
were written, split along them when there are too few rows to fill the GPU and the cache is
long.

Why: SDPA is handed the whole cache (or a quarter-sized span of it) and a mask tensor, so a step
reads columns no row has reached yet, and its kernel, tiled for long query blocks, keeps far from
the memory bandwidth with the handful of grouped query heads a decode step has. Here each program
takes one row's KV head and the query heads grouped on it (``H / KV`` of them, padded to the 16
rows a tensor-core product needs), reads the keys and values once, and stops at the read end:
a device scalar the step sets, so one captured CUDA graph serves every step of a call.

The arithmetic is the one of flash attention: scores in float32, a running maximum and sum per
query head, the probabilities rounded to the cache's dtype before they weight the values, the
output normalised once at the end. The mask keeps its meaning (columns it does not allow get no
weight), so prompts' padding and the continuous batcher's ring of slots need nothing new.
"""

from __future__ import annotations

import functools

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the kernel is then unavailable; the step keeps SDPA
    triton = None

# programs per streaming multiprocessor the split aims for: enough to hide memory latency
PROGRAMS_PER_SM = 4
# the fewest cache columns a part covers: below that, writing and combining the parts' partial
# results costs more than the idle multiprocessors (`bench_decode_attention.py` compares them)
PART_COLUMNS = 1024
LOG2_E = 1.4426950408889634


def unavailable_reason(device: torch.device) -> str | None:
    """Why the kernel cannot run on ``device``, or None when it can."""
    if triton is None:
        return "triton is not installed"
    if device.type != "cuda":
        return f"device {device.type!r} (the kernel runs on CUDA)"
    return None


def _power_of_two(value: int, minimum: int = 1) -> int:
    return max(minimum, 1 << (int(value) - 1).bit_length())


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def split_count(rows: int, kv_heads: int, length: int, programs: int) -> int:
    """How many parts each row's ``length`` cache columns are split into: enough that
    ``rows x kv_heads x parts`` reaches ``programs``, each part at least ``PART_COLUMNS``."""
    pairs = max(1, rows * kv_heads)
    return max(1, min(-(-programs // pairs), length // PART_COLUMNS))


if triton is not None:

    @triton.jit
    def _partial_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        mask_ptr,
        end_ptr,
        out_ptr,
        acc_ptr,
        stat_ptr,
        stride_qr,
        stride_qh,
        stride_qg,
        stride_kr,
        stride_kh,
        stride_kl,
        stride_vr,
        stride_vh,
        stride_vl,
        stride_mr,
        stride_or,
        qk_scale,
        GROUP: tl.constexpr,
        GROUP_PAD: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        DIM_PAD: tl.constexpr,
        BLOCK: tl.constexpr,
        SPLITS: tl.constexpr,
    ):
        row = tl.program_id(0)
        head = tl.program_id(1)
        part = tl.program_id(2)
        heads = tl.num_programs(1)
        end = tl.load(end_ptr)
        # this part's columns: the read range cut into SPLITS block-aligned pieces
        chunk = tl.cdiv(tl.cdiv(end, SPLITS), BLOCK) * BLOCK
        lo = part * chunk
        hi = tl.minimum(lo + chunk, end)
        groups = tl.arange(0, GROUP_PAD)
        dims = tl.arange(0, DIM_PAD)
        dim_ok = dims < HEAD_DIM
        q_rows = q_ptr + row * stride_qr + head * stride_qh + groups[:, None] * stride_qg
        q = tl.load(
            q_rows + dims[None, :], mask=(groups[:, None] < GROUP) & dim_ok[None, :], other=0.0
        )
        best = tl.full((GROUP_PAD,), float("-inf"), tl.float32)
        total = tl.zeros((GROUP_PAD,), tl.float32)
        acc = tl.zeros((GROUP_PAD, DIM_PAD), tl.float32)
        k_base = k_ptr + row * stride_kr + head * stride_kh
        v_base = v_ptr + row * stride_vr + head * stride_vh
        for start in range(lo, hi, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            col_ok = cols < hi
            allowed = tl.load(mask_ptr + row * stride_mr + cols, mask=col_ok, other=0) != 0
            tile_ok = col_ok[:, None] & dim_ok[None, :]
            keys = tl.load(
                k_base + cols[:, None] * stride_kl + dims[None, :], mask=tile_ok, other=0.0
            )
            scores = tl.dot(q, tl.trans(keys), input_precision="ieee") * qk_scale
            scores = tl.where(allowed[None, :], scores, float("-inf"))
            new_best = tl.maximum(best, tl.max(scores, 1))
            shift = tl.where(new_best == float("-inf"), 0.0, new_best)
            weights = tl.exp2(scores - shift[:, None])
            rescale = tl.exp2(best - shift)
            total = total * rescale + tl.sum(weights, 1)
            values = tl.load(
                v_base + cols[:, None] * stride_vl + dims[None, :], mask=tile_ok, other=0.0
            )
            acc = acc * rescale[:, None] + tl.dot(
                weights.to(values.dtype), values, input_precision="ieee"
            )
            best = new_best
        out_mask = (groups[:, None] < GROUP) & dim_ok[None, :]
        if SPLITS == 1:
            out = acc / total[:, None]
            out_rows = out_ptr + row * stride_or + (head * GROUP + groups[:, None]) * HEAD_DIM
            tl.store(out_rows + dims[None, :], out.to(out_ptr.dtype.element_ty), mask=out_mask)
        else:
            slot = (row * heads + head) * SPLITS + part
            acc_rows = acc_ptr + (slot * GROUP_PAD + groups[:, None]) * DIM_PAD
            tl.store(acc_rows + dims[None, :], acc)
            tl.store(stat_ptr + (slot * 2) * GROUP_PAD + groups, best)
            tl.store(stat_ptr + (slot * 2 + 1) * GROUP_PAD + groups, total)

    @triton.jit
    def _combine_kernel(
        out_ptr,
        acc_ptr,
        stat_ptr,
        stride_or,
        GROUP: tl.constexpr,
        GROUP_PAD: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        DIM_PAD: tl.constexpr,
        SPLITS: tl.constexpr,
    ):
        row = tl.program_id(0)
        head = tl.program_id(1)
        heads = tl.num_programs(1)
        groups = tl.arange(0, GROUP_PAD)
        dims = tl.arange(0, DIM_PAD)
        first = (row * heads + head) * SPLITS
        best = tl.full((GROUP_PAD,), float("-inf"), tl.float32)
        for part in range(SPLITS):
            best = tl.maximum(best, tl.load(stat_ptr + ((first + part) * 2) * GROUP_PAD + groups))
        shift = tl.where(best == float("-inf"), 0.0, best)
        total = tl.zeros((GROUP_PAD,), tl.float32)
        acc = tl.zeros((GROUP_PAD, DIM_PAD), tl.float32)
        for part in range(SPLITS):
            slot = first + part
            scale = tl.exp2(tl.load(stat_ptr + (slot * 2) * GROUP_PAD + groups) - shift)
            total += scale * tl.load(stat_ptr + (slot * 2 + 1) * GROUP_PAD + groups)
            acc_rows = acc_ptr + (slot * GROUP_PAD + groups[:, None]) * DIM_PAD
            acc += scale[:, None] * tl.load(acc_rows + dims[None, :])
        out = acc / total[:, None]
        out_rows = out_ptr + row * stride_or + (head * GROUP + groups[:, None]) * HEAD_DIM
        out_mask = (groups[:, None] < GROUP) & (dims[None, :] < HEAD_DIM)
        tl.store(out_rows + dims[None, :], out.to(out_ptr.dtype.element_ty), mask=out_mask)


def decode_attention(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    read_end: torch.Tensor,
    scale: float,
    *,
    splits: int | None = None,
) -> torch.Tensor:
    """Attention of one query token per row, ``[rows, H * D]``.

    ``query [rows, KV, H/KV, D]`` (the query heads grouped on their KV head), ``keys`` and
    ``values [>= rows, KV, L, D]`` (the static cache; only its first ``rows`` rows are read),
    ``mask [rows, L]`` (bool, True = attend) and ``read_end`` (a one-element integer tensor on
    the device: columns at and past it are not read; every row must allow at least one column
    before it). ``splits`` fixes how many parts each row's columns are cut into (default: enough
    programs for the GPU).
    """
    rows, kv_heads, group, head_dim = query.shape
    length = keys.shape[2]
    if keys.stride(-1) != 1 or values.stride(-1) != 1 or query.stride(-1) != 1:
        raise ValueError("decode_attention needs the head dimension contiguous")
    if mask.shape != (rows, length) or mask.stride(-1) != 1:
        raise ValueError(f"mask must be [rows, L] = [{rows}, {length}], got {tuple(mask.shape)}")
    group_pad = _power_of_two(group, 16)
    dim_pad = _power_of_two(head_dim, 16)
    block = 64 if dim_pad >= 128 else 128
    if splits is None:
        programs = PROGRAMS_PER_SM * (_sm_count(query.device.index or 0) if query.is_cuda else 1)
        splits = split_count(rows, kv_heads, length, programs)
    out = torch.empty((rows, kv_heads * group * head_dim), dtype=query.dtype, device=query.device)
    acc = stats = out  # unused when the columns are not split
    if splits > 1:
        acc = torch.empty(
            (rows, kv_heads, splits, group_pad, dim_pad), dtype=torch.float32, device=query.device
        )
        stats = torch.empty(
            (rows, kv_heads, splits, 2, group_pad), dtype=torch.float32, device=query.device
        )
    mask_bytes = mask.view(torch.uint8) if mask.dtype == torch.bool else mask
    _partial_kernel[(rows, kv_heads, splits)](
        query,
        keys,
        values,
        mask_bytes,
        read_end,
        out,
        acc,
        stats,
        query.stride(0),
        query.stride(1),
        query.stride(2),
        keys.stride(0),
        keys.stride(1),
        keys.stride(2),
        values.stride(0),
        values.stride(1),
        values.stride(2),
        mask_bytes.stride(0),
        out.stride(0),
        float(scale) * LOG2_E,
        GROUP=group,
        GROUP_PAD=group_pad,
        HEAD_DIM=head_dim,
        DIM_PAD=dim_pad,
        BLOCK=block,
        SPLITS=splits,
        num_warps=4,
        num_stages=2,
    )
    if splits > 1:
        _combine_kernel[(rows, kv_heads)](
            out,
            acc,
            stats,
            out.stride(0),
            GROUP=group,
            GROUP_PAD=group_pad,
            HEAD_DIM=head_dim,
            DIM_PAD=dim_pad,
            SPLITS=splits,
            num_warps=4,
        )
    return out
