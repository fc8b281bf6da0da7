#!/usr/bin/env bash
# polyrl vs TRL's GRPOTrainer on one H200 (issue 12, item 4): the GPU benchmark's shape (random
# Qwen2-0.5B, 32 prompts x 8 samples, <= 256 response tokens, bf16 compute over fp32 master
# weights, micro-batches of 32 rows, no KL term), both sides with transformers-based generation.
# From the repo root on the GPU machine, after `. .device/setup.sh` (the bundle carries trl and
# datasets; see ENVIRONMENT.md):   bash benchmarks/gpu/run_vs_trl_h200.sh
set -euo pipefail
model=${MODEL:-/tmp/qwen2-0.5b-random}
out=${OUT:-/tmp/polyrl-gpu}/vs_trl
[ -f "$model/config.json" ] || python3 benchmarks/gpu/make_random_model.py "$model"
mkdir -p "$out"
python3 benchmarks/bench_vs_trl.py --device cuda --model "$model" --data builtin:tiny_digits \
    --steps "${STEPS:-6}" --warmup 1 --batch 32 --n 8 --micro-batch 32 --response-length 256 \
    --lr 1e-6 --dtype bf16 --work-dir "$out" --json "$out/summary.json"
