#!/usr/bin/env bash
# `polyrl train` on H200s with FSDP2 and the HF rollout, on a randomly initialised Qwen2-shaped
# model, then the per-phase report (issue 5; issue 10 item 5 for the update's MFU). From the
# repo root:
#   bash benchmarks/gpu/run_h200.sh 1 2                  # one run on 1 GPU, then one on 2 GPUs
#   SHAPE=qwen2.5-1.5b bash benchmarks/gpu/run_h200.sh 1  # the Qwen2.5-1.5B shape
# recipe=tiny supplies the task and the GRPO settings; it keeps its toy model's layers eager, so
# the compiled layers (the CUDA default elsewhere) are asked for here.
# Environment: SHAPE (qwen2-0.5b), STEPS (6), TOKENS (the update's token budget per micro-batch
# and GPU, 16384), LOGPROB_TOKENS (the same for the no-grad log-prob passes, old and reference;
# TOKENS), PROMPTS (32 per step, 8 samples each), RESPONSE (256 new tokens at most),
# TAG (a suffix of the run folder), EXTRA (more overrides, space-separated).
set -euo pipefail
shape=${SHAPE:-qwen2-0.5b}
model=${MODEL:-/tmp/$shape-random}
out_root=${OUT:-/tmp/polyrl-gpu}
steps=${STEPS:-6}
tokens=${TOKENS:-16384}
logprob_tokens=${LOGPROB_TOKENS:-$tokens}
prompts=${PROMPTS:-32}
response=${RESPONSE:-256}
[ -f "$model/config.json" ] || python3 benchmarks/gpu/make_random_model.py "$model" --shape "$shape"
for gpus in "${@:-1}"; do
    out="$out_root/h200_${shape}_${gpus}gpu${TAG:-}"
    rm -rf "$out"
    # shellcheck disable=SC2086  # EXTRA is a list of overrides
    timeout "${RUN_TIMEOUT:-300}" python3 -m polyrl train recipe=tiny \
        actor_rollout_ref.model.path="$model" \
        actor_rollout_ref.model.dtype=bfloat16 \
        actor_rollout_ref.actor.fsdp_config.mixed_precision=true \
        actor_rollout_ref.actor.use_torch_compile=true \
        actor_rollout_ref.actor.optim.lr=1e-6 \
        actor_rollout_ref.actor.ppo_mini_batch_size=32 \
        actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32 \
        actor_rollout_ref.actor.use_dynamic_bsz=true \
        actor_rollout_ref.actor.ppo_max_token_len_per_gpu="$tokens" \
        actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu="$logprob_tokens" \
        actor_rollout_ref.rollout.dtype=bfloat16 \
        actor_rollout_ref.rollout.n=8 \
        actor_rollout_ref.rollout.micro_batch_size=$((prompts * 8)) \
        data.train_batch_size="$prompts" data.max_response_length="$response" \
        trainer.device=cuda trainer.n_gpus_per_node="$gpus" \
        trainer.total_training_steps="$steps" trainer.save_freq=-1 trainer.test_freq=-1 \
        trainer.val_before_train=false trainer.export_hf_model=false \
        trainer.logger=[console,jsonl] trainer.default_local_dir="$out" ${EXTRA:-}
    python3 benchmarks/gpu/report.py "$out" --model "$model" --gpus "$gpus"
done
