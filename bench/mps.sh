# Sourced by the GPU scripts (bench/gpu_demo.sh, bench/replica_offset.sh): `mps_start DIR` starts a CUDA MPS daemon
# for this machine's GPU where it can (SITS_MPS=off: time-slicing), exporting its pipe and log directories under DIR
# so every CUDA process started after it is an MPS client; it sets SHARING to what the engines run under.
# `mps_stop [DIR]` quits the daemon it started, first keeping the end of its control and server logs in DIR/mps-*.log
# (where a client's "CUDA error 805" is explained).
mps_start() {
  SHARING="time-slicing (no MPS)"
  if [ "${SITS_MPS:-auto}" != off ] && command -v nvidia-cuda-mps-control >/dev/null; then
    export CUDA_MPS_PIPE_DIRECTORY=$1/mps-pipe CUDA_MPS_LOG_DIRECTORY=$1/mps-log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    if nvidia-cuda-mps-control -d && timeout 60 python3 -c "import torch; assert torch.ones(4, device='cuda').sum().item() == 4"; then
      SHARING="CUDA MPS"
    else
      echo quit | nvidia-cuda-mps-control 2>/dev/null; sleep 1
      tail -n 5 "$CUDA_MPS_LOG_DIRECTORY"/*.log 2>/dev/null
      unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    fi
  elif [ "${SITS_MPS:-auto}" != off ]; then
    echo "no nvidia-cuda-mps-control here"
  fi
}

mps_stop() {
  [ "$SHARING" = "CUDA MPS" ] || return 0
  if [ -n "${1:-}" ]; then
    for f in "$CUDA_MPS_LOG_DIRECTORY"/*.log; do [ -f "$f" ] && tail -n 200 "$f" > "$1/mps-$(basename "$f")"; done
  fi
  echo quit | nvidia-cuda-mps-control
  return 0
}
