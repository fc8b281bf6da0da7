"""Write a randomly initialised Qwen2-0.5B-shaped model folder (no checkpoint needed).

Throughput and MFU do not depend on the weights' values, so the GPU benchmark uses the real
architecture (hidden 896, 24 layers, 14 heads, 2 KV heads, vocabulary 151,936) with random
weights and polyrl's offline tiny tokenizer (its ids are a subset of the vocabulary). The shape
and the builder are ``polyrl.models.shapes.build_random_model``.

    python benchmarks/gpu/make_random_model.py /tmp/qwen2-0.5b-random
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from polyrl.models.shapes import build_random_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out_dir")
    args = parser.parse_args()

    out = build_random_model(args.out_dir, "qwen2-0.5b", tokenizer_from="tiny", dtype="bfloat16")
    params = json.loads(Path(out, "polyrl_random.json").read_text())["parameters"]
    print(f"wrote {params / 1e6:.0f}M parameters to {out}")


if __name__ == "__main__":
    main()
