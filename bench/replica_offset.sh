#!/usr/bin/env bash
# Why identical engines differ on one GPU, in ONE device call: install the carried wheels, start CUDA MPS as the GPU
# demo does, print the machine's CPU/NUMA/GPU topology, then run bench/replica_offset.py (three identical engines,
# shared vs pinned CPUs, two start orders). Results under $OUT (replica-offset.json, topology.txt).
#
#   bash bench/replica_offset.sh [SECONDS_PER_CONDITION] [RATE_PER_ENGINE]     # default: 40 10
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/sits-replica-offset-out}
WORK=/tmp/sits-replica-offset
mkdir -p "$OUT" "$WORK"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 SITS_CACHE_DIR=$WORK/cache
bash bench/install_carried_wheels.sh || exit $?
source bench/mps.sh
mps_start "$WORK"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  echo "GPU sharing: $SHARING"; nproc; lscpu | grep -iE "numa|socket|thread|model name"
  nvidia-smi topo -m 2>/dev/null | head -5; } | tee "$OUT/topology.txt"
timeout 540 python3 bench/replica_offset.py --device cuda --seconds "${1:-40}" --rate "${2:-10}" \
  --json "$OUT/replica-offset.json" --log-dir "$WORK/logs"
rc=$?
mps_stop "$OUT"
grep -hiE "error|traceback" "$WORK"/logs/*.log 2>/dev/null | head -10
exit $rc
