#!/usr/bin/env bash
# The single-GPU trainer on a GPU machine, one call of under 9 minutes per part. Repository
# root (wheels of missing pure-Python packages in .whl/, KernelBench at .bench/kernelbench.jsonl
# for the e2e part's extra tasks); nothing is downloaded:
#
#   bash benchmarks/train/device_train.sh throughput OUT   # a RANDOM Qwen2.5-0.5B-shaped model
#       # on synthetic 4.5k-7.5k-token agent trajectories: `train rft` with LoRA and with full
#       # fine-tuning, `train value`; tokens/s, s/step, peak GPU memory -> OUT/throughput.md
#   bash benchmarks/train/device_train.sh e2e OUT          # tiny random GPT-2: RFT on the
#       # scripted CUDA expert (optimize --device cuda), value pretraining, PPO on 3 real
#       # tasks with the real judge on CUDA -> OUT/e2e_summary.md, OUT/*.png, OUT/metrics.jsonl
#
# Everything heavy goes to $WORK (default /tmp/train-device); OUT gets at most 8 files.
# Environment overrides (for a CPU rehearsal: DEVICE=cpu DTYPE=fp32 LAYERS=2 HIDDEN=64 ...):
#   DEVICE (cuda)  DTYPE (bf16)  WORK  STEPS (10)  VALUE_STEPS (4)  BATCH (8)  FULL (1: also
#   full fine-tuning)  COUNT (16 trajectories)  MIN_TOKENS/MAX_TOKENS (4500/7500)
#   LAYERS HIDDEN HEADS KV_HEADS INTERMEDIATE VOCAB (Qwen2.5-0.5B's)
#   e2e: PPO_STEPS (3)  ROLLOUTS (3)  RFT_EPOCHS (8)  TASKS (gelu + KernelBench L1 12, 40)
set -uo pipefail
PART=${1:?throughput or e2e}
OUT=${2:-/tmp/out}
DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-bf16}
WORK=${WORK:-/tmp/train-device}
KB=${KB:-.bench/kernelbench.jsonl}
mkdir -p "$OUT" "$WORK"
. benchmarks/device_env.sh
REPORT=benchmarks/train/throughput_report.py
# the trainer through the report script's wrapper (same CLI, plus the peak GPU memory)
train() {  # train SECONDS STAGE OUT_DIR ARGS...
  local limit=$1 stage=$2 dir=$3
  shift 3
  rm -rf "$dir"
  echo "== train $stage -> $dir"
  timeout -k 15 "$limit" python3 "$REPORT" wrap "$dir/peak-$stage.json" -- train "$stage" \
    --set logging.out_dir="$dir" --set logging.progress=false \
    --set checkpoint.every=100000 --set checkpoint.resume=false "$@" 2>&1 \
    | grep -v -e 'Loading weights' -e 'Writing model shards' -e Warning -e 'warnings.warn' | tail -8
  echo "   exit ${PIPESTATUS[0]}"
}
case "$PART" in
throughput)
  MODEL=$WORK/qwen-random TRAJ=$WORK/trajectories
  echo "== random Qwen2 model, tokenizer, synthetic trajectories"
  rm -rf "$MODEL" "$TRAJ"
  timeout 150 python3 benchmarks/train/make_qwen_like.py "$MODEL" --trajectories "$TRAJ" \
    --layers "${LAYERS:-24}" --hidden "${HIDDEN:-896}" --heads "${HEADS:-14}" \
    --kv-heads "${KV_HEADS:-2}" --intermediate "${INTERMEDIATE:-4864}" \
    --vocab "${VOCAB:-151936}" --count "${COUNT:-16}" --min-tokens "${MIN_TOKENS:-4500}" \
    --max-tokens "${MAX_TOKENS:-7500}" 2>&1 | grep -v 'Writing model shards' || exit 1
  COMMON=(--config configs/train/qwen-0.5b.yaml --set model.path="$MODEL"
          --set model.device="$DEVICE" --set model.dtype="$DTYPE"
          --set model.gradient_checkpointing=true --set "data.trajectories=[$TRAJ/*.jsonl]"
          --set data.max_len=8192 --set optim.batch_size="${BATCH:-8}"
          --set optim.micro_batch_size=1 --set optim.epochs=1000)
  RUNS=()
  train 140 rft "$WORK/rft-lora" "${COMMON[@]}" --set optim.max_steps="${STEPS:-10}"
  RUNS+=("$WORK/rft-lora:rft:rft LoRA")
  if [ "${FULL:-1}" = 1 ]; then
    train 140 rft "$WORK/rft-full" "${COMMON[@]}" --set optim.max_steps="${STEPS:-10}" \
      --set model.lora=null --set optim.lr=1.0e-5
    RUNS+=("$WORK/rft-full:rft:rft full")
  fi
  train 100 value "$WORK/value-lora" "${COMMON[@]}" --set optim.max_steps="${VALUE_STEPS:-4}"
  RUNS+=("$WORK/value-lora:value:value (critic) LoRA")
  timeout 120 python3 "$REPORT" table "${RUNS[@]}" --md "$OUT/throughput.md" \
    --json "$OUT/throughput.json" --title "Trainer throughput: random Qwen2.5-0.5B shape \
(${LAYERS:-24} layers, hidden ${HIDDEN:-896}, vocab ${VOCAB:-151936}), $DTYPE, gradient \
checkpointing, $DEVICE"
  ;;
e2e)
  MODEL=$WORK/tiny-model EXPERT=$WORK/expert RUN=$WORK/e2e
  if [ -z "${TASKS:-}" ]; then
    TASKS=builtin:gelu_bias_scale
    [ -f "$KB" ] && TASKS="$TASKS, $PWD/$KB::1/12, $PWD/$KB::1/40"
  fi
  OPT_SETS=()
  [ "$DEVICE" = cpu ] && OPT_SETS=(--set trials=2 --set time_compile=false)
  echo "== tiny random model"
  rm -rf "$MODEL" "$EXPERT" "$RUN"
  timeout 60 python3 benchmarks/train/make_tiny_model.py "$MODEL" 2>&1 | tail -1 || exit 1
  echo "== scripted expert: optimize builtin:gelu_bias_scale --device $DEVICE (replay)"
  timeout 200 python3 -m cuda_agent optimize --device "$DEVICE" --out "$EXPERT" \
    "${OPT_SETS[@]}" 2>&1 | tail -12
  OPT_RC=${PIPESTATUS[0]}
  [ -f "$EXPERT/trajectory.jsonl" ] || { echo "no expert trajectory"; exit 1; }
  SELECT=true
  [ "$OPT_RC" = 0 ] || { SELECT=false; echo "optimize exit $OPT_RC: RFT without selection"; }
  COMMON=(--config configs/train/tiny.yaml --set model.device="$DEVICE" --set model.dtype=fp32
          --set "data.trajectories=[$EXPERT/trajectory.jsonl]" --set data.max_len=30000
          --set data.select=$SELECT --set optim.batch_size=1
          --set optim.epochs="${RFT_EPOCHS:-8}" --set ppo.device="$DEVICE"
          --set "ppo.tasks=[$TASKS]" --set ppo.steps="${PPO_STEPS:-3}"
          --set ppo.rollouts_per_step="${ROLLOUTS:-3}" --set logging.out_dir="$RUN")
  # one out_dir for the three stages (metrics.jsonl holds them all); no rm between them
  run_stage() {  # run_stage SECONDS STAGE ARGS...
    local limit=$1 stage=$2
    shift 2
    echo "== train $stage"
    timeout -k 15 "$limit" python3 -m cuda_agent train "$stage" "${COMMON[@]}" \
      --set logging.progress=false "$@" 2>&1 \
      | grep -v -e 'Loading weights' -e 'Writing model shards' -e Warning -e 'warnings.warn' | tail -6
    echo "   exit ${PIPESTATUS[0]}"
  }
  run_stage 60 rft --set model.path="$MODEL"
  run_stage 60 value --set model.path="$RUN/actor-rft"
  run_stage 200 ppo --set model.path="$RUN/actor-rft" --set model.critic_path="$RUN/critic-value"
  timeout 60 python3 "$REPORT" e2e "$RUN" "$OUT" --expert "$EXPERT"
  ;;
*) echo "unknown part $PART"; exit 2 ;;
esac
