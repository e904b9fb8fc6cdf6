#!/usr/bin/env bash
# Load benchmark of the judge worker pool on one GPU, one case (workers per GPU) per call of
# about 6 minutes on an H100: PER_GPU=3 (default), then PER_GPU=1 in a second call. Repository root, GPU machine (wheels of missing
# pure-Python packages in .whl/, KernelBench at .bench/kernelbench.jsonl):
#
#   bash benchmarks/execution/device_pool_load.sh OUT
#
# Honest judge jobs (the built-in gelu_bias_scale and the KernelBench L1 answers in
# benchmarks/kernelbench_l1, half of them fresh sources that nvcc compiles inside the job)
# through a JudgePool on GPU 0, once for each number of workers per GPU in PER_GPU (default
# 3, PoolConfig.jobs_per_gpu; BUDGET_S for the first case, default 360): a warm-up that caches the builds and the baselines (the
# first case measures them, BASELINE_PROCESSES processes per baseline, default 1), then jobs
# kept two per worker ahead for WINDOW_S seconds (default 100) and drained. Results:
# OUT/pool_load.md (also printed: jobs per GPU-hour, how the GPU's turn was held: exclusive,
# shared only, timing), per case OUT/pool_load_1gpu-xN.{md,json} and the turn's log
# OUT/pool_load_1gpu-xN_turns.jsonl, summary OUT/pool_load.json. GPU_CASES="2 4" adds a case
# on 2 and on 4 GPUs (as many as are visible) at the last PER_GPU and each one's scaling
# against one GPU, judgements per minute (targets 1.8x on two, 3.5x on four; every job back
# correct and exactly once); one case per call fits: PER_GPU=3 GPU_CASES=2 ONE_GPU=0 runs
# the 2-GPU case alone, and --summarize compares it with an earlier call's 1-GPU case kept
# in the same OUT (TWO_GPUS=1 is GPU_CASES=2). BACKEND=ray runs the pool's Ray backend
# (PoolConfig.backend; the ray wheel in .whl/), labels ending in -ray.
# CANDIDATE_PROCESSES=N times each candidate in N processes (the judge's default: 8 on CUDA).
set -uo pipefail
OUT=${1:-/tmp/out}
KB=${KB:-.bench/kernelbench.jsonl}
mkdir -p "$OUT"
. benchmarks/device_env.sh
export CUDA_DEVICE_ORDER=PCI_BUS_ID  # pool GPU indices = nvidia-smi's
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
WINDOW_S=${WINDOW_S:-100}
BACKEND=${BACKEND:-local}
TAG=$([ "$BACKEND" = local ] || echo "-$BACKEND")
LOAD="python3 benchmarks/execution/pool_load.py --device cuda --kb $KB --out $OUT \
  --baseline-processes ${BASELINE_PROCESSES:-1} --jobs window --window-s $WINDOW_S \
  --backend $BACKEND ${CANDIDATE_PROCESSES:+--candidate-processes $CANDIDATE_PROCESSES}"
GPU_CASES=${GPU_CASES:-$([ "${TWO_GPUS:-0}" = 1 ] && echo 2)}
# a judge-v19 job takes about a minute on CUDA (8 candidate processes) and a new pool's
# warm-up about two, so one case fills a call: PER_GPU="1" and PER_GPU="3" in two calls
B=${BUDGET_S:-360}
for N in ${PER_GPU:-3}; do
  [ "${ONE_GPU:-1}" = 1 ] || continue
  echo "== 1 GPU, $N worker(s) on it (budget ${B} s, backend $BACKEND)"
  timeout $((B + 20)) $LOAD --gpus 0 --jobs-per-gpu "$N" --label "1gpu-x$N$TAG" --budget-s "$B" \
    2>&1 | tail -100
  B=$((WINDOW_S + 240))  # pool start and warm-up, the window, the drain
done
for G in $GPU_CASES; do
  [ "$NGPU" -ge "$G" ] || { echo "== $G GPUs asked for, $NGPU visible: skipped"; continue; }
  IDS=$(seq -s, 0 $((G - 1)))
  echo "== $G GPUs ($IDS), $N worker(s) on each (budget $((B + 30)) s, backend $BACKEND)"
  timeout $((B + 50)) $LOAD --gpus "$IDS" --jobs-per-gpu "$N" --label "${G}gpu-x$N$TAG" \
    --budget-s $((B + 30)) 2>&1 | tail -100
done
echo "== summary"
timeout 30 python3 benchmarks/execution/pool_load.py --summarize "$OUT" 2>&1 | head -20
