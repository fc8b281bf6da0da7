#!/usr/bin/env bash
# The GPU half of issue 10 (items 1, 2 and 4) on the H200 machine, 1 or 2 GPUs, from the repo root
# after `. .device/setup.sh` (the bundle carries deepspeed 0.19.8 and megatron-core 0.19.2):
#   bash benchmarks/gpu/engines/run_engines_h200.sh
# 1. cross-engine equivalence in bf16: fsdp2, deepspeed ZeRO-1/2/3 and megatron on 1 GPU, and
#    megatron with TP=2 (packed and padded) and with PP=2 on 2 GPUs (tests/test_engine_equivalence.py, `gpu` tests);
# 2. the Megatron engine's own GPU tests (conformance suite; TP and PP over all GPUs: weight
#    streaming, log-probs, resume, export);
# 3. short GRPO runs of `polyrl train recipe=tiny` with strategy=megatron: TP over all GPUs, then
#    (2 GPUs or more) pipeline stages over all GPUs;
# 4. the same with strategy=deepspeed over all GPUs: ZeRO-2 (checkpoint at step 8 and 16, then a
#    second run resumes to step 18), and ZeRO-3 with parameters and optimizer offloaded to the CPU.
# Each part writes its log to $OUT (or /tmp/polyrl-engines); a failing part does not stop the next.
# PARTS picks parts by name (default: all of equivalence megatron grpo_megatron grpo_megatron_pp
# grpo_deepspeed grpo_deepspeed_zero3).
set -uo pipefail
out=${OUT:-/tmp/polyrl-engines}
mkdir -p "$out"
export HF_HUB_OFFLINE=1 MASTER_ADDR=127.0.0.1 PYTHONUNBUFFERED=1
export gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
python3 -c "import torch, deepspeed, megatron.core as m; print('torch', torch.__version__, \
'deepspeed', deepspeed.__version__, 'megatron-core', m.__version__)" 2>&1 | tee "$out/versions.log"

# each GRPO part starts a fresh run (these folders are this script's; a left-over checkpoint
# would be resumed instead)
rm -rf /tmp/polyrl-grpo-megatron /tmp/polyrl-grpo-megatron-pp /tmp/polyrl-grpo-deepspeed \
    /tmp/polyrl-grpo-deepspeed-z3
parts=" ${PARTS:-equivalence megatron grpo_megatron grpo_megatron_pp grpo_deepspeed grpo_deepspeed_zero3} "

part() {  # part NAME SECONDS COMMAND...: run (when PARTS names it), keep the log, show its end
    local name=$1 seconds=$2
    shift 2
    [[ $parts == *" $name "* ]] || return 0
    local start=$SECONDS
    # through bash so that a part may be one of the shell functions below (exported)
    timeout "$seconds" bash -c '"$@"' "$name" "$@" >"$out/$name.log" 2>&1
    echo "== $name: exit $? after $((SECONDS - start)) s" | tee -a "$out/summary.log"
    tail -n 15 "$out/$name.log"
}

part equivalence 230 python3 -m pytest -m gpu -rA -q -p no:cacheprovider \
    tests/test_engine_equivalence.py
part megatron "${MEGATRON_S:-200}" python3 -m pytest -rA -q -p no:cacheprovider \
    plugins/engine_megatron/tests/test_megatron_conformance.py \
    plugins/engine_megatron/tests/test_megatron_cuda.py
part grpo_megatron 120 python3 -m polyrl train recipe=tiny \
    actor_rollout_ref.actor.strategy=megatron \
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size="$gpus" \
    trainer.device=cuda trainer.n_gpus_per_node="$gpus" \
    trainer.total_training_steps=16 trainer.test_freq=8 trainer.save_freq=8 \
    trainer.default_local_dir=/tmp/polyrl-grpo-megatron
cp /tmp/polyrl-grpo-megatron/metrics.jsonl "$out/grpo_megatron_metrics.jsonl" 2>/dev/null
if [ "$gpus" -ge 2 ]; then
    part grpo_megatron_pp 120 python3 -m polyrl train recipe=tiny \
        actor_rollout_ref.actor.strategy=megatron \
        actor_rollout_ref.actor.megatron.pipeline_model_parallel_size="$gpus" \
        trainer.device=cuda trainer.n_gpus_per_node="$gpus" \
        trainer.total_training_steps=16 trainer.test_freq=8 trainer.save_freq=8 \
        trainer.default_local_dir=/tmp/polyrl-grpo-megatron-pp
    cp /tmp/polyrl-grpo-megatron-pp/metrics.jsonl "$out/grpo_megatron_pp_metrics.jsonl" 2>/dev/null
fi

grpo_deepspeed() {  # grpo_deepspeed OUTDIR STEPS OVERRIDES...: a tiny GRPO run on every GPU
    local dir=$1 steps=$2
    shift 2
    python3 -m polyrl train recipe=tiny actor_rollout_ref.actor.strategy=deepspeed \
        trainer.device=cuda trainer.n_gpus_per_node="$gpus" trainer.total_training_steps="$steps" \
        trainer.test_freq=8 trainer.save_freq=8 trainer.default_local_dir="$dir" "$@"
}
deepspeed_then_resume() {  # 16 steps with checkpoints, then a run to 18 that must resume
    grpo_deepspeed /tmp/polyrl-grpo-deepspeed 16 && grpo_deepspeed /tmp/polyrl-grpo-deepspeed 18
}
export -f grpo_deepspeed deepspeed_then_resume
part grpo_deepspeed 240 deepspeed_then_resume
cp /tmp/polyrl-grpo-deepspeed/metrics.jsonl "$out/grpo_deepspeed_metrics.jsonl" 2>/dev/null
part grpo_deepspeed_zero3 150 grpo_deepspeed /tmp/polyrl-grpo-deepspeed-z3 16 \
    plugins.deepspeed.zero_stage=3 plugins.deepspeed.offload_param=true \
    plugins.deepspeed.offload_optimizer=true
cp /tmp/polyrl-grpo-deepspeed-z3/metrics.jsonl "$out/grpo_deepspeed_zero3_metrics.jsonl" 2>/dev/null
true
