#!/usr/bin/env bash
# The hf rollout on one H200 (issue 25): its CUDA tests, the length-mix benchmark (continuous
# batching against the chunked static path) and `polyrl train` with continuous batching off and
# on, one shape per call. From the repo root, after `. .device/setup.sh`:
#   SHAPE=qwen2-0.5b PROMPTS=32 RESPONSE=256 bash benchmarks/gpu/run_rollout_h200.sh
# Environment: as run_h200.sh; RESULTS (a folder for the logs and metrics, /tmp/rollout-h200),
# SKIP_TESTS / SKIP_MIX (1 to skip those parts).
set -uo pipefail
results=${RESULTS:-/tmp/rollout-h200}
mkdir -p "$results"
shape=${SHAPE:-qwen2-0.5b}
tag="${shape}_$((${PROMPTS:-32} * 8))x${RESPONSE:-256}"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
    python3 -m pytest plugins/rollout_hf/tests -q -k cuda 2>&1 | tee "$results/cuda_tests.log"
fi
if [ "${SKIP_MIX:-0}" != 1 ]; then
    python3 benchmarks/gpu/bench_length_mix.py --shape "$shape" --device cuda --prompts 128 --n 8 \
        --slots 256 --max-new-tokens 256 --prompt-len 64 --runs 3 \
        --json "$results/length_mix_$shape.json" 2>&1 | grep -v "Loading weights" |
        tee "$results/length_mix_$shape.log"
fi
for continuous in false true; do
    OUT=/tmp/polyrl-gpu TAG="_cb_$continuous" \
        EXTRA="+actor_rollout_ref.rollout.engine_kwargs.hf.continuous_batching=$continuous ${EXTRA:-}" \
        bash benchmarks/gpu/run_h200.sh 1 2>&1 | grep -v "Loading weights" | tail -40 |
        tee "$results/train_${tag}_cb_$continuous.log"
    cp "/tmp/polyrl-gpu/h200_${shape}_1gpu_cb_$continuous/metrics.jsonl" \
        "$results/train_${tag}_cb_$continuous.jsonl"
done
