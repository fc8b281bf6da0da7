"""Write a randomly initialised Qwen2-shaped model folder (no checkpoint needed).

Throughput and MFU do not depend on the weights' values, so the GPU benchmark uses the real
architecture (Qwen2-0.5B: hidden 896, 24 layers, 14 heads, 2 KV heads, vocabulary 151,936; or
Qwen2.5-1.5B: hidden 1536, 28 layers, 12 heads) with random weights and polyrl's offline tiny
tokenizer (its ids are a subset of the vocabulary). The shapes and the builder are
``polyrl.models.shapes``.

    python benchmarks/gpu/make_random_model.py /tmp/qwen2-0.5b-random
    python benchmarks/gpu/make_random_model.py /tmp/qwen2.5-1.5b-random --shape qwen2.5-1.5b
    python benchmarks/gpu/make_random_model.py /tmp/mix --eos-rate 0.006   # responses end at random

``--eos-rate p``: every sampled token (temperature 1) ends the response with probability ``p``, so
response lengths are geometric with mean ~1/p, cut at the length limit (see :func:`set_eos_rate`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from polyrl.models.shapes import SHAPES, build_random_model


def set_eos_rate(folder: str, rate: float) -> list[int]:
    """Make the model at ``folder`` end each sampled response step with probability ``rate``.

    How: the final norm's weight is zeroed, so every logit is exactly 0 and sampling is uniform
    over the vocabulary; ``round(rate x vocabulary)`` ids (the model's EOS and the top of the
    vocabulary, above the tokenizer's ids) become end-of-sequence ids in
    ``generation_config.json``. The work per token is unchanged (same shapes, same kernels).
    Returns the EOS ids.
    """
    import torch
    from safetensors.torch import load_file, save_file

    config = json.loads(Path(folder, "config.json").read_text())
    vocab = int(config["vocab_size"])
    count = round(rate * vocab)
    if not 1 <= count < vocab // 2:
        raise SystemExit(f"--eos-rate {rate}: gives {count} of {vocab} ids; use 1/vocab .. 0.5")
    weights_file = Path(folder, "model.safetensors")
    weights = load_file(str(weights_file))
    weights["model.norm.weight"] = torch.zeros_like(weights["model.norm.weight"])
    save_file(weights, str(weights_file), metadata={"format": "pt"})
    eos = int(config.get("eos_token_id") or vocab - 1)
    ids = [eos, *[i for i in range(vocab - 1, -1, -1) if i != eos][: count - 1]]
    generation_file = Path(folder, "generation_config.json")
    generation = json.loads(generation_file.read_text()) if generation_file.is_file() else {}
    generation["eos_token_id"] = ids
    generation_file.write_text(json.dumps(generation, indent=1))
    record_file = Path(folder, "polyrl_random.json")
    record = json.loads(record_file.read_text())
    record["eos_rate"] = len(ids) / vocab
    record_file.write_text(json.dumps(record))
    return ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out_dir")
    parser.add_argument("--shape", default="qwen2-0.5b", choices=sorted(SHAPES))
    parser.add_argument("--eos-rate", type=float, default=None, help="stop probability per token")
    args = parser.parse_args()

    out = build_random_model(args.out_dir, args.shape, tokenizer_from="tiny", dtype="bfloat16")
    params = json.loads(Path(out, "polyrl_random.json").read_text())["parameters"]
    print(f"wrote {params / 1e6:.0f}M parameters to {out}")
    if args.eos_rate is not None:
        ids = set_eos_rate(out, args.eos_rate)
        print(f"{len(ids)} EOS ids: each sampled token ends the response with p = {args.eos_rate}")


if __name__ == "__main__":
    main()
