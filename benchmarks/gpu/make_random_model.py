"""Write a randomly initialised Qwen2-0.5B-shaped model folder (no checkpoint needed).

Throughput and MFU do not depend on the weights' values, so the GPU benchmark uses the real
architecture (hidden 896, 24 layers, 14 heads, 2 KV heads, vocabulary 151,936) with random
weights and polyrl's offline tiny tokenizer (its ids are a subset of the vocabulary).

    python benchmarks/gpu/make_random_model.py /tmp/qwen2-0.5b-random
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from polyrl.models.tiny import build_tiny_model

QWEN2_05B = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out_dir")
    args = parser.parse_args()

    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    with tempfile.TemporaryDirectory() as tiny:
        build_tiny_model(tiny)
        tokenizer = AutoTokenizer.from_pretrained(tiny)
        config = Qwen2Config(
            **QWEN2_05B,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
        out = Path(args.out_dir)
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        for name in ("generation_config.json",):
            if (Path(tiny) / name).exists():
                shutil.copy(Path(tiny) / name, out / name)
    print(f"wrote {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters to {out}")


if __name__ == "__main__":
    main()
