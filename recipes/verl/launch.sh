#!/usr/bin/env bash
# Run one training stage with verl (pinned: verl==0.9.1) on a Ray cluster.
#
#   bash recipes/verl/launch.sh STAGE [hydra overrides...]
#   STAGE: single_turn_warmup | rft | value_pretrain | ppo
#
# The cluster, once (every machine: this repository installed with verl==0.9.1, the same
# Python environment, its own $CUDA_AGENT_HOME):
#   ray start --head --port=6379                  # head machine
#   ray start --address=HEAD_IP:6379              # each training GPU machine
#   ray start --address=HEAD_IP:6379              # each judge GPU machine (the judge pool's
#                                                 # actors take GPUs verl does not hold)
# then run this script on the head. Environment:
#   MODEL            actor checkpoint (hf format)         default models/base
#   CRITIC           critic checkpoint (ppo: the value-pretrained one; default MODEL)
#   CUDA_AGENT_DATA  folder with train.parquet (val.parquet for PPO)
#   NNODES, GPUS_PER_NODE   training machines and their GPUs (default 16 x 8)
#   TORCHRUN_ARGS    rft only (torchrun, not Ray): run on every machine with its rank
set -euo pipefail

stage="${1:?usage: launch.sh single_turn_warmup|rft|value_pretrain|ppo [overrides...]}"
shift
here="$(cd "$(dirname "$0")" && pwd)"
export CUDA_AGENT_RECIPES="$here"
export RAY_ADDRESS="${RAY_ADDRESS:-auto}"
export TOKENIZERS_PARALLELISM=false
nodes="trainer.nnodes=${NNODES:-16}"
gpus="trainer.n_gpus_per_node=${GPUS_PER_NODE:-8}"

case "$stage" in
  rft)
    # shellcheck disable=SC2086  # TORCHRUN_ARGS: e.g. "--node-rank=0 --rdzv-endpoint=HEAD_IP:29500"
    exec torchrun --nnodes="${NNODES:-16}" --nproc-per-node="${GPUS_PER_NODE:-8}" ${TORCHRUN_ARGS:-} \
      -m verl.trainer.sft_trainer --config-path "$here" --config-name rft "$nodes" "$gpus" "$@" ;;
  single_turn_warmup|value_pretrain|ppo)
    exec python -m verl.trainer.main_ppo --config-path "$here" --config-name "$stage" \
      "$nodes" "$gpus" "$@" ;;
  *)
    echo "unknown stage: $stage" >&2; exit 2 ;;
esac
