"""One layer's decode attention: the Triton kernel against SDPA, time and error (issue 25).

At the decode shapes of the issue's models (grouped query heads, a bool mask over the static
cache), with the read end at a point of the call, each side runs as the fused step calls it:
SDPA over the span (the quarter of the cache that covers the read end) with the mask, the kernel
to the read end. Times are medians of CUDA-event timed replays of a CUDA graph of the call (as
the step runs it); the bandwidth is what each side must read over its time:

    bytes = rows x KV x columns x D x 2 (keys and values) x 2 bytes   (columns: the span for
            SDPA, the read end for the kernel) + the mask's rows x columns bytes

Errors are against float64 attention over the same columns (the largest and the mean absolute
difference), next to the difference between the two sides, so a difference between them can be
read against the rounding each has on its own.

    python benchmarks/gpu/bench_decode_attention.py --json out.jsonl
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics

import torch
import torch.nn.functional as F
from bench_decode import RATES

# name: rows, KV heads, query heads per KV head, head dim, cache columns, read ends
SHAPES = {
    "qwen2-0.5b 256 rows": (256, 2, 7, 64, 384, (96, 192, 320)),
    "qwen2-0.5b 512 rows": (512, 2, 7, 64, 768, (192, 320, 576)),
    "qwen2.5-1.5b 512 rows": (512, 2, 6, 128, 768, (192, 320, 576)),
    "qwen2.5-1.5b 64 rows": (64, 2, 6, 128, 768, (192, 576)),
    # long caches with few rows, where the default splits the columns
    "qwen2-0.5b 32 rows, 4k cache": (32, 2, 7, 64, 4096, (1024, 4096)),
    "qwen2.5-1.5b 16 rows, 8k cache": (16, 2, 6, 128, 8192, (2048, 8192)),
}


def timed(fn, repeats: int, calls: int = 20) -> float:
    """Median seconds of one ``fn`` call, from ``repeats`` CUDA-event timed replays of a CUDA
    graph of ``calls`` calls: the fused step runs attention inside a captured graph, so the
    host's launch cost (tens of microseconds, the size of the kernel itself) is left out."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / calls)
    return statistics.median(times)


def main() -> None:
    from polyrl_rollout_hf.decode_attention import PROGRAMS_PER_SM, decode_attention, split_count
    from polyrl_rollout_hf.static_decode import span_sizes

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    device = torch.device("cuda")
    name = torch.cuda.get_device_name(device)
    bandwidth = next((rate for gpu, (rate, _) in RATES.items() if gpu in name), RATES["H100"][0])
    print(f"{name}, torch {torch.__version__}; bandwidth {bandwidth / 1e12:.2f} TB/s")
    generator = torch.Generator(device=device).manual_seed(0)
    records = []
    for shape, (rows, kv_heads, group, dim, length, ends) in SHAPES.items():
        query = torch.randn(rows, kv_heads, group, dim, device=device, generator=generator)
        keys = torch.randn(rows, kv_heads, length, dim, device=device, generator=generator)
        values = torch.randn(rows, kv_heads, length, dim, device=device, generator=generator)
        query, keys, values = (t.bfloat16() for t in (query, keys, values))
        scale = dim**-0.5
        for end in ends:
            # prompts left-padded by up to 16 columns, the rest written
            mask = torch.ones(rows, length, dtype=torch.bool, device=device)
            pads = torch.randint(0, 16, (rows, 1), device=device, generator=generator)
            mask &= torch.arange(length, device=device) >= pads
            span = next(s for s in span_sizes(length) if s >= end)
            read_end = torch.tensor([end], device=device)
            span_mask = mask[:, None, None, :span].clone()
            span_mask[..., end:] = False

            sdpa = functools.partial(
                F.scaled_dot_product_attention,
                query,
                keys[:, :, :span],
                values[:, :, :span],
                attn_mask=span_mask,
                scale=scale,
            )
            kernel = functools.partial(decode_attention, query, keys, values, mask, read_end, scale)
            exact = F.scaled_dot_product_attention(
                query.double(),
                keys[:, :, :end].double(),
                values[:, :, :end].double(),
                attn_mask=mask[:, None, None, :end],
                scale=scale,
            ).reshape(rows, -1)
            outs = {"sdpa": sdpa().reshape(rows, -1), "kernel": kernel()}
            record = {"device": name, "shape": shape, "read_end": end, "span": span}
            for side, fn, columns in (("sdpa", sdpa, span), ("kernel", kernel, end)):
                seconds = timed(fn, args.repeats)
                moved = rows * kv_heads * columns * dim * 2 * 2 + rows * columns
                error = (outs[side].double() - exact).abs()
                record[side] = {
                    "us": seconds * 1e6,
                    "bytes": moved,
                    "tb_per_s": moved / seconds / 1e12,
                    "bandwidth_share": moved / seconds / bandwidth,
                    "max_error": error.max().item(),
                    "mean_error": error.mean().item(),
                }
            between = (outs["sdpa"].float() - outs["kernel"].float()).abs()
            record["sides_max_diff"] = between.max().item()
            record["sides_equal_share"] = (between == 0).float().mean().item()
            s, k = record["sdpa"], record["kernel"]
            one_part = functools.partial(kernel, splits=1)
            record["kernel_one_part_us"] = timed(one_part, args.repeats) * 1e6
            record["kernel_parts"] = split_count(
                rows,
                kv_heads,
                length,
                PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count,
            )
            print(
                f"{shape}, read end {end} (span {span}): SDPA {s['us']:.1f} us "
                f"({s['tb_per_s']:.2f} TB/s, {100 * s['bandwidth_share']:.0f} %), kernel "
                f"{k['us']:.1f} us ({k['tb_per_s']:.2f} TB/s, {100 * k['bandwidth_share']:.0f} %), "
                f"{s['us'] / k['us']:.2f}x; error vs float64 max/mean: SDPA "
                f"{s['max_error']:.1e}/{s['mean_error']:.1e}, kernel "
                f"{k['max_error']:.1e}/{k['mean_error']:.1e}; between them max "
                f"{record['sides_max_diff']:.1e}, {100 * record['sides_equal_share']:.1f} % equal; "
                f"the kernel in {record['kernel_parts']} part(s); unsplit "
                f"{record['kernel_one_part_us']:.1f} us"
            )
            records.append(record)
    if args.json:
        with open(args.json, "a") as f:
            for record in records:
                f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
