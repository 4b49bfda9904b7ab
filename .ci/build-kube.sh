#!/usr/bin/env bash
# Builds kube-apiserver and kube-controller-manager (v1.20.2) from Debian bookworm's `kubernetes` source package and
# installs etcd, for the Kubernetes deployer tests (tests/fixtures/kube.py). No registry ships these binaries.
# Idempotent: does nothing when the binaries are already in $SITS_KUBE_DIR/bin (default /var/cache/sits/kube/bin).
# Never touches /etc/apt: deb-src is enabled in a private apt config under the cache dir.
set -euo pipefail

KUBE_DIR="${SITS_KUBE_DIR:-/var/cache/sits/kube}"
BIN="$KUBE_DIR/bin"
W="$KUBE_DIR/work"
BINARIES=(kube-apiserver kube-controller-manager)
# bumped whenever the build recipe changes, so stale binaries are rebuilt. v2: vendored reflect2 1.0.1 -> 1.0.2
# (1.0.1 makes Go >= 1.18 builds segfault in json-iterator's map encoder, e.g. on every custom resource write)
RECIPE=v2-reflect2-1.0.2
REFLECT2_SRC=/usr/share/gocode/src/github.com/modern-go/reflect2
T0=$(date +%s)

log() { echo "[build-kube +$(( $(date +%s) - T0 ))s] $*"; }
trap 'rc=$?; echo "[build-kube] FAILED (exit $rc) at line $LINENO: $BASH_COMMAND" >&2; exit $rc' ERR

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
APT_OPTS=(-o DPkg::Lock::Timeout=600 -o Acquire::Retries=3)

have_all() {
  command -v etcd >/dev/null 2>&1 || return 1
  for b in "${BINARIES[@]}"; do [ -x "$BIN/$b" ] || return 1; done
  [ "$(cat "$BIN/.recipe" 2>/dev/null)" = "$RECIPE" ]
}
if have_all; then
  log "already built: ${BINARIES[*]} in $BIN (recipe $RECIPE), etcd at $(command -v etcd); nothing to do"
  exit 0
fi

# 1. build tools + etcd
need=()
command -v go >/dev/null 2>&1 || need+=(golang-go)
command -v rsync >/dev/null 2>&1 || need+=(rsync)
command -v make >/dev/null 2>&1 || need+=(make)
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
[ -f "$REFLECT2_SRC/go_above_118.go" ] || need+=(golang-github-modern-go-reflect2-dev)
if [ ${#need[@]} -gt 0 ]; then
  log "apt-get install ${need[*]}"
  $SUDO apt-get "${APT_OPTS[@]}" update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get "${APT_OPTS[@]}" install -y -qq --no-install-recommends "${need[@]}"
fi
# the etcd-server package may start a system etcd on :2379; the tests start their own on free ports
if command -v systemctl >/dev/null 2>&1; then $SUDO systemctl stop etcd >/dev/null 2>&1 || true; fi
log "go: $(go version)"

if have_all; then log "binaries present; etcd installed; done"; exit 0; fi

$SUDO mkdir -p "$KUBE_DIR"
$SUDO chown "$(id -u):$(id -g)" "$KUBE_DIR"
mkdir -p "$BIN" "$W/apt/sources.list.d" "$W/apt/lists/partial" "$W/apt/cache/archives/partial" "$W/src"

# 2. the source package, through a private deb-src apt config derived from the machine's own source list
src_list=/etc/apt/sources.list.d/debian.sources
[ -f "$src_list" ] || { echo "[build-kube] $src_list not found: cannot derive a deb-src config" >&2; exit 1; }
sed 's/^Types: deb$/Types: deb deb-src/' "$src_list" > "$W/apt/sources.list.d/s.sources"
A=(-o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts="$W/apt/sources.list.d"
   -o Dir::State::Lists="$W/apt/lists" -o Dir::Cache="$W/apt/cache" -o Debug::NoLocking=1 "${APT_OPTS[@]}")
cd "$W/src"
if ! ls kubernetes_*.orig.tar.* >/dev/null 2>&1; then
  log "apt-get update (private deb-src lists)"
  apt-get "${A[@]}" update -qq
  log "apt-get source --download-only kubernetes/bookworm"
  apt-get "${A[@]}" source --download-only kubernetes/bookworm
fi
orig=$(ls kubernetes_*.orig.tar.* | grep -v -- '-[a-z]*\.tar' | head -n1 || true)
[ -n "$orig" ] || orig=$(ls kubernetes_*.orig.tar.* | head -n1)
log "source: $orig"
if [ ! -f kubernetes-src/.unpacked ]; then
  rm -rf kubernetes-src && mkdir kubernetes-src
  tar -xf "$orig" -C kubernetes-src
  touch kubernetes-src/.unpacked
fi
top=$(find kubernetes-src -mindepth 1 -maxdepth 1 -type d | head -n1)
[ -f "$top/Makefile" ] || { echo "[build-kube] no Makefile in $top: unexpected source layout" >&2; exit 1; }
cd "$top"

log "vendor: github.com/modern-go/reflect2 1.0.1 -> $(dpkg-query -W -f '${Version}' golang-github-modern-go-reflect2-dev)"
r2=vendor/github.com/modern-go/reflect2
[ -d "$r2" ] && [ -f "$REFLECT2_SRC/go_above_118.go" ] || { echo "[build-kube] cannot patch $r2" >&2; exit 1; }
find "$r2" -maxdepth 1 -type f \( -name '*.go' -o -name '*.s' \) -delete
find "$REFLECT2_SRC" -maxdepth 1 -type f \( -name '*.go' -o -name '*.s' \) ! -name '*_test.go' -exec cp {} "$r2"/ \;

# 3. build (offline: vendored modules only)
export GOFLAGS=-mod=vendor GOPROXY=off GO111MODULE=on KUBE_GIT_VERSION=v1.20.2 KUBE_GIT_TREE_STATE=clean
export GOCACHE="$W/gocache" GOPATH="$W/gopath"
log "make generated_files (in $PWD)"
make generated_files
log "make WHAT=cmd/kube-apiserver cmd/kube-controller-manager"
make WHAT="cmd/kube-apiserver cmd/kube-controller-manager"
for b in "${BINARIES[@]}"; do
  src=$(find _output -type f -name "$b" -perm -u+x | head -n1)
  [ -n "$src" ] || { echo "[build-kube] $b was not built (no _output/**/$b)" >&2; exit 1; }
  install -m 0755 "$src" "$BIN/$b.tmp" && mv -f "$BIN/$b.tmp" "$BIN/$b"
done
"$BIN/kube-apiserver" --version
echo "$RECIPE" > "$BIN/.recipe"
log "built ${BINARIES[*]} into $BIN; removing the build tree (keeps the downloaded source)"
cd "$W/src" && rm -rf kubernetes-src "$W/gocache" "$W/gopath"
log "done"
