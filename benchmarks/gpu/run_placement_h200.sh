#!/usr/bin/env bash
# Colocated vs split vs one-step off-policy on the 2-GPU H200 machine (issue 11, item 4): the GPU
# benchmark's shape (random Qwen2-0.5B, 32 prompts x 8 samples x <= 256 tokens, bf16) through
# benchmarks/bench_placement.py: colocated on 2 GPUs, split 1 trainer GPU + 1 rollout GPU, and
# the split with one-step off-policy. From the repo root, after `. .device/setup.sh`:
#   bash benchmarks/gpu/run_placement_h200.sh
set -euo pipefail
model=${MODEL:-/tmp/qwen2-0.5b-random}
[ -f "$model/config.json" ] || python3 benchmarks/gpu/make_random_model.py "$model"
split="actor_rollout_ref.hybrid_engine=false,trainer.n_gpus_per_node=1,actor_rollout_ref.rollout.n_gpus_per_node=1"
python3 benchmarks/bench_placement.py --devices 2 --steps "${STEPS:-6}" --warmup 1 \
    --variant "one_step_off=$split,trainer.async_mode=one_step_off,actor_rollout_ref.actor.tis_imp_ratio_cap=2.0" \
    trainer.device=cuda actor_rollout_ref.model.path="$model" \
    actor_rollout_ref.model.dtype=bfloat16 actor_rollout_ref.actor.fsdp_config.mixed_precision=true \
    actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.use_dynamic_bsz=true actor_rollout_ref.actor.ppo_max_token_len_per_gpu=40960 \
    actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=40960 \
    actor_rollout_ref.rollout.dtype=bfloat16 actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.micro_batch_size=256 data.train_batch_size=32 \
    data.max_response_length=256 trainer.logger=[jsonl] "$@"
