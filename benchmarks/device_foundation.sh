#!/usr/bin/env bash
# Everything the foundation needs checked on a GPU machine, in one call (about 6 minutes):
# GPU tests, the demo on CUDA, the KernelBench level-1 candidates' shape sweep, and the
# rebuild + judge benchmark. Run from the repository root on the device machine:
#
#   bash benchmarks/device_foundation.sh OUT_DIR [KERNELBENCH_JSONL]
#
# Pure-Python packages missing on the machine may be placed as wheels in .whl/.
set -uo pipefail
OUT=${1:-/tmp/out}
KB=${2:-.bench/kernelbench.jsonl}
mkdir -p "$OUT"
. benchmarks/device_env.sh
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
nvcc --version | tail -1
echo "== GPU tests"
timeout 240 python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider 2>&1 | tail -8 | tee "$OUT/gpu_tests.txt"
echo "== demo on CUDA"
timeout 120 python3 -m cuda_agent demo --device cuda 2>&1 | tail -14 | tee "$OUT/demo.txt"
echo "== candidate shape sweep"
timeout 150 python3 benchmarks/kernelbench_l1/check_gpu.py --out "$OUT" 2>&1 | tail -12
echo "== rebuild + judge benchmark"
timeout 300 python3 benchmarks/foundation_gpu.py --out "$OUT" --kernelbench "$KB" \
  --budget-s 280 2>&1 | tail -45
