#!/usr/bin/env bash
# Create .venv with cuda-agent installed. torch goes in first, pinned to a build that
# satisfies the project's range, so pip never pulls the multi-GB CUDA wheels on a CPU box.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -d .venv ] || "$PYTHON" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -c "import torch" 2>/dev/null || python -m pip install -q "torch==${TORCH_VERSION:-2.13.0}"
python -m pip install -q -e ".[dev,ray]"
echo "cuda-agent is installed in $PWD/.venv; put it on PATH for this shell with:"
echo "  source $PWD/.venv/bin/activate"
