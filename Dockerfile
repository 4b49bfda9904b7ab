# SITS images from one file, three variants (VARIANT):
#   docker build -t sits-control:0.1.0 --build-arg VARIANT=control .   # the control plane alone (`sits-control serve`:
#                                                                       # UI, API, worker), no torch: what the chart runs
#   docker build -t sits:0.1.0-cuda .                                   # engines on GPUs: CUDA runtime, CUDA torch
#   docker build -t sits:0.1.0-cpu --build-arg VARIANT=cpu .            # engines on CPU (tiny model, tests)
# The engine variants install ".[engine]" (torch, Triton, ...) and run `sits-engine serve` (production, baseline and
# canary pods); the control variant installs "." (flask, waitress, kubernetes, ...: docs/helm.md gives its size).
# All run as uid 10001 with a read-only root filesystem: HOME and Triton's cache live in /tmp (the chart mounts an
# emptyDir there); the control plane's store goes to /data.
ARG VARIANT=cuda
ARG CUDA_BASE=nvidia/cuda:12.8.1-runtime-ubuntu24.04
ARG CPU_BASE=python:3.11-slim-bookworm

# Triton compiles its launchers at run time: both engine variants need a C compiler
FROM ${CUDA_BASE} AS os-cuda
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
ENV TORCH_INDEX=https://download.pytorch.org/whl/cu128 EXTRA="[engine]"

FROM ${CPU_BASE} AS os-cpu
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
ENV TORCH_INDEX=https://download.pytorch.org/whl/cpu EXTRA="[engine]"

# the control plane: no compiler, no torch
FROM ${CPU_BASE} AS os-control
ENV TORCH_INDEX="" EXTRA=""

FROM os-${VARIANT}
ARG TORCH_VERSION=2.13.0
ENV PATH=/opt/sits/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp TRITON_CACHE_DIR=/tmp/triton
RUN python3 -m venv /opt/sits \
    && if [ -n "$TORCH_INDEX" ]; then pip install --no-cache-dir --index-url "$TORCH_INDEX" "torch==${TORCH_VERSION}"; fi
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY constraints/lock.txt constraints/lock.txt
COPY sits sits
COPY engine engine
COPY kernels kernels
COPY control_plane control_plane
COPY dashboards dashboards
# exact versions from the lock (.ci/lock.sh); torch was installed above from its own index, so its CPU pin is dropped
RUN grep -v '^torch==' constraints/lock.txt > /tmp/lock.txt \
    && pip install --no-cache-dir -c /tmp/lock.txt ".${EXTRA}" && rm -rf /src /tmp/lock.txt
RUN groupadd --gid 10001 sits && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp sits \
    && mkdir -p /data && chown 10001:10001 /data
USER 10001:10001
WORKDIR /data
EXPOSE 8000 8080
# the chart and the Kubernetes deployer give the command; this default starts an engine on the tiny model (the
# control variant's pods are given `sits-control serve ...` by the chart)
CMD ["sits-engine", "serve", "--model", "tiny", "--host", "0.0.0.0", "--port", "8000"]
