# Sourced by the device scripts: install missing pure-Python packages from .whl/ (if any)
# and point Python at them and at src/; set the cuda-agent home and print the machine.
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD/src
else
  export PYTHONPATH=$PWD/src
fi
export PYTHONUNBUFFERED=1 CUDA_AGENT_HOME=/tmp/cuda-agent-home CUDA_AGENT_TEST_HOME=/tmp/cuda-agent-home
# the machine's copy of the tree may carry an older .git: COMMIT, where given, is the tree's
echo "== $(date -u +%FT%TZ) commit ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo none)}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
