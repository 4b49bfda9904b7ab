#!/usr/bin/env bash
# Installs everything the tests and the demo need on a fresh machine (idempotent; a second run is fast).
#   - Debian packages for the real servers the tests start (Prometheus, ...)
#   - a virtual environment in .venv with the project and its test extra (CPU torch from constraints/cpu.txt)
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

need_apt=()
command -v prometheus >/dev/null 2>&1 || need_apt+=(prometheus)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "[setup] apt-get install ${need_apt[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi
# the Debian package starts a system Prometheus on :9090; tests start their own, so stop it if it runs
if command -v systemctl >/dev/null 2>&1; then $SUDO systemctl stop prometheus >/dev/null 2>&1 || true; fi

if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  python3 -m venv .venv
fi
stamp=.venv/.sits-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ constraints/cpu.txt -nt "$stamp" ]; then
  echo "[setup] pip install -e .[test] (CPU torch)"
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q -c constraints/cpu.txt -e '.[test]'
  touch "$stamp"
fi
bash .ci/install-browser.sh   # Chromium for the web UI's browser test
# kube-apiserver + kube-controller-manager + etcd for the Kubernetes deployer tests (built once, cached on disk)
bash .ci/build-kube.sh
echo "[setup] ok"
