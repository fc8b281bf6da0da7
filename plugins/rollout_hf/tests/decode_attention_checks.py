"""Checks of the Triton decode attention (``polyrl_rollout_hf.decode_attention``), shared by
the CUDA test and the CPU one.

On CPU the kernels run under Triton's interpreter, which must be on (``TRITON_INTERPRET=1``)
before triton is imported; ``test_decode_attention.py`` runs this file as a script in a process
of its own for that. The interpreter cannot load bfloat16 (numpy has no such type), so on CPU the
half-precision case is float16.
"""

from __future__ import annotations

import sys

import torch
from hf_engines import build_gqa_model, hf_engine

from polyrl.api import Batch, SamplingParams
from polyrl_rollout_hf.decode_attention import decode_attention

# rows, KV heads, query heads per KV head, head dim, cache columns, read end, splits (None: the
# default for the device)
CASES = [
    (3, 2, 7, 64, 256, 150, 1),  # Qwen2-0.5B's grouping, one pass per row
    (3, 2, 7, 64, 256, 150, 3),  # the same columns in three parts, then combined
    (2, 2, 6, 128, 128, 128, 2),  # Qwen2.5-1.5B's grouping, read to the last column
    (4, 1, 3, 80, 64, 33, None),  # a head dim and group that are not powers of two
    (2, 2, 2, 32, 64, 1, 4),  # one column to read: three of the four parts have none
]
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def check_against_sdpa(device: str, dtypes: list[torch.dtype]) -> None:
    """The kernel's output equals SDPA's over the columns before the read end that the mask
    allows; columns at and past the end are never read, whatever the mask says of them, and
    the cache may hold more rows than are decoded."""
    generator = torch.Generator().manual_seed(0)
    for dtype in dtypes:
        for rows, kv_heads, group, dim, length, end, splits in CASES:
            query, keys, values = (
                torch.randn(*shape, generator=generator).to(device=device, dtype=dtype)
                for shape in (
                    (rows, kv_heads, group, dim),
                    *[(rows + 1, kv_heads, length, dim)] * 2,
                )
            )
            mask = torch.rand(rows, length, generator=generator) < 0.6
            mask[:, end - 1] = True  # every row attends to at least one column
            mask[:, end:] = True  # past the end: must be ignored
            keys[:, :, end:] = float("nan")  # and never read
            read_end = torch.tensor([end], device=device)
            out = decode_attention(
                query, keys, values, mask.to(device), read_end, 0.125, splits=splits
            )
            reference = torch.nn.functional.scaled_dot_product_attention(
                query.double(),
                keys[:rows, :, :end].double(),
                values[:rows, :, :end].double(),
                attn_mask=mask[:, None, None, :end].to(device),
                scale=0.125,
            ).reshape(rows, -1)
            error = (out.double() - reference).abs().max().item()
            assert out.dtype == dtype and out.shape == (rows, kv_heads * group * dim)
            assert error < TOLERANCE[dtype], (dtype, rows, kv_heads, group, dim, end, splits, error)


def kernel_on(engine):
    """``engine`` with its fused step's attention through the kernel: the engine option where
    the device has it, set by hand under the interpreter (before any decoder exists)."""
    engine.static_decode.fused.attention_kernel = True
    return engine


def engine(path: str, device: str, **hf: str):
    hf = {"static_cache": "true", **hf}
    config = {
        "dtype": "float32",
        "micro_batch_size": hf.pop("slots", 64),
        "engine_kwargs": {"hf": hf},
    }
    return hf_engine(path, config, device)


def assert_same(a: Batch, b: Batch, atol: float = 1e-5) -> None:
    assert torch.equal(a["responses"], b["responses"])
    assert torch.equal(a["response_mask"], b["response_mask"])
    assert torch.allclose(a["rollout_log_probs"], b["rollout_log_probs"], atol=atol)


def check_engine_samples(tmp: str, device: str) -> None:
    """In float32 the rollout with the kernel samples what it samples with SDPA: chunks of the
    static path (greedy and drawn), and continuous batching with more samples than slots, where
    the write column wraps round the cache's ring of 64 columns."""
    gqa = build_gqa_model(f"{tmp}/gqa", seed=0)
    ids = torch.randint(3, 448, (3, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # left padding
    prompts = Batch({"input_ids": ids, "attention_mask": mask})
    kernel = {"triton_attention": "true"} if device == "cuda" else {}
    for options, params in (
        ({}, SamplingParams(n=1, max_new_tokens=16, greedy=True)),
        ({}, SamplingParams(n=1, max_new_tokens=8, seed=3)),
        ({"slots": 1}, SamplingParams(n=2, max_new_tokens=32, greedy=True)),
    ):
        continuous = "true" if options else "false"
        with_kernel = engine(gqa, device, continuous_batching=continuous, **options, **kernel)
        if device != "cuda":
            kernel_on(with_kernel)
        sdpa = engine(
            gqa, device, continuous_batching=continuous, **options, triton_attention="false"
        )
        assert with_kernel.static_decode.fused.attention_kernel
        assert not sdpa.static_decode.fused.attention_kernel
        batch = prompts if not options else prompts.select_rows(torch.tensor([0]))
        out = with_kernel.generate(batch, params)
        if options:  # 2 samples x 32 tokens through 1 slot: 64 steps after 7
            assert int(out["response_mask"].sum()) == 64
        assert_same(out, sdpa.generate(batch, params))


if __name__ == "__main__":  # on CPU, under the interpreter
    check_against_sdpa("cpu", [torch.float32, torch.float16])
    check_engine_samples(sys.argv[1], "cpu")
    print("decode attention checks passed")
