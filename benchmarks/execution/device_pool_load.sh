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
# OUT/pool_load_1gpu-xN_turns.jsonl, summary OUT/pool_load.json. TWO_GPUS=1 with 2+ GPUs
# visible adds a 2-GPU case at the last PER_GPU and the scaling ratio (a longer call).
# CANDIDATE_PROCESSES=N times each candidate in N processes (the judge's default: 8 on CUDA).
set -uo pipefail
OUT=${1:-/tmp/out}
KB=${KB:-.bench/kernelbench.jsonl}
mkdir -p "$OUT"
. benchmarks/device_env.sh
export CUDA_DEVICE_ORDER=PCI_BUS_ID  # pool GPU indices = nvidia-smi's
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
WINDOW_S=${WINDOW_S:-100}
LOAD="python3 benchmarks/execution/pool_load.py --device cuda --kb $KB --out $OUT \
  --baseline-processes ${BASELINE_PROCESSES:-1} --jobs window --window-s $WINDOW_S \
  ${CANDIDATE_PROCESSES:+--candidate-processes $CANDIDATE_PROCESSES}"
# a judge-v19 job takes about a minute on CUDA (8 candidate processes) and a new pool's
# warm-up about two, so one case fills a call: PER_GPU="1" and PER_GPU="3" in two calls
B=${BUDGET_S:-360}
for N in ${PER_GPU:-3}; do
  echo "== 1 GPU, $N worker(s) on it (budget ${B} s)"
  timeout $((B + 20)) $LOAD --gpus 0 --jobs-per-gpu "$N" --label "1gpu-x$N" --budget-s "$B" \
    2>&1 | tail -100
  B=$((WINDOW_S + 240))  # pool start and warm-up, the window, the drain
done
if [ "${TWO_GPUS:-0}" = 1 ] && [ "$NGPU" -ge 2 ]; then
  echo "== 2 GPUs, $N worker(s) on each (budget $((B + 30)) s)"
  timeout $((B + 50)) $LOAD --gpus 0,1 --jobs-per-gpu "$N" --label "2gpu-x$N" \
    --budget-s $((B + 30)) 2>&1 | tail -100
fi
echo "== summary"
timeout 30 python3 benchmarks/execution/pool_load.py --summarize "$OUT" 2>&1 | head -20
