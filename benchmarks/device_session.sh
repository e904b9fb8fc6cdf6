#!/usr/bin/env bash
# The GPU checks of the integration, agent and evaluation stages, in calls of under 10
# minutes each. Repository root, GPU machine (wheels of missing pure-Python packages in
# .whl/, KernelBench at .bench/kernelbench.jsonl):
#
#   bash benchmarks/device_session.sh tests OUT   # GPU tests: judge, pool, e2e, integrate
#   bash benchmarks/device_session.sh e2e OUT     # optimize (CUDA replay), eval of honest
#                                                 # answers, the Llama RMSNorm put-back
#   bash benchmarks/device_session.sh baselines OUT   # KernelBench L1/L2 baselines
set -uo pipefail
PART=${1:?tests, e2e or baselines}
OUT=${2:-/tmp/out}
KB=${KB:-.bench/kernelbench.jsonl}
mkdir -p "$OUT"
. benchmarks/device_env.sh
case "$PART" in
tests)
  timeout 560 python3 -m pytest -q -m gpu tests/judge tests/execution tests/gpu \
    tests/integrate -p no:cacheprovider --timeout 240 -rfEsxX --durations=12 2>&1 | tail -60 \
    | tee "$OUT/gpu_tests.txt"
  ;;
e2e)
  echo "== optimize builtin:gelu_bias_scale, CUDA replay"
  timeout 150 python3 -m cuda_agent optimize --device cuda --out "$OUT/optimize" 2>&1 | tail -25
  echo "== eval of honest answers (L1 10, 12, 40)"
  python3 - "$KB" "$OUT/l1_three.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
keep = [r for r in rows if r.get("level") == 1 and r.get("problem_id") in (10, 12, 40)]
open(sys.argv[2], "w").write("".join(json.dumps(r) + "\n" for r in keep))
print(len(keep), "tasks")
PY
  timeout 240 python3 -m cuda_agent eval "$OUT/l1_three.jsonl" benchmarks/kernelbench_l1 \
    --out "$OUT/eval" --device cuda --quiet 2>&1 | tail -30
  echo "== Llama RMSNorm: extract-style task, put back, whole-model check"
  timeout 150 python3 benchmarks/integrate/llama_rmsnorm_e2e.py --out "$OUT/rmsnorm" 2>&1 \
    | tail -30
  ;;
baselines)
  bash benchmarks/evaluate/device_baselines.sh "$OUT" "$KB"
  ;;
*) echo "unknown part $PART"; exit 2 ;;
esac
