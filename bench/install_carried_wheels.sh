#!/usr/bin/env bash
# On a device machine: install the carried wheels in .whl/ (bash bench/fetch_wheels.sh made them, at the lock's
# versions) that the control plane, the engine and the demo need beside the machine's torch/Triton. Nothing to do
# without .whl/. Used by bench/gpu_demo.sh and bench/gpu_plugin_gate.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
[ -d .whl ] || exit 0
python3 bench/missing_wheels.py .whl >/dev/null || exit 2   # the lock's versions only
# pip's own status decides (a quiet, successful install prints nothing, which grep alone would call a failure)
log=$(python3 -m pip install -q --break-system-packages --no-index --find-links .whl flask waitress kubernetes \
  pyyaml httpx uvicorn starlette pyzmq msgspec opentelemetry-sdk opentelemetry-exporter-otlp-proto-http \
  safetensors tokenizers tqdm 2>&1)
rc=$?
grep -v "^WARNING: Running pip as" <<<"$log" | tail -5
exit $rc
