#!/usr/bin/env bash
# Measure and cache the eager and torch.compile baselines of KernelBench levels 1 and 2 on a
# GPU machine, in one call of under 9 minutes. Repository root, GPU machine:
#
#   bash benchmarks/evaluate/device_baselines.sh OUT_DIR [KERNELBENCH_JSONL] [PREVIOUS_OUT]
#
# PER_GPU shards per visible GPU (default 3; each process sees only its GPU). The shards of
# one GPU share a lock file (judge.gpu_lock): each process compiles before its turn and
# warms up and times in it, so a timing still has the whole GPU.
# Shards end by DEADLINE_S seconds after the start (default 480; killed then at the latest)
# and start no task in the last 120 s before it, so the call ends cleanly within 9 minutes;
# the tasks left are reported as pending. PREVIOUS_OUT (an earlier call's OUT_DIR) resumes:
# its rows are skipped. Writes OUT_DIR/gpuK/ (shard K's rows, summary and table) and
# OUT_DIR/all/ (every row, summary.json, baselines.md), and prints the summary.
# Environment: LEVELS (default 1,2), DEADLINE_S, NO_COMPILE=1 (eager only), PER_GPU.
set -uo pipefail
OUT=${1:?OUT_DIR}
KB=${2:-shared/kernelbench/kernelbench.jsonl}
PREV=${3:-}
LEVELS=${LEVELS:-1,2}
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

SHARDS=$(( NGPU * PER_GPU ))
THREADS=$(( $(nproc) / SHARDS )); [ "$THREADS" -ge 1 ] || THREADS=1
LOCKS=$(mktemp -d)
for ((k = 0; k < SHARDS; k++)); do
  g=$(( k % NGPU ))
  LOCK=()
  [ "$PER_GPU" -gt 1 ] && LOCK=(--set "judge.gpu_lock=$LOCKS/gpu$g.lock")
  mkdir -p "$OUT/gpu$k"
  cp "$OUT/all/previous.jsonl" "$OUT/gpu$k/baselines.jsonl"
  CUDA_VISIBLE_DEVICES=$g TORCHINDUCTOR_COMPILE_THREADS=$THREADS timeout -k 5 "$KILL" \
    python3 -m cuda_agent baselines "$KB" --out "$OUT/gpu$k" --device cuda \
    --shard "$k/$SHARDS" --time-limit "$LEFT" "${OPTS[@]}" "${LOCK[@]}" \
    > "$OUT/gpu$k/log.txt" 2>&1 &
done
wait
for ((k = 0; k < SHARDS; k++)); do echo "-- shard $k (GPU $(( k % NGPU )))"; tail -4 "$OUT/gpu$k/log.txt"; done

# every row in one folder; the summary counts the tasks of all shards (nothing is measured)
# (each shard's file starts with the earlier rows: one row per task, the last one kept)
cat "$OUT/all/previous.jsonl" "$OUT"/gpu*/baselines.jsonl | python3 -c "
import json, sys
rows = {}
for line in sys.stdin:
    if line.strip():
        rows[json.loads(line)['key']] = line
sys.stdout.writelines(rows.values())" > "$OUT/all/baselines.jsonl"
rm -f "$OUT/all/previous.jsonl"
CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m cuda_agent baselines "$KB" --out "$OUT/all" \
  --device cuda --report-only "${OPTS[@]}" 2>&1 | tail -12
echo "== done in $(( $(date +%s) - START ))s"
