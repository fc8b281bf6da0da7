#!/usr/bin/env bash
# Issue 25 on one GPU: the hf rollout's CUDA tests, then generation tokens/s of the baseline code
# (an export of an older commit under $BASELINE) and of the working tree, one process each, at the
# issue's shapes, the length mix, and a second (warm-cache) start of the working tree's path.
# From the repo root, after `. .device/setup.sh`:
#   git archive <commit> plugins/rollout_hf/src | tar -x -C .baseline    # on the dev machine
#   RESULTS=$OUT bash benchmarks/gpu/run_decode_h200.sh
# Environment: RESULTS (folder for logs and JSON lines), BASELINE (.baseline/plugins/rollout_hf/src),
# PARTS (tests decode mix warm toggle profile train ref: which parts to run, in that order), RUNS (timed
# runs, 3), TESTS_TIMEOUT (seconds for the CUDA tests, 600), TOKENS_15B (the 1.5B train run's update
# budget), BASELINE_ENGINE (the folder holding the baseline's engine_fsdp/src and engine_kit/src).
set -uo pipefail
results=${RESULTS:-/tmp/decode-h200}
baseline=${BASELINE:-.baseline/plugins/rollout_hf/src}
# The current side names the fused, compiled step (the default on CUDA) explicitly.
opt_in=${OPT_IN:-'{"fused_step": "true", "compile": "true"}'}
mkdir -p "$results"
export PYTHONUNBUFFERED=1 XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/polyrl-user-cache}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$results/device.txt"
for part in ${PARTS:-tests decode mix warm}; do
    case $part in
    tests)
        timeout "${TESTS_TIMEOUT:-600}" python3 -m pytest plugins/rollout_hf/tests -q -k cuda 2>&1 | tail -15 |
            tee "$results/cuda_tests.log" ;;
    decode)
        for shape_rows in "qwen2-0.5b 32 256" "qwen2-0.5b 64 512" "qwen2.5-1.5b 64 512"; do
            set -- $shape_rows
            for side in baseline current; do
                source_arg=(--hf "$opt_in")
                [ $side = baseline ] && source_arg=(--source "$baseline")
                python3 benchmarks/gpu/bench_decode.py --shape "$1" --prompts "$2" --n 8 \
                    --max-new-tokens "$3" --runs "${RUNS:-3}" --label "$side" "${source_arg[@]}" \
                    --greedy-out "$results/greedy_${1}_${3}_$side.pt" \
                    --json "$results/decode.jsonl" 2>&1 | grep -v "Loading weights\|Writing model"
            done
            python3 -c "import torch,sys; a,b=(torch.load(f'$results/greedy_${1}_${3}_'+s+'.pt') for s in ('baseline','current')); print('greedy rows equal:', int((a==b).all(1).sum()), 'of', a.shape[0])"
        done 2>&1 | tee "$results/decode.log" ;;
    mix)
        for side in baseline current; do
            source_arg=(--hf "$opt_in")
            [ $side = baseline ] && source_arg=(--source "$baseline")
            python3 benchmarks/gpu/bench_length_mix.py --shape qwen2-0.5b --device cuda \
                --prompts 128 --n 8 --slots 256 --max-new-tokens 256 --prompt-len 64 --runs "${RUNS:-3}" \
                --label "$side" "${source_arg[@]}" --json "$results/length_mix.jsonl" 2>&1 |
                grep -v "Loading weights\|Writing model"
        done 2>&1 | tee "$results/length_mix.log" ;;
    warm)  # the same shape again: compiled artefacts now come from the user's cache folder
        python3 benchmarks/gpu/bench_decode.py --shape qwen2-0.5b --prompts 32 --n 8 \
            --max-new-tokens 256 --runs 1 --label current-warm-cache --hf "$opt_in" \
            --json "$results/decode.jsonl" 2>&1 | grep -v "Loading weights\|Writing model" |
            tee "$results/warm.log" ;;
    train)  # polyrl train at the 0.5B shapes (STEPS=3), the first again (a warm start), then 1.5B.
        # The 1.5B shape's update budget is TOKENS_15B (16384; its activations at 16k outgrow an
        # 80 GB card beside the rest of the step: 8192 there; the no-grad passes keep 16384);
        # every run's metrics go to train.jsonl.
        run=0
        # TRAIN_SHAPES ("shape prompts response tokens" quadruples, ';' between) replaces the list.
        IFS=';' read -ra runs <<< "${TRAIN_SHAPES:-qwen2-0.5b 32 256 16384;qwen2-0.5b 64 512 16384;qwen2-0.5b 32 256 16384;qwen2.5-1.5b 64 512 ${TOKENS_15B:-16384}}"
        for shape_rows in "${runs[@]}"; do
            IFS=' ' read -r -a fields <<< "$shape_rows"
            set -- "${fields[@]}"
            run=$((run + 1))
            EXTRA="actor_rollout_ref.rollout.engine_kwargs.hf.fused_step=true actor_rollout_ref.rollout.engine_kwargs.hf.compile=true" \
            OUT=/tmp/polyrl-gpu SHAPE=$1 PROMPTS=$2 RESPONSE=$3 TOKENS=$4 LOGPROB_TOKENS=16384 STEPS=${STEPS:-3} \
                bash benchmarks/gpu/run_h200.sh 1 2>&1 | grep -v "Loading weights\|liger_kernel.ops.backends" | tail -25
            python3 -c "import json,sys; r=[json.loads(l) for l in open('/tmp/polyrl-gpu/h200_$1_1gpu/metrics.jsonl')]; print('$1 $2x8 x $3 (tokens $4): first step', round(r[0]['timing_s/step'],1), 's, gen', [round(x['timing_s/gen'],2) for x in r], 's; first step less the last, by phase:', {k[9:]: round(r[0][k]-r[-1][k],2) for k in r[0] if k.startswith('timing_s/')}, 'probe s', round(r[0].get('weight_sync/probe_seconds',0),2)); f=open('$results/train.jsonl','a'); [f.write(json.dumps({'run': $run, 'shape': '$1', 'rows': $2*8, 'response': $3, 'tokens': $4, 'metrics': x})+chr(10)) for x in r]"
        done 2>&1 | tee "$results/train.log" ;;
    ref)  # the reference pass alone (bench_ref.py), 0.5B 512 x 512: the engine packages exported
        # under .baseline (BASELINE_ENGINE) at the first of REF_BUDGETS (16384 65536), then the
        # working tree's at each
        for side in baseline current; do
            source_arg=() budgets=${REF_BUDGETS:-16384 65536}
            [ $side = baseline ] && budgets=${budgets%% *} source_arg=(--source
                "${BASELINE_ENGINE:-.baseline/plugins}/engine_fsdp/src"
                "${BASELINE_ENGINE:-.baseline/plugins}/engine_kit/src")
            # shellcheck disable=SC2086  # budgets is a list
            python3 benchmarks/gpu/bench_ref.py --shape qwen2-0.5b --rows 512 --response-len 512 \
                --max-tokens $budgets --runs "${RUNS:-3}" --label $side "${source_arg[@]}" \
                --json "$results/ref.jsonl" 2>&1 | grep -v "Loading weights\|Writing model"
        done 2>&1 | tee "$results/ref.log" ;;
    toggle)  # one engine_kwargs.hf option (TOGGLE: merge_projections) off, then on, at the
        # shapes of TOGGLE_SHAPES ("prompts new-tokens shape" triples, ';' between), greedy rows
        # compared
        option=${TOGGLE:-merge_projections}
        IFS=';' read -ra triples <<< "${TOGGLE_SHAPES:-32 256 qwen2-0.5b;64 512 qwen2-0.5b;64 512 qwen2.5-1.5b}"
        for shape_rows in "${triples[@]}"; do
            IFS=' ' read -r prompts tokens shape <<< "$shape_rows"
            for value in false true; do
                python3 benchmarks/gpu/bench_decode.py --shape "$shape" --prompts "$prompts" --n 8 \
                    --max-new-tokens "$tokens" --runs "${RUNS:-3}" --label "${option}_$value" \
                    --hf "{\"$option\": \"$value\"}" \
                    --greedy-out "$results/greedy_${shape}_${tokens}_${option}_$value.pt" \
                    --json "$results/$option.jsonl" 2>&1 | grep -v "Loading weights\|Writing model"
            done
            python3 -c "import torch; a,b=(torch.load(f'$results/greedy_${shape}_${tokens}_${option}_'+s+'.pt') for s in ('false','true')); print('$shape $tokens: greedy rows equal (bf16):', int((a==b).all(1).sum()), 'of', a.shape[0])"
        done 2>&1 | tee "$results/$option.log" ;;
    profile)  # PROFILE_SHAPE: "shape prompts new-tokens" (qwen2-0.5b 32 64)
        set -- ${PROFILE_SHAPE:-qwen2-0.5b 32 64}
        python3 benchmarks/gpu/bench_decode.py --shape "$1" --prompts "$2" --n 8 \
            --max-new-tokens "$3" --runs 1 --label profile --hf "$opt_in" --profile "$results" 2>&1 |
            grep -v "Loading weights\|Writing model" | tail -40 ;;
    esac
done
