#!/usr/bin/env bash
# Set up, lint, and run the test suite (GPU tests run only where a GPU is present).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
ruff check src tests benchmarks
export CUDA_AGENT_TEST_HOME=${CUDA_AGENT_TEST_HOME:-$(mktemp -d)/cuda-agent-home}
python -m pytest -q "$@"
