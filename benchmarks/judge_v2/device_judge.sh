#!/usr/bin/env bash
# The judge's GPU checks, in two calls of under 10 minutes each. Repository root, GPU machine:
#
#   bash benchmarks/judge_v2/device_judge.sh tests OUT_DIR   # GPU tests: judge, pool, e2e
#   bash benchmarks/judge_v2/device_judge.sh bench OUT_DIR   # fidelity, then latency
#
# Pure-Python packages missing on the machine may be placed as wheels in .whl/;
# KernelBench problems are read from .bench/kernelbench.jsonl.
set -uo pipefail
PART=${1:?tests or bench}
OUT=${2:-/tmp/out}
KB=${KB:-.bench/kernelbench.jsonl}
mkdir -p "$OUT"
. benchmarks/device_env.sh
python3 - <<'EOF'
import torch
from cuda_agent.execution.sandbox_local import namespaces_work
print("torch", torch.__version__, "cuda", torch.version.cuda, "| namespaces:", namespaces_work())
EOF
case "$PART" in
tests)
  echo "== GPU tests"
  timeout 540 python3 -m pytest -q -m gpu tests/judge tests/execution tests/gpu \
    -p no:cacheprovider --timeout 200 -rfEsxX --durations=12 2>&1 | tail -60 \
    | tee "$OUT/gpu_tests.txt"
  ;;
bench)
  echo "== fidelity"
  timeout 350 python3 benchmarks/judge_v2/judge_gpu.py --out "$OUT" --kernelbench "$KB" \
    --parts fidelity --budget-s 330 2>&1 | tail -40
  echo "== latency"
  timeout 130 python3 benchmarks/judge_v2/latency_probe.py --kernelbench "$KB" --ids 12,40 \
    --iters 3 2>&1 | tail -40 | tee "$OUT/latency.txt"
  ;;
cuda-hacks)
  timeout 200 python3 -m pytest -q -m gpu tests/judge/adversarial/test_cuda_hacks.py \
    -p no:cacheprovider --timeout 120 -rfEsxX 2>&1 | tail -15 | tee "$OUT/cuda_hacks.txt"
  ;;
*) echo "unknown part $PART"; exit 2 ;;
esac
