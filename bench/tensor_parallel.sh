#!/usr/bin/env bash
# Tensor parallelism on one multi-GPU host: llama3-8b (random weights) with tensor_parallel_size 1 and 2, after
# warm-up: batch-1 decode tok/s, TTFT of a 2,048-token prompt, 32 x 2048/512 tok/s (bench/tensor_parallel.py), a
# short table last. It runs as the `tensor-parallel` phase of bench/gpu_session.sh (carried wheels, logs in $OUT).
#
#   bench/tensor_parallel.sh                 # needs >= 2 visible GPUs (CUDA_VISIBLE_DEVICES picks them)
#   SITS_TP_SIZES=1,2,4 bench/tensor_parallel.sh
set -uo pipefail
cd "$(dirname "$0")/.."
sizes="${SITS_TP_SIZES:-1,2}"
need=$(tr ',' '\n' <<< "$sizes" | sort -n | tail -1)
if [[ -n "${CUDA_VISIBLE_DEVICES+x}" ]]; then
  visible=$(tr ',' '\n' <<< "$CUDA_VISIBLE_DEVICES" | grep -c .)
else
  visible=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
fi
if (( visible < need )); then
  echo "bench/tensor_parallel.sh: tensor_parallel_size $need needs $need CUDA GPUs (one per rank), $visible visible" \
       "(nvidia-smi -L, CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}); run it on a multi-GPU host" >&2
  exit 2
fi
export SITS_TP_SIZES="$sizes"
exec bench/gpu_session.sh tensor-parallel
