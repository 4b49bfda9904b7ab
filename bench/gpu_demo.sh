#!/usr/bin/env bash
# The GPU demo in ONE device call (<= 10 min): install the carried wheels, time decode attention of triton-v1 and its
# two example regressions (bench/gpu_demo_kernels.py), run `sits-control demo --device cuda` from this tree while
# sampling GPU memory per engine, then copy the demo's store and print a short table last. $OUT keeps the store
# (sits-demo.db), demo.log and report.txt; the rest goes into others.tar.gz (bench/bundle_out.sh: the device tool
# brings back at most 8 files).
#
#   bash bench/gpu_demo.sh [SCENARIOS] [DEMO_TIMEOUT_S] [PARALLEL]   # default: slow,wrong,good,aa  430  1
#
# PARALLEL (or $SITS_DEMO_PARALLEL) is the demo's --parallel K: the scenarios dealt round-robin to K lanes that run
# side by side, each its own service (demo-1 ... demo-K) with its own production engine, router and load, all of them
# sharing the GPU (each engine 0.2/K of its memory). For A/A campaigns: one call of 9.5 min gives 3-4 A/A decisions
# with one lane, up to K times as many with K (less what the contention slows each), under harsher sharing:
#   bash bench/gpu_demo.sh aa,aa,aa,aa,aa,aa,aa,aa,aa,aa,aa,aa 540 3
# The table at the end counts the decisions per scenario over every lane (bench/gpu_demo_report.py).
#
# Wheels: .whl/ (bash bench/fetch_wheels.sh: the lock's versions of flask, waitress, kubernetes, pyyaml, httpx, uvicorn, starlette, pyzmq, msgspec,
# opentelemetry-sdk/-exporter-otlp-proto-http, safetensors, tokenizers, tqdm; see BENCHMARKS.md "GPU demo").
set -uo pipefail
cd "$(dirname "$0")/.."
SCENARIOS=${1:-slow,wrong,good,aa}
DEMO_TIMEOUT=${2:-430}
PARALLEL=${3:-${SITS_DEMO_PARALLEL:-1}}
OUT=${OUT:-/tmp/sits-gpu-demo-out}
WORK=/tmp/sits-gpu-demo
mkdir -p "$OUT" "$WORK"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 SITS_CACHE_DIR=$WORK/cache
t0=$(date +%s)
stamp() { echo "[gpu_demo +$(( $(date +%s) - t0 ))s] $*"; }

bash bench/install_carried_wheels.sh || exit $?
stamp "wheels installed"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', \
torch.version.cuda, 'triton', triton.__version__)"; } | tee "$OUT/versions.txt"
python3 -c "import sits.control_plane.cli.main, flask, waitress, kubernetes, httpx, zmq, msgspec, sits.engine.server.main" \
  || { echo "missing packages"; exit 3; }

# CUDA MPS, where it can be started (SITS_MPS=off: time-slicing): the engines' kernels then share the SMs at once
# instead of taking turns; the demo reads CUDA_MPS_PIPE_DIRECTORY and says which it ran under
source bench/mps.sh
mps_start "$WORK"
stamp "GPU sharing: $SHARING" | tee -a "$OUT/versions.txt"

stamp "decode attention: triton-v1 vs triton-v1-unsplit vs triton-v1-floor-pages"
timeout 60 python3 bench/gpu_demo_kernels.py 2>&1 | tee "$OUT/kernels.txt"

# GPU memory per process, every 5 s: timestamp, pid, MiB, service/role/kernels (from /proc where the pid maps)
(
  while true; do
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null |
    while IFS=', ' read -r pid mem; do
      args=$(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null)
      role=$(sed -n 's/.*--env \([a-z]*\).*/\1/p' <<<"$args"); ks=$(sed -n 's/.*--kernels \([^ ]*\).*/\1/p' <<<"$args")
      svc=$(sed -n 's/.*--service \([^ ]*\).*/\1/p' <<<"$args")
      echo "$(date +%s),$pid,$mem,${svc:-?}/${role:-other}/${ks:-?}"
    done
    sleep 5
  done
) > "$OUT/gpumem.csv" &
SAMPLER=$!

stamp "demo: --device cuda --scenario $SCENARIOS --parallel $PARALLEL (timeout ${DEMO_TIMEOUT}s)"
# SITS_DEMO_ARGS: more `sits-control demo` flags, e.g. for the fp8 releases (scenarios w8a8,f16,fused):
#   SITS_DEMO_ARGS="--production-kernels triton-v1.3 --engine-arg '--quantization fp8 --kv-cache-dtype fp8'"
extra=()
[[ -n "${SITS_DEMO_ARGS:-}" ]] && mapfile -t extra < <(python3 -c 'import os, shlex; print("\n".join(shlex.split(os.environ.get("SITS_DEMO_ARGS", ""))))')
timeout "$DEMO_TIMEOUT" python3 -m sits.control_plane.cli demo --device cuda --scenario "$SCENARIOS" --exit-when-done \
  --parallel "$PARALLEL" --workdir "$WORK/demo" "${extra[@]}" 2>&1 | tee "$OUT/demo.log"
rc=${PIPESTATUS[0]}
kill "$SAMPLER" 2>/dev/null
mps_stop "$OUT"
stamp "demo exit status $rc"

# the store, consistent (sqlite backup API), and the engines' logs' last lines
python3 - "$WORK/demo/sits-demo.db" "$OUT/sits-demo.db" <<'PY'
import sqlite3, sys
src = sqlite3.connect(sys.argv[1]); dst = sqlite3.connect(sys.argv[2]); src.backup(dst); dst.close(); src.close()
PY
for f in "$WORK"/demo/variants/*.log; do echo "== $f"; tail -n 3 "$f"; done > "$OUT/engine-log-tails.txt" 2>/dev/null
grep -h "" "$WORK"/demo/variants/*.log 2>/dev/null | grep -iE "error|traceback|warn" | head -40 > "$OUT/engine-errors.txt"

echo
echo "==== GPU demo: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); $SHARING; scenarios $SCENARIOS in $PARALLEL lane(s); exit $rc; $(( $(date +%s) - t0 )) s in all"
cat "$OUT/versions.txt"
grep -E "^shape|triton-v1" "$OUT/kernels.txt" | head -20
python3 bench/gpu_demo_report.py "$OUT/sits-demo.db" "$OUT/demo.log" "$OUT/gpumem.csv" | tee "$OUT/report.txt"
grep -E "demo (passed|FAILED)|=> " "$OUT/demo.log" | tail -8
# the device tool brings back at most 8 files from $OUT: the store, the demo's log and the report as they are, the
# rest (versions, kernel timings, GPU memory samples, MPS and engine logs) in one archive
bash bench/bundle_out.sh "$OUT" sits-demo.db demo.log report.txt
exit "$rc"
