#!/usr/bin/env bash
# The judge's GPU checks, each part one call of under 10 minutes. Repository root, GPU
# machine (KernelBench read from .bench/kernelbench.jsonl; missing pure-Python packages as
# wheels in .whl/):
#
#   bash benchmarks/judge_v2/device_judge.sh tests OUT      # the judge's GPU tests (TESTS,
#        default: CUDA hacks, honest kernels, device timing, end to end, symbol check)
#   bash benchmarks/judge_v2/device_judge.sh latency OUT    # judge latency of each
#        problem:processes in LATENCY (default "40:1 12:1": the agent's own verify and
#        profile; 0: the verdict's default, 8 on CUDA), ITERS edits each after a first
#        judgement that fills the baseline cache; each line gives the runtime and the
#        judge's own clock of the wall calls
#   bash benchmarks/judge_v2/device_judge.sh fidelity OUT   # REPEATS judgements of each of
#        CANDIDATES (default 1/12,1/40) with the judge's defaults, baselines cached after the
#        first (SET="KEY=VALUE ..." changes settings), FIDELITY_S seconds in all
#   bash benchmarks/judge_v2/device_judge.sh fd OUT         # the cuda-fd transport probe
#
# Each part writes its output under OUT.
set -uo pipefail
PART=${1:?tests, latency, fidelity or fd}
OUT=${2:-/tmp/out}
KB=${KB:-.bench/kernelbench.jsonl}
mkdir -p "$OUT"
. benchmarks/device_env.sh
export PYTHONPATH=$PYTHONPATH:$PWD
python3 - <<'EOF'
import torch
from cuda_agent.execution.sandbox_local import namespaces_work
print("torch", torch.__version__, "cuda", torch.version.cuda, "| namespaces:", namespaces_work())
EOF
case "$PART" in
tests)
  TESTS=${TESTS:-tests/judge/adversarial/test_cuda_hacks.py tests/judge/adversarial/test_honest.py \
tests/judge/test_timing_gpu.py tests/gpu/test_cuda_e2e.py tests/build/test_symbols.py}
  echo "== GPU tests: $TESTS"
  timeout "${TESTS_S:-540}" python3 -m pytest -q -m gpu $TESTS -p no:cacheprovider \
    --timeout 200 -rfEsxX --durations=8 2>&1 | grep -v Warning | tee "$OUT/gpu_tests.txt" \
    | grep -E "^E  |passed|failed|^FAILED|^XPASS|^[0-9.]+s " | head -60
  ;;
latency)
  for run in ${LATENCY:-40:1 12:1}; do
    echo "== latency of 1/${run%:*}, candidate_processes=${run#*:}" | tee -a "$OUT/latency.txt"
    timeout 240 python3 benchmarks/judge_v2/latency_probe.py --kernelbench "$KB" \
      --ids "${run%:*}" --iters "${ITERS:-3}" --candidate-processes "${run#*:}" 2>&1 \
      | grep -v Warning | tee -a "$OUT/latency.txt" \
      | grep -E "iter|median|^   (build|candidate|candidate[0-9]|reference|reference_kept|compare) "
  done
  ;;
fidelity)
  echo "== fidelity${SET:+; set: $SET}"
  timeout $((${FIDELITY_S:-480} + 30)) python3 benchmarks/judge_v2/judge_gpu.py --out "$OUT/fid" \
    --kernelbench "$KB" --parts fidelity --candidates "${CANDIDATES:-1/12,1/40}" \
    --budget-s "${FIDELITY_S:-480}" --repeats "${REPEATS:-5}" ${SPIN:+--spin $SPIN} \
    $(for s in ${SET:-cache_baselines=true}; do printf -- '--set %s ' "$s"; done) 2>&1 \
    | grep -v Warning | tail -30
  ;;
fd)
  echo "== cuda-fd transport probe"
  timeout 90 python3 benchmarks/judge_v2/fd_transport_probe.py 2>&1 | tail -20
  ;;
*) echo "unknown part $PART"; exit 2 ;;
esac
