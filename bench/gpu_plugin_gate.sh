#!/usr/bin/env bash
# The wrong fixture releases (tests/fixtures/wrong_kernels.py, a kernel-set plugin) and a good one canaried through the
# product on a GPU, as a user would: SITS_KERNEL_PLUGINS + PYTHONPATH, `sits-control worker` (local deployer, three
# `sits-engine serve --device cuda` processes per rollout) and `sits-control rollout start --wait`, on the tiny model
# trained here and on llama3-8b (random bf16 weights), production triton-v1. One device call; a table last.
#
#   OUT=DIR bash bench/gpu_plugin_gate.sh [tiny,llama]
set -uo pipefail
cd "$(dirname "$0")/.."
MODELS=${1:-tiny,llama}
OUT=${OUT:-/tmp/sits-plugin-gate-out}
WORK=/tmp/sits-plugin-gate
mkdir -p "$OUT" "$WORK"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 SITS_KERNEL_PLUGINS=tests.fixtures.wrong_kernels
t0=$(date +%s)
stamp() { echo "[plugin_gate +$(( $(date +%s) - t0 ))s] $*"; }

bash bench/install_carried_wheels.sh || exit $?
python3 -c "import sits.control_plane.cli.main, sits.engine.server.main" || { echo "missing packages"; exit 3; }
tiny="${SITS_CACHE_DIR:-/tmp/sits-cache}/tiny-trained-cuda"
timeout 120 python3 bench/train_tiny.py --out "$tiny" --device cuda --reuse --log-every 400 2>&1 | tail -1
stamp "sets: $(python3 -m sits.engine.cli kernels 2>/dev/null | grep -c bug-) bug-* sets registered by the plugin"

db=$OUT/plugin-gate.db
echo '{"steps": [50, 100], "check_interval_s": 5, "warmup_s": 0}' > "$WORK/policy.json"
python3 -m sits.control_plane.cli worker --store "$db" --workdir "$WORK/engines" --interval 0.5 > "$OUT/worker.log" 2>&1 &
worker=$!
trap 'kill $worker 2>/dev/null; wait $worker 2>/dev/null' EXIT

rows=()
canary() {   # service model kernels expected [quantization]
  local service=$1 model=$2 kernels=$3 expected=$4 q=${5:-} s0=$SECONDS extra=() id phase
  local mem="--gpu-memory-utilization 0.2 --max-num-seqs 64"
  [ -n "$q" ] && mem="$mem --quantization $q"
  stamp "rollout: $kernels on $service ($model${q:+, $q}), expected $expected"
  id=$(timeout 600 python3 -m sits.control_plane.cli rollout start --service "$service" --kernels "$kernels" \
       --production-kernels triton-v1 --model "$model" --device cuda --policy "$WORK/policy.json" --store "$db" \
       --arg "$mem" --production-arg "$mem" --ready-timeout 300 | awk '{print $2; exit}')
  python3 - "$db" "$id" <<'EOF' > "$WORK/wait.txt"
import sys, time
from sits.control_plane.store.db import Store
db, rid = sys.argv[1:]
deadline = time.monotonic() + 420
while time.monotonic() < deadline:
    with Store(db) as s:
        r = s.get(rid)
        if r.phase.terminal or (r.phase.value == "progressing" and r.step >= 0 and s.checks(rid)):
            checks = s.checks(rid)
            gate = next((c for c in checks if c["verdict"].get("correctness")), None)
            cv = gate["verdict"]["correctness"] if gate else {}
            cf = cv.get("conformance") or {}
            f = (cf.get("failures") or [{}])[0]
            print(r.phase.value, cv.get("outcome", "-"), cf.get("outcome", "-"), ",".join(cf.get("judged_ops", [])) or "-",
                  f"{f['error']:.3g}>{f['allowed']:.3g}" if f.get("error") is not None else "-",
                  "before-traffic" if gate and gate["step"] < 0 else "-", sep="|")
            sys.exit(0)
    time.sleep(1)
print("timeout|-|-|-|-|-")
EOF
  IFS='|' read -r phase gate ops judged err when < "$WORK/wait.txt"
  # a good release that takes traffic has shown what it must: abort it so the next rollout starts from production
  [ "$phase" = progressing ] && python3 -m sits.control_plane.cli rollout abort "$id" --store "$db" >/dev/null
  python3 - "$db" "$id" <<'EOF'
import sys, time
from sits.control_plane.store.db import Store
for _ in range(240):
    with Store(sys.argv[1]) as s:
        if s.get(sys.argv[2]).phase.terminal:
            break
    time.sleep(0.5)
EOF
  local ok=no
  { [ "$expected" = wrong ] && [ "$phase" = rolled_back ] && [ "$ops" = fail ]; } && ok=yes
  { [ "$expected" = good ] && [ "$phase" = progressing ] && [ "$gate" = pass ]; } && ok=yes
  rows+=("$model${q:+ ($q)}|$kernels|$expected|$phase|$gate|$ops|$judged|$err|$when|$((SECONDS - s0))|$ok")
  stamp "  -> $phase, gate $gate, ops $ops ($judged $err, $when) in $((SECONDS - s0)) s: $ok"
}

if [[ ,$MODELS, == *,tiny,* ]]; then
  for k in bug-softmax-scale bug-context-off-by-one bug-rope-interleaved; do canary tiny "$tiny" $k wrong; done
  canary tiny "$tiny" triton-v1.1 good
  canary tiny-int8 "$tiny" bug-int8-per-tensor-scale wrong int8
fi
if [[ ,$MODELS, == *,llama,* ]]; then
  for k in bug-softmax-scale bug-context-off-by-one bug-rope-interleaved; do canary llama llama3-8b $k wrong; done
  canary llama llama3-8b triton-v1.1 good
  canary llama-int8 llama3-8b bug-int8-per-tensor-scale wrong int8
fi
grep -E "Traceback|ERROR" "$OUT/worker.log" | head -5
echo
echo "==== plugin releases through sits-control on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); $(( $(date +%s) - t0 )) s"
printf '%s\n' "model|set|expected|phase|gate|ops|judged|first failure|gate at|s|ok" "${rows[@]}" | python3 -c "
import sys
rows = [l.rstrip('\n').split('|') for l in sys.stdin]
w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
print('\n'.join('  '.join(c.ljust(x) for c, x in zip(r, w)) for r in rows))"
