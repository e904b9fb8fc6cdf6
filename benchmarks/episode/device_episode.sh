#!/usr/bin/env bash
# Issue-31 figures on a GPU machine, one call (repository root; KernelBench read from
# .bench/kernelbench.jsonl; missing pure-Python packages as wheels in .whl/):
#
#   bash benchmarks/episode/device_episode.sh OUT [PARTS]   # PARTS: episode,shell,single
set -uo pipefail
OUT=${1:-/tmp/out}
mkdir -p "$OUT"
. benchmarks/device_env.sh
timeout "${EPISODE_S:-560}" python3 benchmarks/episode/episode_speed.py --out "$OUT" \
  --kernelbench "${KB:-.bench/kernelbench.jsonl}" --parts "${2:-episode,shell,single}" 2>&1 \
  | grep -v Warning | tee "$OUT/episode_speed.log"
