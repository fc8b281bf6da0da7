#!/usr/bin/env bash
# Issue 24 (multi-turn rollout throughput) on one GPU: the prefix-cache CUDA test, then
# benchmarks/bench_multi_turn.py at the shape (Qwen2-0.5B shape, 256 episodes, 4 assistant
# turns of 128 tokens, observations of 8 words, 64-token prompts; single-turn side: 512 tokens)
# for each side, one process each: the rollout package (and, when there, the core package) of an
# older commit under $BASELINE, the working tree with the prefix cache off (the held decode ladder
# reused across turns only), and the working tree as it runs by default. From the repo root, after
# `. .device/setup.sh`:
#   git archive <commit> plugins/rollout_hf/src core/src/polyrl | tar -x -C .baseline-mt   # dev machine
#   RESULTS=$OUT bash benchmarks/gpu/run_multi_turn_h200.sh
# Environment: RESULTS (folder for the logs and one JSON per side, /tmp/multi-turn-h200), BASELINE
# (.baseline-mt: its plugins/rollout_hf/src and core/src go first on PYTHONPATH; the side is
# skipped without the first), PARTS (tests baseline nocache current profile: which to run, in that
# order; the default leaves out profile; a part named again runs again, its files numbered from
# its second run on: multi_turn_current_2.json, so that alternating sides share the machine),
# RUNS (timed runs, 3), EPISODES (256).
set -uo pipefail
results=${RESULTS:-/tmp/multi-turn-h200}
baseline=${BASELINE:-.baseline-mt}
mkdir -p "$results"
export PYTHONUNBUFFERED=1 XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/polyrl-user-cache}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$results/device.txt"
bench() {  # side, extra arguments
    local side=$1
    shift
    python3 benchmarks/bench_multi_turn.py --device cuda --model qwen2-0.5b-random \
        --episodes "${EPISODES:-256}" --turns 4 --tokens-per-turn 128 --observation-words 8 \
        --prompt-len 64 --micro-batch-size 256 --runs "${RUNS:-3}" --warmup 1 \
        --out "$results/multi_turn_$side.json" "$@" 2>&1 |
        grep -v "Loading weights\|Writing model" | tee "$results/multi_turn_$side.log"
}
declare -A runs_of
for part in ${PARTS:-tests baseline nocache current}; do
    runs_of[$part]=$((${runs_of[$part]:-0} + 1))
    label=$part
    [ "${runs_of[$part]}" -gt 1 ] && label=${part}_${runs_of[$part]}
    case $part in
    tests)
        timeout 600 python3 -m pytest plugins/rollout_hf/tests/test_prefix_cache.py \
            plugins/rollout_hf/tests/test_continuous.py -q -k cuda 2>&1 | tail -5 |
            tee "$results/cuda_tests.log" ;;
    baseline)
        if [ -d "$baseline/plugins/rollout_hf/src" ]; then
            PYTHONPATH="$baseline/plugins/rollout_hf/src:$baseline/core/src:${PYTHONPATH:-}" bench "$label"
        else
            echo "no baseline at $baseline: skipped"
        fi ;;
    nocache) bench "$label" --prefix-cache false ;;
    current) bench "$label" ;;
    profile) bench "$label" --runs 1 --torch-profile 25 ;;  # where the multi side's time goes
    esac
done
