#!/usr/bin/env bash
# Issue 10 items 5-6 on the H200 machine, from the repo root after `. .device/setup.sh`:
#   bash benchmarks/gpu/run_update_h200.sh 1    # CUDA test, 0.5B and 1.5B on 1 GPU, deepspeed
#   bash benchmarks/gpu/run_update_h200.sh 2    # 0.5B and 1.5B on 2 GPUs (the update's scaling)
# Each run is benchmarks/gpu/run_h200.sh (`polyrl train`, FSDP2 with the engine's default speed
# paths: packing, fused log-probs, Liger, fused AdamW; token-budget micro-batches). Logs go to
# $OUT/summary.log, each run's metrics.jsonl to $OUT/<run>_metrics.jsonl.
set -uo pipefail
gpus=${1:-1}
out=${OUT:-/tmp/polyrl-update}
mkdir -p "$out"
export HF_HUB_OFFLINE=1 MASTER_ADDR=127.0.0.1 PYTHONUNBUFFERED=1 STEPS=${STEPS:-5}
log="$out/summary.log"

run() {  # run NAME SHAPE [EXTRA overrides]: one polyrl train run and its report
    local name=$1 shape=$2 start=$SECONDS
    SHAPE=$shape TAG=_$name EXTRA=${3:-} OUT=/tmp/polyrl-runs \
        bash benchmarks/gpu/run_h200.sh "$gpus" >"/tmp/$name.log" 2>&1
    local rc=$?
    echo "== $name ($shape, $gpus GPU, EXTRA='${3:-}'): exit $rc after $((SECONDS - start)) s" >>"$log"
    grep -A14 "steps after warm-up" "/tmp/$name.log" >>"$log" || tail -n 40 "/tmp/$name.log" >>"$log"
    cp "/tmp/polyrl-runs/h200_${shape}_${gpus}gpu_$name/metrics.jsonl" \
        "$out/${name}_${gpus}gpu_metrics.jsonl" 2>/dev/null
    return $rc
}

nvidia-smi --query-gpu=name,memory.total --format=csv >>"$log"
if [ "$gpus" = 1 ]; then
    timeout 240 python3 -m pytest -q -rA -p no:cacheprovider \
        plugins/engine_fsdp/tests/test_fsdp_packing.py >>"$log" 2>&1
    echo "== CUDA tests: exit $?" >>"$log"
fi
run fsdp2_05b qwen2-0.5b
run fsdp2_15b qwen2.5-1.5b
if [ "$gpus" = 1 ] && [ "$SECONDS" -lt "${DS_BEFORE_S:-420}" ]; then
    run deepspeed_05b qwen2-0.5b "actor_rollout_ref.actor.strategy=deepspeed"
fi
cat "$log"
