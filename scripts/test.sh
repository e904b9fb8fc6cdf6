#!/usr/bin/env bash
# Set up, lint, and run the test suite (GPU tests run only where a GPU is present).
# Tests run on three processes (pytest-xdist; most wait on compilers and workers), then
# those marked `serial` (they compare times or deadlines) run alone. Arguments go to both
# pytest runs, e.g. `bash scripts/test.sh tests/judge`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
ruff check src tests benchmarks
export CUDA_AGENT_TEST_HOME=${CUDA_AGENT_TEST_HOME:-$(mktemp -d)/cuda-agent-home}
status=0
python -m pytest -q -n "${TEST_WORKERS:-3}" -m "not serial" --durations=25 "$@" || status=$?
python -m pytest -q -p no:xdist -m serial --durations=10 "$@" || { code=$?; [ "$code" = 5 ] || status=$code; }
[ "$status" = 5 ] && status=0  # 5: nothing selected (a path with no such tests)
exit "$status"
