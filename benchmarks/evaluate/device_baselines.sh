#!/usr/bin/env bash
# Measure and cache the eager and torch.compile baselines of KernelBench (levels 1-3, all 250
# tasks) on a GPU machine using every GPU, in calls of under 9 minutes. Repository root:
#
#   bash benchmarks/evaluate/device_baselines.sh OUT_DIR [KERNELBENCH_JSONL] [PREVIOUS_OUT]
#
# PER_GPU shards per visible GPU (default 3; each process sees only its GPU). The shards of
# one GPU share a lock file (judge.gpu_lock): each process compiles before its turn and
# warms up and times in it, so a timing still has the whole GPU.
# Shards end by DEADLINE_S seconds after the start (default 480; killed then at the latest)
# and start no task in the last 120 s before it, so the call ends cleanly within 9 minutes;
# the tasks left are reported as pending. PREVIOUS_OUT (an earlier call's OUT_DIR) resumes:
# its rows are skipped. Writes OUT_DIR/gpuK/ (shard K's rows, summary and table),
# OUT_DIR/all/ (every row, one per task: baselines_record.py merge; summary.json,
# baselines.md) and the versioned record OUT_DIR/all/baselines-JUDGE_VERSION.json (device,
# commit, judge version, tasks done and pending, this call's and all calls' wall time), and
# prints the summary.
# SCALING_LIMIT=K instead measures the first K tasks twice, each time with a cache of its
# own (nothing read from an earlier measurement): on GPU 0 alone, then on every GPU; it
# writes OUT_DIR/scaling.json (both wall times and their ratio), which a later call's
# record carries when given the same OUT_DIR's scaling.json (SCALING=path).
# Environment: LEVELS (default 1,2,3), DEADLINE_S, NO_COMPILE=1 (eager only), PER_GPU,
# SCALING_LIMIT, SCALING.
set -uo pipefail
OUT=${1:?OUT_DIR}
KB=${2:-shared/kernelbench/kernelbench.jsonl}
PREV=${3:-}
LEVELS=${LEVELS:-1,2,3}
DEADLINE_S=${DEADLINE_S:-480}
PER_GPU=${PER_GPU:-3}
mkdir -p "$OUT/all"
. benchmarks/device_env.sh
START=$(date +%s)
[ -f "$KB" ] || { echo "no KernelBench file at $KB"; exit 2; }
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
[ "$NGPU" -ge 1 ] || { echo "no GPU visible"; exit 2; }
OPTS=(--levels "$LEVELS" --quiet --set judge.process_timeout_s=180)
[ "${NO_COMPILE:-0}" = 1 ] && OPTS+=(--no-compile)

# earlier rows: every shard skips what any earlier call finished
: > "$OUT/all/previous.jsonl"
if [ -n "$PREV" ]; then
  cat "$PREV"/all/baselines.jsonl "$PREV"/gpu*/baselines.jsonl 2>/dev/null \
    > "$OUT/all/previous.jsonl" || true
fi
echo "== $NGPU GPU(s); $(wc -l < "$OUT/all/previous.jsonl") earlier rows; deadline ${DEADLINE_S}s"

# the judge's fixed layer (the device timer) is built once here, not by every shard at once
timeout 150 python3 -c "
from cuda_agent.build.builder import BuildConfig, Builder
print('timer layer:', Builder(BuildConfig(device='cuda')).build_tracer())" 2>&1 | tail -3
KILL=$(( DEADLINE_S - ($(date +%s) - START) ))
LEFT=$(( KILL - 120 ))
[ "$LEFT" -gt 10 ] || LEFT=10
echo "== shards start tasks for ${LEFT}s, are stopped after ${KILL}s at the latest"

# shards() GPUS KILL LEFT OUT [OPTIONS...]: PER_GPU shards on each of the first GPUS GPUs
shards() {
  local use=$1 kill=$2 left=$3 out=$4; shift 4
  local n=$(( use * PER_GPU )) threads locks k g
  threads=$(( $(nproc) / n )); [ "$threads" -ge 1 ] || threads=1
  locks=$(mktemp -d)
  for ((k = 0; k < n; k++)); do
    g=$(( k % use ))
    local lock=()
    [ "$PER_GPU" -gt 1 ] && lock=(--set "judge.gpu_lock=$locks/gpu$g.lock")
    mkdir -p "$out/gpu$k"
    [ -f "$out/all/previous.jsonl" ] && cp "$out/all/previous.jsonl" "$out/gpu$k/baselines.jsonl"
    CUDA_VISIBLE_DEVICES=$g TORCHINDUCTOR_COMPILE_THREADS=$threads timeout -k 5 "$kill" \
      python3 -m cuda_agent baselines "$KB" --out "$out/gpu$k" --device cuda \
      --shard "$k/$n" --time-limit "$left" "${OPTS[@]}" "${lock[@]}" "$@" \
      > "$out/gpu$k/log.txt" 2>&1 &
  done
  wait
  for ((k = 0; k < n; k++)); do echo "-- shard $k (GPU $(( k % use )))"; tail -4 "$out/gpu$k/log.txt"; done
  python3 benchmarks/evaluate/baselines_record.py merge "$out"
}

if [ -n "${SCALING_LIMIT:-}" ]; then
  HALF=$(( (KILL - 20) / 2 ))
  for USE in 1 "$NGPU"; do
    T0=$(date +%s)
    mkdir -p "$OUT/scale$USE/home/build" "$OUT/scale$USE/all"
    cp -r "${CUDA_AGENT_HOME:-$HOME/.cache/cuda-agent}/build/." "$OUT/scale$USE/home/build/" 2>/dev/null
    CUDA_AGENT_HOME="$OUT/scale$USE/home" shards "$USE" "$HALF" "$(( HALF - 60 ))" \
      "$OUT/scale$USE" --limit "$SCALING_LIMIT"
    echo "$(( $(date +%s) - T0 ))" > "$OUT/scale$USE/wall_s"
  done
  python3 -c "
import json, sys
out, n, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
one, many = (float(open(f'{out}/scale{u}/wall_s').read()) for u in (1, n))
done = [sum(1 for _ in open(f'{out}/scale{u}/all/baselines.jsonl')) for u in (1, n)]
json.dump({'tasks': k, 'done': done, 'gpus': n, 'wall_s_one_gpu': one,
           'wall_s_all_gpus': many, 'scaling': round(one / many, 3)},
          open(f'{out}/scaling.json', 'w'), indent=2)
print(open(f'{out}/scaling.json').read())" "$OUT" "$NGPU" "$SCALING_LIMIT"
  echo "== done in $(( $(date +%s) - START ))s"
  exit 0
fi

shards "$NGPU" "$KILL" "$LEFT" "$OUT"
rm -f "$OUT/all/previous.jsonl"
CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m cuda_agent baselines "$KB" --out "$OUT/all" \
  --device cuda --report-only "${OPTS[@]}" 2>&1 | tail -12
python3 benchmarks/evaluate/baselines_record.py record "$OUT" --wall-s "$(( $(date +%s) - START ))" \
  --gpus "$NGPU" --per-gpu "$PER_GPU" ${PREV:+--previous "$PREV"} ${SCALING:+--scaling "$SCALING"}
echo "== done in $(( $(date +%s) - START ))s"
