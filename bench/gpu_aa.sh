#!/usr/bin/env bash
# Sequential statistics on the H200 in ONE device call (<= 10 min): the product's GPU demo run as several demos at
# once on one GPU (CUDA MPS): one with the slow and the good release, the others with A/A canaries only (triton-v1
# against triton-v1: any rollback is a false one). Prints bench/gpu_aa_report.py's table last.
#
#   bash bench/gpu_aa.sh [AA_DEMOS] [AA_PER_DEMO] [DEMO_TIMEOUT_S]      # default: 5 4 480 (20 A/A runs)
set -uo pipefail
cd "$(dirname "$0")/.."
AA_DEMOS=${1:-5}
AA_PER=${2:-4}
DEMO_TIMEOUT=${3:-480}
OUT=${OUT:-/tmp/sits-gpu-aa-out}
WORK=/tmp/sits-gpu-aa
mkdir -p "$OUT" "$WORK"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 SITS_CACHE_DIR=$WORK/cache
t0=$(date +%s)
stamp() { echo "[gpu_aa +$(( $(date +%s) - t0 ))s] $*"; }

bash bench/install_carried_wheels.sh || exit $?
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
  git log -1 --format='tree %h %cd' 2>/dev/null; } | tee "$OUT/versions.txt"
export CUDA_MPS_PIPE_DIRECTORY=$WORK/mps-pipe CUDA_MPS_LOG_DIRECTORY=$WORK/mps-log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d && stamp "CUDA MPS on" || { stamp "no MPS"; unset CUDA_MPS_PIPE_DIRECTORY; }

stamp "training / loading the demo model once"
python3 -c "from sits.control_plane.demo.model import resolve_model; print(resolve_model('tiny-trained', 'cuda', print))" \
  2>&1 | tail -3
n=$((AA_DEMOS + 1))
share=$(python3 -c "print(round(0.85 / (4 * $n), 3))")
aa=$(python3 -c "print(','.join(['aa'] * $AA_PER))")
stamp "$n demos at once, each engine --gpu-memory-share $share: main (slow,good) and $AA_DEMOS x ($aa)"
pids=()
timeout "$DEMO_TIMEOUT" python3 -m sits.control_plane.cli demo --device cuda --scenario slow,good --exit-when-done \
  --workdir "$WORK/main" --service main --gpu-memory-share "$share" --rate 20 > "$OUT/main.log" 2>&1 &
pids+=($!)
for i in $(seq 1 "$AA_DEMOS"); do
  sleep 3
  timeout "$DEMO_TIMEOUT" python3 -m sits.control_plane.cli demo --device cuda --scenario "$aa" --exit-when-done \
    --workdir "$WORK/aa$i" --service "aa$i" --gpu-memory-share "$share" --rate 20 > "$OUT/aa$i.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; echo "exit $?"; done | tee "$OUT/exits.txt"
echo quit | nvidia-cuda-mps-control 2>/dev/null
stamp "demos done"
for d in "$WORK"/main "$WORK"/aa*; do
  python3 - "$d/sits-demo.db" "$OUT/$(basename "$d").db" <<'PY'
import sqlite3, sys
src = sqlite3.connect(sys.argv[1]); dst = sqlite3.connect(sys.argv[2]); src.backup(dst); dst.close(); src.close()
PY
done
grep -h "=> \|error\|Traceback" "$OUT"/*.log | head -60
echo
python3 bench/gpu_aa_report.py "$OUT"/main.db "$OUT"/aa*.db | tee "$OUT/report.md"
