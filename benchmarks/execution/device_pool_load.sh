#!/usr/bin/env bash
# Load benchmark of the judge worker pool on a GPU machine, in one call of under 9 minutes.
# Repository root, GPU machine (wheels of missing pure-Python packages in .whl/, KernelBench
# at .bench/kernelbench.jsonl):
#
#   bash benchmarks/execution/device_pool_load.sh OUT
#
# 1 GPU: honest judge jobs (the built-in gelu_bias_scale and the KernelBench L1 answers in
# benchmarks/kernelbench_l1, half of them fresh sources that nvcc compiles inside the job)
# through a JudgePool on GPU 0, after a warm-up that caches the baselines; the number of jobs
# is sized for a window of about 2 minutes. With 2+ GPUs visible, the same number of jobs on
# GPUs 0 and 1, and the scaling ratio. Results: OUT/pool_load.md (also printed), per case
# OUT/pool_load_{1gpu,2gpu}.{md,json}, summary OUT/pool_load.json.
# PER_GPU=N (judge workers per GPU, PoolConfig.jobs_per_gpu; default 1) and JOBS=N (instead
# of sizing the run by a calibration round) and BASELINE_PROCESSES=N (the judge's processes per
# baseline, for a shorter warm-up) change the cases; CASE1=FILE (an earlier call's
# pool_load_1gpu.json or pool_load.json) skips the 1-GPU case and compares with that one.
set -uo pipefail
OUT=${1:-/tmp/out}
KB=${KB:-.bench/kernelbench.jsonl}
mkdir -p "$OUT"
. benchmarks/device_env.sh
export CUDA_DEVICE_ORDER=PCI_BUS_ID  # pool GPU indices = nvidia-smi's
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
PER_GPU=${PER_GPU:-1}
LOAD="python3 benchmarks/execution/pool_load.py --device cuda --kb $KB --out $OUT --jobs-per-gpu $PER_GPU ${BASELINE_PROCESSES:+--baseline-processes $BASELINE_PROCESSES}"
if [ "$NGPU" -ge 2 ]; then B1=300; else B1=470; fi
if [ -n "${CASE1:-}" ]; then  # an earlier call's 1-GPU case: run only the 2-GPU case
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); d=d.get('cases',{}).get('1gpu',d)
json.dump(d, open(sys.argv[2], 'w'))" "$CASE1" "$OUT/pool_load_1gpu.json" || exit 2
  echo "== 1-GPU case from $CASE1"
else
  echo "== $NGPU GPU(s) visible; 1-GPU case (budget ${B1} s)"
  timeout $((B1 + 20)) $LOAD --gpus 0 --label 1gpu --jobs "${JOBS:-auto}" --window-s 110 \
    --budget-s "$B1" 2>&1 | tail -100
fi
if [ "$NGPU" -ge 2 ]; then
  JOBS=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1])).get('jobs','auto'))" \
    "$OUT/pool_load_1gpu.json" 2>/dev/null || echo auto)
  # the 2-GPU run's budget: its warm-up plus most of the 1-GPU window, with a margin
  B2=$(python3 -c "import json,sys; print(int(json.load(open(sys.argv[1]))['window_s'] * 0.6
    + 90))" "$OUT/pool_load_1gpu.json" 2>/dev/null || echo 200)
  echo "== 2-GPU case, $JOBS jobs (budget ${B2} s)"
  timeout $((B2 + 20)) $LOAD --gpus 0,1 --label 2gpu --jobs "$JOBS" --window-s 60 \
    --budget-s "$B2" 2>&1 | tail -100
fi
echo "== summary"
timeout 30 python3 benchmarks/execution/pool_load.py --summarize "$OUT" 2>&1 | head -12
