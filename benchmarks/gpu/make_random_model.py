"""Write a randomly initialised Qwen2-shaped model folder (no checkpoint needed).

Throughput and MFU do not depend on the weights' values, so the GPU benchmark uses the real
architecture (Qwen2-0.5B: hidden 896, 24 layers, 14 heads, 2 KV heads, vocabulary 151,936; or
Qwen2.5-1.5B: hidden 1536, 28 layers, 12 heads) with random weights and polyrl's offline tiny
tokenizer (its ids are a subset of the vocabulary). The shapes and the builder are
``polyrl.models.shapes``.

    python benchmarks/gpu/make_random_model.py /tmp/qwen2-0.5b-random
    python benchmarks/gpu/make_random_model.py /tmp/qwen2.5-1.5b-random --shape qwen2.5-1.5b
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from polyrl.models.shapes import SHAPES, build_random_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out_dir")
    parser.add_argument("--shape", default="qwen2-0.5b", choices=sorted(SHAPES))
    args = parser.parse_args()

    out = build_random_model(args.out_dir, args.shape, tokenizer_from="tiny", dtype="bfloat16")
    params = json.loads(Path(out, "polyrl_random.json").read_text())["parameters"]
    print(f"wrote {params / 1e6:.0f}M parameters to {out}")


if __name__ == "__main__":
    main()
