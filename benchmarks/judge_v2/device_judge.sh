#!/usr/bin/env bash
# The judge's GPU checks, in two calls of under 10 minutes each. Repository root, GPU machine:
#
#   bash benchmarks/judge_v2/device_judge.sh tests OUT_DIR   # GPU tests: judge, pool, e2e, link
#   bash benchmarks/judge_v2/device_judge.sh bench OUT_DIR   # fidelity, then latency
#   bash benchmarks/judge_v2/device_judge.sh fd OUT_DIR      # cuda-fd transport: probe, tests,
#        judge latency
#   bash benchmarks/judge_v2/device_judge.sh large OUT_DIR   # outputs of gigabytes: baselines
#        of the largest level-1 problems (LARGE_IDS=5,7,...), the honest ReLU answer judged
#        (when 19 is among them), the judge's GPU tests (not with NO_TESTS=1)
#   bash benchmarks/judge_v2/device_judge.sh v7 OUT_DIR      # CUDA hacks (native threads
#        included), device timing, end-to-end and split-nvcc tests; split probe; latency
#   bash benchmarks/judge_v2/device_judge.sh clock OUT_DIR   # per-process time against SM clock
#        (ONLY, PROCESSES rounds, BURST processes per round, BLOCKS, VARIANTS), then which
#        statistic of the calls agrees best between processes (estimator_probe.py)
#   bash benchmarks/judge_v2/device_judge.sh v8 OUT_DIR      # private-stream probe, (STEPS=1:
#        build steps and linkers), device timing, CUDA hack and e2e tests, latency, (FIDELITY_S=
#        seconds [SPIN=n]: fidelity)
#   bash benchmarks/judge_v2/device_judge.sh nvcc-threads OUT_DIR   # nvcc with and without
#        --split-compile=0: compile times, then judge latency and judged runtime both ways
#   bash benchmarks/judge_v2/device_judge.sh latency OUT_DIR   # nvcc split probe, the judge's
#        GPU tests (judge, e2e, lent packs), then judge latency with every phase (ITERS=n
#        edits of each problem)
#   bash benchmarks/judge_v2/device_judge.sh spares OUT_DIR   # judge latency with the next
#        workers starting during each judgement (keep_warm) and between judgements
#   bash benchmarks/judge_v2/device_judge.sh paired OUT_DIR   # eager and candidate timed
#        apart (the judge's way) or in turn from two live processes: speed-up spread
#   bash benchmarks/judge_v2/device_judge.sh v9 OUT_DIR   # fidelity as configured, then with
#        the candidate timed in CP=3 processes (spin calibrated once); (TESTS=1: the judge's
#        GPU tests and latency with 1 and 2 candidate processes instead)
#   bash benchmarks/judge_v2/device_judge.sh v10 OUT_DIR   # (TESTS=1: CUDA hack, device timing
#        and e2e tests), the calibrated kernel recorded and not, in-process (cupti_probe) and
#        judged REPEATS times at SPIN with the activity record off and on
#   bash benchmarks/judge_v2/device_judge.sh stream OUT_DIR   # fidelity of the calibrated pair
#        whose delay is streamed loads (judge_gpu.py --delay stream), with CPS candidate
#        processes each (default "1 4"), STEP_S seconds per step
#   bash benchmarks/judge_v2/device_judge.sh split OUT_DIR   # split_timing with CP candidate
#        processes (default 4): fidelity of CANDIDATES (default 1/12; REPEATS, DELAY, FIDELITY_S),
#        then judge latency of LATENCY_IDS (default 40) with each of LATENCY_CPS processes
#   bash benchmarks/judge_v2/device_judge.sh v12 OUT_DIR   # (not with NO_TESTS=1: the GPU
#        tests in TESTS, default CUDA hack, device timing and e2e), then judge latency for each
#        problem:processes in LATENCY (default "40:1 12:1 40:0 12:0"; 1: the agent's verify and
#        profile, 0: the default, 8 on CUDA; not with NO_LATENCY=1); the first judgement of a
#        problem measures its baselines (about 85 s). Tests and latency together pass 600 s:
#        run them as two calls (NO_LATENCY=1, then NO_TESTS=1)
#   bash benchmarks/judge_v2/device_judge.sh v12-fidelity OUT_DIR   # fidelity of CANDIDATES
#        (calibrated, 1/12, 1/40) with the judge's defaults but baselines measured anew in
#        every judgement, REPEATS judgements, FIDELITY_S;
#        SET="KEY=VALUE ..." changes judge settings (e.g. cache_baselines=true, the judge's own
#        default: the first judgement measures the baselines, the others reuse them), DELAY the
#        calibrated candidate's delay (spin or stream)
#   bash benchmarks/judge_v2/device_judge.sh v11 OUT_DIR   # e2e tests, the calibrated kernel
#        judged REPEATS times at SPIN with the activity record off and on (after the timed
#        calls), then judge latency (ITERS edits of 1/40 and 1/12)
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
latency_phases() {  # IDS CANDIDATE_PROCESSES FILE: every phase to FILE, the main ones shown
  timeout 200 python3 benchmarks/judge_v2/latency_probe.py --kernelbench "$KB" --ids "$1" \
    --iters "${ITERS:-3}" --candidate-processes "$2" 2>&1 | grep -v Warning | tee -a "$3" \
    | grep -E "iter|median|^   (build|candidate|candidate[0-9]|compare) "
}
case "$PART" in
tests)
  echo "== GPU tests"
  timeout 540 python3 -m pytest -q -m gpu tests/judge tests/execution tests/gpu tests/build \
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
fd)
  echo "== cuda-fd transport probe"
  timeout 90 python3 benchmarks/judge_v2/fd_transport_probe.py 2>&1 | tail -20
  echo "== cuda-fd GPU tests"
  timeout 240 python3 -m pytest -q -m gpu tests/gpu/test_cuda_fd.py tests/judge/test_transport.py \
    tests/gpu/test_cuda_e2e.py -p no:cacheprovider --timeout 200 -rfEsxX 2>&1 | tail -15 \
    | tee "$OUT/fd_tests.txt"
  echo "== latency, cuda-fd"
  timeout 150 python3 benchmarks/judge_v2/latency_probe.py --kernelbench "$KB" --ids 12,40 \
    --iters 3 2>&1 | grep -v Warning | tail -60 | tee "$OUT/latency_fd.txt"
  ;;
v7)
  timeout 400 python3 -m pytest -q -m "gpu or nvcc" tests/judge/adversarial/test_cuda_hacks.py \
    tests/judge/test_timing_gpu.py tests/gpu/test_cuda_e2e.py tests/build/test_nvcc_split.py \
    -p no:cacheprovider --timeout 200 -rfEsxX --durations=8 2>&1 | tail -30 \
    | tee "$OUT/v7_tests.txt"
  echo "== nvcc split probe"
  timeout 60 python3 benchmarks/build/nvcc_split_probe.py -n 3 --arch 90a 2>&1 | tail -8
  echo "== latency"
  timeout 130 python3 benchmarks/judge_v2/latency_probe.py --kernelbench "$KB" --ids 12,40 \
    --iters 3 2>&1 | grep -v Warning | tail -30 | tee "$OUT/latency.txt"
  ;;
clock)
  timeout 560 python3 benchmarks/judge_v2/clock_probe.py --kernelbench "$KB" \
    --only "${ONLY:-1/12,calibrated}" --processes "${PROCESSES:-5}" \
    --warmup-s "${WARMUPS:-0.2}" --variants "${VARIANTS:-base}" --burst "${BURST:-1}" \
    --blocks "${BLOCKS:-8}" --json "$OUT/clock.json" 2>&1 | grep -v Warning \
    | tee "$OUT/clock.txt"
  python3 benchmarks/judge_v2/estimator_probe.py "$OUT/clock.json" 2>&1 | tee "$OUT/estimators.txt"
  ;;
v8)
  echo "== private-stream work, call by call"
  timeout 100 python3 benchmarks/judge_v2/side_stream_probe.py --calls 300 2>&1 \
    | grep -v Warning | tee "$OUT/side_stream.txt"
  if [ -n "${STEPS:-}" ]; then
    echo "== build steps and linkers"
    timeout 110 python3 benchmarks/build/build_steps_probe.py --ids 12,40 --iters 3 2>&1 \
      | tee "$OUT/build_steps.txt"
  fi
  echo "== device timing, CUDA hack and end-to-end tests"
  timeout 200 python3 -m pytest -q -m gpu tests/judge/test_timing_gpu.py \
    tests/judge/adversarial/test_cuda_hacks.py tests/gpu/test_cuda_e2e.py -p no:cacheprovider \
    --timeout 120 -rfEsxX 2>&1 | grep -E "^E  |passed|failed|^FAILED|^XPASS" | head -30 \
    | tee "$OUT/timing_tests.txt"
  echo "== latency, every phase"
  timeout 110 python3 benchmarks/judge_v2/latency_probe.py --kernelbench "$KB" --ids 12,40 \
    --iters "${ITERS:-4}" 2>&1 | grep -v Warning | grep -E "iter|median|^   (build|candidate|compare) " \
    | tee "$OUT/latency.txt"
  if [ -n "${FIDELITY_S:-}" ]; then
    echo "== fidelity"
    timeout $((FIDELITY_S + 20)) python3 benchmarks/judge_v2/judge_gpu.py --out "$OUT" \
      --kernelbench "$KB" --parts fidelity --budget-s "$FIDELITY_S" ${SPIN:+--spin $SPIN} 2>&1 \
      | grep -v Warning | tail -30
  fi
  ;;
v9)
  if [ -n "${TESTS:-}" ]; then
    echo "== judge GPU tests"
    timeout 330 python3 -m pytest -q -m gpu tests/judge tests/gpu/test_cuda_e2e.py \
      tests/gpu/test_cuda_fd.py -p no:cacheprovider --timeout 150 -rfEsxX --durations=6 2>&1 \
      | grep -v Warning | tail -20 | tee "$OUT/gpu_tests.txt"
    for n in 1 2; do
      echo "== latency, $n candidate process(es)" | tee -a "$OUT/latency.txt"
      timeout 110 python3 benchmarks/judge_v2/latency_probe.py --kernelbench "$KB" --ids 40,12 \
        --iters "${ITERS:-4}" --candidate-processes $n 2>&1 | grep -v Warning \
        | grep -E "iter|median|^   (build|candidate|candidate2|compare|compare_timed) " \
        | tee -a "$OUT/latency.txt"
    done
  else
    echo "== fidelity as configured"
    timeout $((${FIDELITY_S:-280} + 20)) python3 benchmarks/judge_v2/judge_gpu.py \
      --out "$OUT/one" --kernelbench "$KB" --parts fidelity --budget-s "${FIDELITY_S:-280}" \
      ${SPIN:+--spin $SPIN} 2>&1 | grep -v Warning | tail -24
    spin=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['fidelity']\
['candidates']['calibrated']['spin'])" "$OUT/one/judge_gpu.json" 2>/dev/null)
    echo "== fidelity, candidate in ${CP:-3} processes (spin ${spin:-none})"
    timeout $((${FIDELITY2_S:-230} + 20)) python3 benchmarks/judge_v2/judge_gpu.py \
      --out "$OUT/more" --kernelbench "$KB" --parts fidelity --budget-s "${FIDELITY2_S:-230}" \
      ${spin:+--spin $spin} --set candidate_processes="${CP:-3}" 2>&1 | grep -v Warning \
      | tail -24
  fi
  ;;
v10)
  if [ -n "${TESTS:-}" ]; then
    echo "== CUDA hack, device timing and e2e tests"
    timeout 300 python3 -m pytest -q -m gpu tests/judge/adversarial/test_cuda_hacks.py \
      tests/judge/test_timing_gpu.py tests/gpu/test_cuda_e2e.py -p no:cacheprovider \
      --timeout 150 -rfEsxX --durations=5 2>&1 | grep -v Warning | tee "$OUT/v10_tests.txt" \
      | grep -E "^E  |passed|failed|^FAILED|^XPASS|^[0-9.]+s " | head -40
  fi
  echo "== the calibrated kernel, in-process, recorded and not"
  timeout 150 python3 benchmarks/judge_v2/cupti_probe.py --only-calibrated --calls 200 \
    --calibrated 0 --calibrated "${SPIN:-84846}" 2>&1 | grep -v Warning | tee "$OUT/cupti.txt"
  for record in false true; do
    echo "== the calibrated kernel judged, activity_record=$record"
    timeout 150 python3 benchmarks/judge_v2/judge_gpu.py --out "$OUT/cal_$record" \
      --kernelbench "$KB" --parts fidelity --candidates calibrated --spin "${SPIN:-84846}" \
      --repeats "${REPEATS:-3}" --budget-s 120 --set baseline_processes=1 \
      --set activity_record=$record 2>&1 | grep -v Warning | tail -14
  done
  ;;
v11)
  echo "== e2e tests"
  timeout 200 python3 -m pytest -q -m gpu tests/gpu/test_cuda_e2e.py -p no:cacheprovider \
    --timeout 150 -rfEsxX 2>&1 | grep -v Warning | tee "$OUT/e2e.txt" \
    | grep -E "^E  |passed|failed|^FAILED" | head -20
  for record in false true; do
    echo "== the calibrated kernel judged, activity_record=$record"
    timeout 130 python3 benchmarks/judge_v2/judge_gpu.py --out "$OUT/cal_$record" \
      --kernelbench "$KB" --parts fidelity --candidates calibrated --spin "${SPIN:-84846}" \
      --repeats "${REPEATS:-3}" --budget-s 100 --set baseline_processes=1 \
      --set activity_record=$record 2>&1 | grep -v Warning | grep -E "^\| calibrated|flips"
  done
  echo "== latency, every phase"
  timeout 150 python3 benchmarks/judge_v2/latency_probe.py --kernelbench "$KB" --ids 40,12 \
    --iters "${ITERS:-3}" 2>&1 | grep -v Warning | tee "$OUT/latency.txt" \
    | grep -E "iter|median|^   (build|candidate|compare|candidate.timing.activity) "
  ;;
paired)
  timeout 560 python3 benchmarks/judge_v2/paired_probe.py --kernelbench "$KB" \
    --judgements "${JUDGEMENTS:-5}" --ways "${WAYS:-apart,paired}" --json "$OUT/paired.json" \
    2>&1 | grep -v Warning | tee "$OUT/paired.txt"
  ;;
nvcc-threads)
  for f in benchmarks/kernelbench_l1/40_LayerNorm/kernels/layer_norm.cu \
      benchmarks/kernelbench_l1/12_Matmul_with_diagonal_matrices_/kernels/diag_matmul.cu; do
    timeout 150 python3 benchmarks/build/nvcc_split_probe.py "$f" -n 5 --arch 90a \
      --extra=--split-compile=0 2>&1 | tail -7 | tee -a "$OUT/nvcc_threads.txt"
  done
  for flag in --cuda-flag=--split-compile=0 ""; do
    echo "== latency ${flag:-as built}" | tee -a "$OUT/latency.txt"
    timeout 200 python3 benchmarks/judge_v2/latency_probe.py --kernelbench "$KB" --ids 40,12 \
      --iters "${ITERS:-5}" $flag 2>&1 | grep -v Warning \
      | grep -E "iter|median|^   (build|candidate|compare) " | tee -a "$OUT/latency.txt"
  done
  ;;
latency)
  echo "== nvcc stages as a graph"
  for f in benchmarks/kernelbench_l1/40_LayerNorm/kernels/layer_norm.cu \
      benchmarks/kernelbench_l1/12_Matmul_with_diagonal_matrices_/kernels/diag_matmul.cu; do
    timeout 100 python3 benchmarks/build/nvcc_split_probe.py "$f" -n 5 --arch 90a 2>&1 \
      | tail -5 | tee -a "$OUT/nvcc_split.txt"
  done
  echo "== judge GPU tests"
  timeout 330 python3 -m pytest -q -m gpu tests/judge tests/gpu/test_cuda_e2e.py \
    tests/gpu/test_cuda_fd.py \
    -p no:cacheprovider --timeout 150 -rfEsxX --durations=6 2>&1 | grep -v Warning | tail -20 \
    | tee "$OUT/gpu_tests.txt"
  echo "== latency, every phase"
  timeout 200 python3 benchmarks/judge_v2/latency_probe.py --kernelbench "$KB" --ids 40,12 \
    --iters "${ITERS:-5}" 2>&1 | grep -v Warning | tee "$OUT/latency.txt"
  ;;
spares)
  for way in "" --spares-between; do
    echo "== latency ${way:-keep_warm}" | tee -a "$OUT/latency.txt"
    timeout 200 python3 benchmarks/judge_v2/latency_probe.py --kernelbench "$KB" --ids 40,12 \
      --iters "${ITERS:-5}" $way 2>&1 | grep -v Warning \
      | grep -E "iter|median|^   (build|candidate|compare|reference_join) " \
      | tee -a "$OUT/latency.txt"
  done
  ;;
cuda-hacks)
  timeout 200 python3 -m pytest -q -m gpu tests/judge/adversarial/test_cuda_hacks.py \
    -p no:cacheprovider --timeout 120 -rfEsxX 2>&1 | tail -15 | tee "$OUT/cuda_hacks.txt"
  ;;
large)
  python3 - "$KB" "$OUT" "${LARGE_IDS:-5,7,9,11,19,20,21,22}" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
ids = {int(i) for i in sys.argv[3].split(",")}
big = [r for r in rows if r["level"] == 1 and r["problem_id"] in ids]
open(f"{sys.argv[2]}/large.jsonl", "w").write("".join(json.dumps(r) + "\n" for r in big))
relu = [r for r in big if r["problem_id"] == 19]
open(f"{sys.argv[2]}/relu.jsonl", "w").write("".join(json.dumps(r) + "\n" for r in relu))
print(len(big), "large tasks")
PY
  echo "== baselines of the large level-1 problems"
  timeout 330 python3 -m cuda_agent baselines "$OUT/large.jsonl" --out "$OUT/large_base" \
    --device cuda --quiet --set judge.process_timeout_s=200 2>&1 | tail -24
  echo "== the honest ReLU answer, 6.4 GB in and out"
  timeout 150 python3 -m cuda_agent eval "$OUT/relu.jsonl" benchmarks/kernelbench_l1 \
    --out "$OUT/relu_eval" --device cuda --quiet 2>&1 | tail -8
  python3 -c "
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line); j = r.get('result') or r
    print({k: j.get(k) for k in ('task', 'correct', 'reward', 'runtime_ms', 'eager_ms',
                                 'compile_ms', 'reasons', 'flags')})" "$OUT/relu_eval/results.jsonl"
  if [ -z "${NO_TESTS:-}" ]; then
    echo "== the judge's GPU tests"
    timeout 240 python3 -m pytest -q -m gpu tests/judge -p no:cacheprovider --timeout 200 \
      -rfEsxX 2>&1 | tail -12
  fi
  ;;
stream)
  for cp in ${CPS:-1 4}; do
    echo "== the calibrated pair with a streamed delay, candidate_processes=$cp"
    timeout "${STEP_S:-270}" python3 benchmarks/judge_v2/judge_gpu.py --out "$OUT/stream_cp$cp" \
      --kernelbench "$KB" --parts fidelity --candidates "${CANDIDATES:-calibrated}" \
      --delay stream --budget-s "$(( ${STEP_S:-270} - 20 ))" --set candidate_processes=$cp 2>&1 \
      | grep -v Warning | tail -16
  done
  ;;
split)
  echo "== split timing: fidelity of CANDIDATES (default 1/12) with CP candidate processes"
  timeout $((${FIDELITY_S:-280} + 20)) python3 benchmarks/judge_v2/judge_gpu.py \
    --out "$OUT/split" --kernelbench "$KB" --parts fidelity --candidates "${CANDIDATES:-1/12}" \
    --budget-s "${FIDELITY_S:-280}" --repeats "${REPEATS:-5}" --delay "${DELAY:-spin}" \
    --set candidate_processes="${CP:-4}" 2>&1 | grep -v Warning | tail -16
  for cp in ${LATENCY_CPS:-${CP:-4}}; do
    echo "== split timing: judge latency of LATENCY_IDS (default 40) with $cp candidate processes" \
      | tee -a "$OUT/latency_split.txt"
    latency_phases "${LATENCY_IDS:-40}" "$cp" "$OUT/latency_split.txt"
  done
  ;;
v12)
  if [ -z "${NO_TESTS:-}" ]; then
    echo "== GPU tests: ${TESTS:=tests/judge/adversarial/test_cuda_hacks.py tests/judge/test_timing_gpu.py tests/gpu/test_cuda_e2e.py}"
    timeout "${TESTS_S:-420}" python3 -m pytest -q -m gpu $TESTS -p no:cacheprovider \
      --timeout 150 -rfEsxX --durations=5 2>&1 | grep -v Warning | tee "$OUT/v12_tests.txt" \
      | grep -E "^E  |passed|failed|^FAILED|^XPASS|^[0-9.]+s " | head -40
  fi
  [ -n "${NO_LATENCY:-}" ] && exit 0
  for run in ${LATENCY:-40:1 12:1 40:0 12:0}; do  # problem:candidate processes, 0: default
    echo "== latency of 1/${run%:*}, candidate_processes=${run#*:} (1: the agent's verify and" \
      "profile; 0: the default)" | tee -a "$OUT/latency.txt"
    latency_phases "${run%:*}" "${run#*:}" "$OUT/latency.txt"
  done
  ;;
v12-fidelity)
  echo "== fidelity with the judge's defaults (baselines not cached unless SET names" \
    "cache_baselines=true)${SET:+; set: $SET}"
  timeout $((${FIDELITY_S:-500} + 30)) python3 benchmarks/judge_v2/judge_gpu.py --out "$OUT/fid" \
    --kernelbench "$KB" --parts fidelity --candidates "${CANDIDATES:-calibrated,1/12,1/40}" \
    --budget-s "${FIDELITY_S:-500}" --repeats "${REPEATS:-5}" ${SPIN:+--spin $SPIN} \
    ${DELAY:+--delay $DELAY} $(for s in ${SET:-}; do printf -- '--set %s ' "$s"; done) 2>&1 \
    | grep -v Warning | tail -30
  ;;
*) echo "unknown part $PART"; exit 2 ;;
esac
