#!/usr/bin/env bash
# Throughput of task synthesis (stage 0) on one GPU and its CPU cores, in one call of under
# 9 minutes: runs `cuda-agent synth --device cuda --workers W --count COUNT` for SECONDS_LIMIT
# seconds (then stops it: synth writes each task as it finishes, so what it wrote is kept),
# counts what it wrote and prints a markdown table: candidates, accepted, rejections per
# reason, accepted tasks/hour over the whole run and after the first WARMUP_S seconds
# (start-up excluded), projected hours for 6,000 tasks (goal: 2,000 accepted/hour), eager
# runtime median. Repository root, GPU machine (KernelBench at .bench/kernelbench.jsonl):
#
#   bash benchmarks/synth/device_throughput.sh OUT_DIR
#
# Writes OUT_DIR/synth/ (the data set: jsonl/, run/verdicts.jsonl, and for a stopped run the
# summary files, the data-set card (card.md, card/*.png: op-class, ops-count, runtime and
# rejection plots, ten sample tasks) and parquet written by the report), OUT_DIR/synth.log
# (the command's output), OUT_DIR/throughput.md and throughput.json (with the compute-heavy
# share and op-class mix of the whole set). An OUT_DIR/synth/ left by an earlier call is
# resumed; only this call's candidates are counted. A second call with RECHECK=1 re-checks
# every accepted task 3 times instead (`synth recheck`, OUT_DIR/synth/recheck.json).
# Environment: DEVICE (cuda; cpu tries it out on a machine without a GPU, with .venv's Python
# and without device_env.sh), WORKERS (cores - 2, at least 1), SECONDS_LIMIT (420), COUNT
# (6000: the time limit ends the run first), KB (KernelBench JSONL for decontamination;
# .bench/kernelbench.jsonl if present, KB= for none: the card then says skipped), WARMUP_S (60), COMPILE=0 (no
# torch.compile check), COMPILE_THREADS (1: TORCHINDUCTOR_COMPILE_THREADS of the workers, so
# that W workers do not each start a pool of one compile process per core; empty: torch's
# default), SYNTH_ARGS (more synth options, e.g. "--set filters.timing_runs=3").
set -uo pipefail
OUT=${1:?OUT_DIR}
DEVICE=${DEVICE:-cuda}
CORES=$(nproc)
WORKERS=${WORKERS:-$(( CORES > 3 ? CORES - 2 : 1 ))}
SECONDS_LIMIT=${SECONDS_LIMIT:-420}
COUNT=${COUNT:-6000}
KB=${KB-.bench/kernelbench.jsonl}
WARMUP_S=${WARMUP_S:-60}
COMPILE_THREADS=${COMPILE_THREADS-1}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
RUN=$OUT/synth
if [ "$DEVICE" = cuda ]; then
  . benchmarks/device_env.sh
  PY=${PY:-python3}
  LABEL="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), $CORES cores"
else  # a CPU try-out (no wheels to install, no nvidia-smi)
  PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
  export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
  export CUDA_AGENT_HOME=${CUDA_AGENT_HOME:-/tmp/cuda-agent-home}
  LABEL="cpu ($(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1), $CORES cores)"
fi
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda,
      'available', torch.cuda.is_available())"

OPTS=(--device "$DEVICE" --workers "$WORKERS" --count "$COUNT" --out "$RUN")
if [ -n "$KB" ] && [ -f "$KB" ]; then OPTS+=(--kernelbench "$KB")
else OPTS+=(--kernelbench off); KB="(none)"; fi
[ "${COMPILE:-1}" = 0 ] && OPTS+=(--no-compile)
if [ -n "$COMPILE_THREADS" ]; then export TORCHINDUCTOR_COMPILE_THREADS=$COMPILE_THREADS; fi
SETTINGS="compile check $( [ "${COMPILE:-1}" = 0 ] && echo off || echo on ), inductor compile \
threads ${COMPILE_THREADS:-default}, kernelbench $KB${SYNTH_ARGS:+, $SYNTH_ARGS}"
# shellcheck disable=SC2206 # SYNTH_ARGS is split into words on purpose
OPTS+=(${SYNTH_ARGS:-})
echo "== synth on $LABEL: $WORKERS workers, ${SECONDS_LIMIT}s, count $COUNT; $SETTINGS"
echo "   $PY -m cuda_agent synth ${OPTS[*]}"

# every process under PID (the synth workers run in their own sessions, so a signal to the
# synth process or its group does not reach them; their children neither)
children() {  # from /proc (no procps needed): the 4th field of stat, after "(comm)"
  local f stat
  for f in /proc/[0-9]*/stat; do
    stat=$(cat "$f" 2>/dev/null) || continue
    stat=${stat##*) }
    set -- $stat
    [ "$2" = "$PARENT" ] && { f=${f#/proc/}; echo "${f%/stat}"; }
  done
}
descendants() {
  local child
  for child in $(PARENT=$1 children); do echo "$child"; descendants "$child"; done
}

if [ "${RECHECK:-0}" = 1 ]; then  # every accepted task of OUT_DIR/synth, 3 times
  timeout "$SECONDS_LIMIT" "$PY" -m cuda_agent synth recheck "$RUN" --times 3 \
    --workers "$WORKERS" 2>&1 | tr '\r' '\n' | tail -3
  "$PY" -c "import json, sys; r = json.load(open(sys.argv[1])); print({k: r[k] for k in
      ('tasks', 'times', 'stable', 'refused_tasks', 'reasons')})" "$RUN/recheck.json"
  exit 0
fi

START=$(date +%s.%N)
"$PY" -m cuda_agent synth "${OPTS[@]}" > "$OUT/synth.log" 2>&1 &
PID=$!
STATUS="count reached"
while kill -0 "$PID" 2>/dev/null; do
  NOW=$(date +%s.%N)
  if awk -v a="$NOW" -v b="$START" -v l="$SECONDS_LIMIT" 'BEGIN { exit !(a - b >= l) }'; then
    STATUS="time limit (${SECONDS_LIMIT}s)"
    break
  fi
  sleep 1
done
END=$(date +%s.%N)
if [ "$STATUS" = "count reached" ]; then
  wait "$PID"; RC=$?
  [ "$RC" = 0 ] || STATUS="synth exited with code $RC"
else
  # frozen first, so that no worker starts between the listing and the kill; a line cut
  # in the middle is dropped by the readers (as after any kill)
  kill -STOP "$PID" 2>/dev/null
  PIDS=$(descendants "$PID")
  kill -KILL "$PID" 2>/dev/null
  wait "$PID" 2>/dev/null
  for p in $PIDS; do  # each worker leads its process group: the group goes with it
    kill -KILL -- "-$p" 2>/dev/null
    kill -KILL "$p" 2>/dev/null
  done
fi
echo "== synth stopped by: $STATUS after $(awk -v a="$END" -v b="$START" \
  'BEGIN { printf "%.1f", a - b }')s; last lines of its output:"
tail -c 2000 "$OUT/synth.log" | tr '\r' '\n' | grep -v '^\s*$' | tail -4 | grep . \
  || echo "(none: a stopped run prints nothing)"

"$PY" benchmarks/synth/throughput_report.py "$RUN" --start "$START" --end "$END" \
  --workers "$WORKERS" --device "$DEVICE" --label "$LABEL" --status "$STATUS" \
  --settings "$SETTINGS" --warmup-s "$WARMUP_S" --out "$OUT/throughput"
echo "== done in $(awk -v a="$(date +%s.%N)" -v b="$START" 'BEGIN { printf "%.0f", a - b }')s"
