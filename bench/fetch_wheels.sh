#!/usr/bin/env bash
# Fetches, on this machine (it has a package registry), the wheels a GPU device call carries in .whl/, at the exact
# versions of constraints/lock.txt, for the device's Python (3.12, manylinux x86_64). bench/gpu_session.sh and
# bench/gpu_demo.sh install only those the device lacks (bench/missing_wheels.py, which refuses a wheel whose version
# is not the lock's).
#
#   bash bench/fetch_wheels.sh            # what the engine, the control plane and the demo need beside torch/Triton
#   bash bench/fetch_wheels.sh NAME ...   # these (and what they need), at the lock's versions
set -euo pipefail
cd "$(dirname "$0")/.."
names=("$@")
if ((${#names[@]} == 0)); then
  names=(flask waitress kubernetes pyyaml httpx uvicorn starlette pyzmq msgspec opentelemetry-sdk openai
         opentelemetry-exporter-otlp-proto-http safetensors tokenizers tqdm prometheus-client requests grafanalib)
fi
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
# the lock without torch/Triton/numpy: the device keeps its own CUDA builds of those
lock=$(mktemp); trap 'rm -f "$lock"' EXIT
grep -viE '^(torch|triton|numpy)==' constraints/lock.txt > "$lock"
platforms=()
for n in 28 27 24 17; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -c "$lock" -d .whl "${names[@]}" \
  2> >(grep -v "^WARNING: Location 'file:" >&2)
echo "[fetch_wheels] .whl/: $(ls .whl/*.whl | wc -l) wheels, $(du -sh .whl | cut -f1) (carry .whl: 64 MiB a call in all)"
