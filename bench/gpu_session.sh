#!/usr/bin/env bash
# One GPU session: check and benchmark the engine on a CUDA machine, a short table last.
#
#   bench/gpu_session.sh tests     # the whole GPU suite: pytest -m gpu tests/engine tests/kernels
#   bench/gpu_session.sh serving   # bench/serving.py llama3-8b, 256 streams: offline vs served with the engine-core
#                                  # process vs served in-process (the baseline), all in this one run
#   bench/gpu_session.sh open-loop # bench/serving.py with the engine-core process: 32 closed-loop streams, then
#                                  # open-loop Poisson arrivals (SITS_SERVING_RATES, default 32,64,128; 256 requests
#                                  # a rate), once with bf16 weights (the baseline) and once with fp8 weights + FP8 KV
#                                  # pages, one kernel set (SITS_SERVING_KERNELS, default triton-v1.9), each server
#                                  # with half of SITS_OPEN_LOOP_BUDGET_S (default 540); the two tables last
#   bench/gpu_session.sh profile   # bench/profile_steps.py: kernel time by kind per throughput row (bf16 rows, then
#                                  # batch-1 with int8 weights in its own process)
#   bench/gpu_session.sh profile-sets  # bench/profile_steps.py once per kernel set (SITS_PROFILE_SETS, default
#                                  # triton-v1.21,triton-v1.22), each in a process of its own, with SITS_PROFILE_ARGS
#                                  # (default "--cases b256 --quantization fp8 --kv-cache-dtype fp8"): where two sets'
#                                  # steps differ, kernel by kind and host gaps side by side
#   bench/gpu_session.sh throughput  # bench/throughput.py: the offline rows (SITS_THROUGHPUT_ROWS)
#   bench/gpu_session.sh kv-fp8    # bench/throughput.py --kernels triton-v1.3 --kv-cache-dtype both: KV capacity in
#                                  # tokens and 256 x 2048/512 (SITS_KV_FP8_ROWS, default b256) with bf16 KV pages, then
#                                  # FP8 ones, each engine in a process of its own; the ratios last
#   bench/gpu_session.sh fp8       # bench/throughput.py --kernels triton-v1.5 (SITS_FP8_KERNELS): the bf16 rows, the
#                                  # same with fp8 weights (SITS_FP8_THROUGHPUT_ROWS), each engine in a process of its
#                                  # own, then fp8
#                                  # weights + FP8 KV pages (SITS_FP8_KV_ROWS, default decode1-fp8,b256-fp8); ratios last
#   bench/gpu_session.sh fused     # bench/throughput.py --rows decode1-int8,decode1-fp8,b32-int8 (SITS_FUSED_ROWS) with
#                                  # each of SITS_FUSED_SETS (default triton-v1.5,triton-v1.7: v1.7 fuses SiLU-and-mul
#                                  # into the gate/up projection; v1.6 into the down projection), each engine
#                                  # in a process of its own; the two tables last; SITS_FUSED_ARGS: more arguments
#                                  # (e.g. "--kv-cache-dtype fp8" with SITS_FUSED_ROWS=b256-fp8)
#   bench/gpu_session.sh fused-rows  # bench/fused_rows.py: v1.6's fused op against v1.5's two ops at the down
#                                  # projection by rows, and a sweep of launch configs with and without the prologue
#   bench/gpu_session.sh gemv-rows # bench/gemv_rows.py: triton-v1.9's GEMV against v1.8's linear at one row (int8,
#                                  # fp8, bf16 weights), a sweep of its launch configs and the read-only ceiling
#                                  # (SITS_GEMV_ARGS: more arguments, e.g. "--kinds int8 --no-sweep")
#   bench/gpu_session.sh norm-gemv-rows  # bench/norm_gemv_rows.py: triton-v1.10's norm in the batch-1 GEMV against
#                                  # v1.9's norm kernel then GEMV at the q/k/v and gate/up projections, by launch config
#   bench/gpu_session.sh pdl-chain # bench/pdl_chain.py: norm + GEMV kernels of 32 batch-1 layers in one CUDA graph
#                                  # with and without programmatic dependent launch (the kernels' PDL), same bits
#   bench/gpu_session.sh prologue-served  # bench/fused_prologue_served.py under CUDA MPS as the demo ran it
#                                  # (SITS_MPS=off: without): triton-v1.6's gate replay against served engines, per
#                                  # canary variant (A/A, eager, no piecewise graphs, no split-K); SITS_PROLOGUE_ARGS:
#                                  # more arguments (e.g. "--first c1 --variants no-engine-process --variant-concurrency 1")
#   bench/gpu_session.sh prologue-pattern  # bench/fused_prologue_pattern.py: the gate's request pattern through
#                                  # LLMEngine in-process (v1.5 control, then v1.6), with every weight fingerprinted
#   bench/gpu_session.sh int8      # the int8 throughput rows with triton-v1.2 (cold, then a restart on the same
#                                  # cache) and triton-v1.1, then bench/int8_rows.py (the int8 linear by row count:
#                                  # Triton vs dequantize + cuBLAS vs bf16 cuBLAS)
#   bench/gpu_session.sh fp8-rows  # bench/fp8_rows.py: the fp8 linear by row count (triton-v1.4's W8A8 vs v1.3's vs
#                                  # torch._scaled_mm vs bf16 cuBLAS) and a sweep of W8A8 GEMM tile configs
#   bench/gpu_session.sh fp8-attention  # bench/decode_attention_fp8.py: decode attention over FP8 pages (v1.3, v1.5,
#                                  # v1.8 and a sweep of its launch configs) against the bf16 kernel, 256 and 32 x
#                                  # 2,304 tokens (its counters: bench/decode_attention_ncu.py under ncu, by hand)
#   bench/gpu_session.sh attention-bound  # bench/decode_attention_bound.py: read probes with the FP8 kernels' walk
#                                  # (engine's rows, head-major, bf16) against the kernels, 1-2 warps a program
#   bench/gpu_session.sh attention-batch  # bench/decode_attention_batch.py: FP8 decode attention at 8-256 sequences,
#                                  # every launch config and split count against v1.13, v1.14 and v1.15's pick
#                                  # (SITS_ATTENTION_BATCH_ARGS: more arguments, e.g. "--no-sweep")
#   bench/gpu_session.sh fp8-fronts  # bench/fp8_fronts.py: the norm + q/k/v and norm + gate/up + SiLU-and-mul fronts
#                                  # with fp8 weights at 64-2,048 rows, triton-v1.15, v1.16 (SiLU-and-mul in the GEMM's
#                                  # epilogue) and v1.17 (the norm quantizes) in one CUDA graph a set (SITS_FRONTS_ARGS)
#   bench/gpu_session.sh prefill-fp8  # bench/prefill_attention_fp8.py: prefill attention over FP8 pages, triton-v1.17's
#                                  # pointer-gather kernel against v1.18's TMA one, v1.19's with the scores
#                                  # transposed and v1.20's pages dequantized once (and v1.1's on bf16 pages), llama3-8b's
#                                  # heads at 1 x 2,048, 8 x 2,048 and 2 x 8,192 tokens (SITS_PREFILL_FP8_ARGS)
#   bench/gpu_session.sh conformance  # bench/conformance.py: the correctness gate's op-level conformance on every wrong
#                                  # and good release, trained tiny model and llama3-8b
#   bench/gpu_session.sh tensor-parallel  # bench/tensor_parallel.py: llama3-8b with tensor_parallel_size 1 and 2
#                                  # (SITS_TP_SIZES), needs >= 2 GPUs (bench/tensor_parallel.sh checks first)
#   bench/gpu_session.sh all       # tests and serving, in that order; or a comma-separated list: profile,serving
#   bench/gpu_session.sh dry-run   # the same steps on CPU (tiny model, TRITON_INTERPRET=1, small shapes)
#
# Wheels that the machine lacks may lie in .whl/ (installed into /tmp/site first). Logs go to $OUT when set (more
# than 8 files there: versions.txt and the newest logs as they are, the rest in others.tar.gz, bench/bundle_out.sh),
# else ./gpu-session-logs. dry-run uses $PYTHON (e.g. .venv/bin/python) and no wheels. SITS_TESTS_K: a pytest -k
# expression for the tests phase. Budgets (seconds): SITS_TESTS_BUDGET_S (default 480), SITS_INT8_BUDGET_S (420), SITS_SERVING_BUDGET_S (default 540), SITS_PROFILE_BUDGET_S (default 300), SITS_THROUGHPUT_BUDGET_S (default 300), SITS_KV_FP8_BUDGET_S (default 540). Profile:
# SITS_PROFILE_CASES (default decode1,ttft,b32,b256,arrivals), SITS_PROFILE_INT8=0 skips the int8 batch-1 profile, SITS_PROFILE_PIECEWISE=0 the one without piecewise graphs. Serving: SITS_PREFILL_CAPS
# (--prefill-caps, default none), SITS_ENGINE_PROCESS (on, off or both, default both), SITS_PIECEWISE_COMPARE=1 (--piecewise-compare: a server with --no-piecewise-graphs too), SITS_GC_COMPARE=1
# (--gc-compare).
set -uo pipefail
cd "$(dirname "$0")/.."
phase="${1:-all}"
out="${OUT:-gpu-session-logs}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
py="${PYTHON:-python3}"

if [[ "$phase" != dry-run ]] && compgen -G ".whl/*.whl" >/dev/null; then
  # only what the machine lacks: a carried copy of something it has would shadow its own version
  mapfile -t wheels < <("$py" bench/missing_wheels.py .whl)
  if ((${#wheels[@]})); then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "${wheels[@]}" \
      || { echo "wheel install failed"; exit 1; }
  fi
  echo "installed ${#wheels[@]} carried wheels into /tmp/site (the rest the machine has)"
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

summary=()
versions() {
  "$py" - <<'EOF'
import platform, torch, triton
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
print(f"python {platform.python_version()}, torch {torch.__version__}, triton {triton.__version__}, {gpu}")
EOF
}

run_tests() {
  local budget="${SITS_TESTS_BUDGET_S:-480}" args=(-m gpu tests/engine tests/kernels)
  [[ -n "${SITS_TESTS_K:-}" ]] && args+=(-k "$SITS_TESTS_K")   # a subset, e.g. what a change touched
  if [[ "$phase" == dry-run ]]; then   # the GPU suite's CPU twins: the tests that hold sets to their flags
    args=(tests/kernels/test_example_sets.py tests/kernels/test_registry.py tests/engine/test_gpu.py)
  fi
  # two workers, one file each at a time: the Triton kernel files (compile-bound) run beside the engine files
  local par=()
  if [[ "$phase" != dry-run ]] && "$py" -c "import xdist" 2>/dev/null; then par=(-n 2 --dist loadfile); fi
  echo "== GPU tests (budget ${budget} s): pytest ${par[*]} ${args[*]}"
  local t0=$SECONDS
  timeout -k 10 "$budget" "$py" -m pytest -p no:cacheprovider -v -rfE --timeout 300 --durations=30 "${par[@]}" \
    "${args[@]}" \
    2>&1 | tee "$out/gpu-tests.log"
  local rc=${PIPESTATUS[0]}
  local line
  line=$(grep -E "^[0-9]+ (passed|failed)|^=+ .*(passed|failed|error).* =+$" "$out/gpu-tests.log" | tail -1)
  summary+=("GPU tests | rc $rc | $((SECONDS - t0)) s | ${line:-no summary (rc 124: over budget)}")
}

run_serving() {
  local budget="${SITS_SERVING_BUDGET_S:-540}"
  # SITS_SERVING_KERNELS (default triton-v1.1) and SITS_SERVING_ARGS (e.g. "--quantization fp8 --kv-cache-dtype fp8")
  local more=()
  read -ra more <<< "${SITS_SERVING_ARGS:-}"
  local args=(--model llama3-8b --device cuda --kernels "${SITS_SERVING_KERNELS:-triton-v1.1}" "${more[@]}"
              --clients 256 --max-tokens 128 --repeat 1
              --rates "${SITS_SERVING_RATES:-32,64,128}" --open-requests 256
              --prefill-caps "${SITS_PREFILL_CAPS:-none}" --engine-process "${SITS_ENGINE_PROCESS:-both}"
              ${SITS_GC_COMPARE:+--gc-compare} ${SITS_PIECEWISE_COMPARE:+--piecewise-compare})
  if [[ "$phase" == dry-run ]]; then
    args=(--model tiny --device cpu --kernels torch --clients 32 --max-tokens 16 --repeat 1 --rates 4,8
          --open-requests 16)
  fi
  echo "== serving (budget ${budget} s): bench/serving.py ${args[*]}"
  local t0=$SECONDS
  timeout -k 10 "$budget" "$py" bench/serving.py "${args[@]}" 2>&1 | tee "$out/serving.log"
  local rc=${PIPESTATUS[0]}
  timeout 60 "$py" bench/core_transport.py --steps 1000 2>&1 | tee "$out/transport.log"
  summary+=("serving | rc $rc | $((SECONDS - t0)) s | table in serving.log")
}

run_open_loop() {
  local budget="${SITS_OPEN_LOOP_BUDGET_S:-540}" t0=$SECONDS rc=0 left name i=0
  local args=(--model llama3-8b --device cuda --kernels "${SITS_SERVING_KERNELS:-triton-v1.9}" --clients 32
              --max-tokens 128 --repeat 1 --rates "${SITS_SERVING_RATES:-32,64,128}" --open-requests 256
              --engine-process on)
  if [[ "$phase" == dry-run ]]; then
    args=(--model tiny --device cpu --kernels torch --clients 4 --max-tokens 8 --repeat 1 --rates 4,8
          --open-requests 8 --engine-process on)
  fi
  for name in bf16 fp8; do
    local more=()
    [[ $name == fp8 ]] && more=(--quantization fp8 --kv-cache-dtype fp8)
    left=$(( (budget - (SECONDS - t0)) / (2 - i) ))   # the first half of the budget, then what is left
    i=$((i + 1))
    echo "== open loop, $name (budget ${left} s): bench/serving.py ${args[*]} ${more[*]}"
    timeout -k 10 "$left" "$py" bench/serving.py "${args[@]}" "${more[@]}" 2>&1 | tee "$out/open-loop-$name.log"
    [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
  done
  summary+=("open loop | rc $rc | $((SECONDS - t0)) s | tables in open-loop-bf16.log, open-loop-fp8.log")
}

run_profile() {
  local budget="${SITS_PROFILE_BUDGET_S:-300}" t0=$SECONDS rc=0
  local bf16=(--cases "${SITS_PROFILE_CASES:-decode1,ttft,b32,b256,arrivals}") int8=(--quantization int8 --cases decode1)
  if [[ "$phase" == dry-run ]]; then bf16=(--smoke); int8=(--smoke --cases decode1); fi
  local dev=cuda; [[ "$phase" == dry-run ]] && dev=cpu
  echo "== profile: bench/step_inputs.py (an arrival step's inputs, packed vs per field, the stream busy)"
  timeout -k 10 60 "$py" bench/step_inputs.py --device "$dev" 2>&1 | tee "$out/profile.log"
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
  echo "== profile (budget ${budget} s): bench/profile_steps.py ${bf16[*]}; then ${int8[*]}"
  timeout -k 10 "$budget" "$py" bench/profile_steps.py "${bf16[@]}" --json "$out/profile-bf16.json" 2>&1 \
    | tee -a "$out/profile.log"
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
  local left=$((budget - (SECONDS - t0)))
  if [[ "${SITS_PROFILE_INT8:-1}" == 0 ]]; then
    :
  elif ((left > 30)); then
    timeout -k 10 "$left" "$py" bench/profile_steps.py "${int8[@]}" --json "$out/profile-int8.json" 2>&1 \
      | tee -a "$out/profile.log"
    [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
  else
    rc=1; echo "no time left for the int8 profile"
  fi
  # the arrival steps again without piecewise graphs (engine/execution/piecewise_graphs.py, on by default): the
  # eager baseline
  local pw=(--cases arrivals,ttft --no-piecewise-graphs)
  [[ "$phase" == dry-run ]] && pw=(--smoke --cases arrivals --no-piecewise-graphs)
  left=$((budget - (SECONDS - t0)))
  if [[ "${SITS_PROFILE_PIECEWISE:-1}" == 0 ]]; then
    :
  elif ((left > 30)); then
    echo "== profile: bench/profile_steps.py ${pw[*]}"
    timeout -k 10 "$left" "$py" bench/profile_steps.py "${pw[@]}" --json "$out/profile-eager-prefill.json" 2>&1 \
      | tee -a "$out/profile.log"
    [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
  else
    rc=1; echo "no time left for the profile without piecewise graphs"
  fi
  summary+=("profile | rc $rc | $((SECONDS - t0)) s | tables in profile.log")
}

run_profile_sets() {
  local budget="${SITS_PROFILE_BUDGET_S:-300}" t0=$SECONDS rc=0 left ks extra sets
  read -ra extra <<< "${SITS_PROFILE_ARGS:---cases b256 --quantization fp8 --kv-cache-dtype fp8}"
  IFS=, read -ra sets <<< "${SITS_PROFILE_SETS:-triton-v1.21,triton-v1.22}"
  local run=("$py")
  [[ "$phase" == dry-run ]] && { extra=(--smoke --cases b256); sets=(torch); }
  for ks in "${sets[@]}"; do
    left=$((budget - (SECONDS - t0)))
    ((left > 30)) || { rc=1; echo "no time left for the profile of $ks"; break; }
    echo "== profile ($ks, budget ${left} s): bench/profile_steps.py --kernels $ks ${extra[*]}"
    timeout -k 10 "$left" "${run[@]}" bench/profile_steps.py --kernels "$ks" "${extra[@]}" \
      --json "$out/profile-$ks.json" 2>&1 | tee "$out/profile-$ks.log"
    [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
  done
  summary+=("profile sets | rc $rc | $((SECONDS - t0)) s | tables in profile-<set>.log")
}

run_throughput() {
  local budget="${SITS_THROUGHPUT_BUDGET_S:-300}" t0=$SECONDS args=(--rows "${SITS_THROUGHPUT_ROWS:-ttft,decode1,b32,b256,decode1-int8,b32-int8}")
  [[ "$phase" == dry-run ]] && args=(--smoke --rows ttft,decode1,b32)
  echo "== throughput (budget ${budget} s): bench/throughput.py ${args[*]}"
  timeout -k 10 "$budget" "$py" bench/throughput.py "${args[@]}" --json "$out/throughput.json" 2>&1 \
    | tee "$out/throughput.log"
  summary+=("throughput | rc ${PIPESTATUS[0]} | $((SECONDS - t0)) s | table in throughput.log")
}

run_kv_fp8() {
  # the same rows with bf16 KV pages and with FP8 ones (kernels/kv_fp8.py): capacity from the warm-up rows
  local budget="${SITS_KV_FP8_BUDGET_S:-540}" t0=$SECONDS
  local args=(--kernels triton-v1.3 --rows "${SITS_KV_FP8_ROWS:-b256}" --kv-cache-dtype both)
  [[ "$phase" == dry-run ]] && args=(--smoke --rows b32 --kv-cache-dtype both)
  echo "== FP8 KV cache (budget ${budget} s): bench/throughput.py ${args[*]}"
  timeout -k 10 "$budget" "$py" bench/throughput.py "${args[@]}" --json "$out/throughput-kv-fp8.json" 2>&1 \
    | tee "$out/kv-fp8.log"
  summary+=("kv-fp8 | rc ${PIPESTATUS[0]} | $((SECONDS - t0)) s | table and ratios in kv-fp8.log")
}

run_fp8() {
  local budget="${SITS_FP8_BUDGET_S:-480}" t0=$SECONDS rc=0 left
  local rows="${SITS_FP8_THROUGHPUT_ROWS:-ttft,decode1,b32,b256,ttft-fp8,decode1-fp8,b32-fp8,b256-fp8}"
  local kv_rows="${SITS_FP8_KV_ROWS:-decode1-fp8,b256-fp8}" extra=(--kernels "${SITS_FP8_KERNELS:-triton-v1.5}")
  [[ "$phase" == dry-run ]] && { rows=decode1,decode1-fp8; kv_rows=decode1-fp8; extra=(--smoke); }
  echo "== fp8 (budget ${budget} s): bench/throughput.py ${extra[*]} --rows $rows"
  timeout -k 10 "$budget" "$py" bench/throughput.py "${extra[@]}" --rows "$rows" --json "$out/throughput-fp8.json" \
    2>&1 | tee "$out/fp8.log"
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
  left=$((budget - (SECONDS - t0)))
  echo "== fp8 + FP8 KV (budget ${left} s): bench/throughput.py ${extra[*]} --rows $kv_rows --kv-cache-dtype fp8"
  timeout -k 10 "$left" "$py" bench/throughput.py "${extra[@]}" --rows "$kv_rows" --kv-cache-dtype fp8 \
    --json "$out/throughput-fp8-fp8kv.json" 2>&1 | tee "$out/fp8-fp8kv.log"
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
  summary+=("fp8 | rc $rc | $((SECONDS - t0)) s | tables in fp8.log, fp8-fp8kv.log")
}

run_fused() {
  local budget="${SITS_FUSED_BUDGET_S:-540}" t0=$SECONDS rc=0 left ks extra
  local rows="${SITS_FUSED_ROWS:-decode1-int8,decode1-fp8,b32-int8}"
  read -ra extra <<< "${SITS_FUSED_ARGS:-}"   # more bench/throughput.py arguments, e.g. --kv-cache-dtype fp8
  local run=("$py")
  # on CPU the Triton sets run under the interpreter (~90 s a set for the tiny model's smoke rows)
  [[ "$phase" == dry-run ]] && { rows=decode1-int8; extra=(--smoke); run=(env TRITON_INTERPRET=1 "$py"); }
  local sets
  IFS=, read -ra sets <<< "${SITS_FUSED_SETS:-triton-v1.5,triton-v1.7}"
  for ks in "${sets[@]}"; do
    left=$((budget - (SECONDS - t0)))
    echo "== fused ($ks, budget ${left} s): bench/throughput.py --kernels $ks --rows $rows ${extra[*]}"
    timeout -k 10 "$left" "${run[@]}" bench/throughput.py --kernels "$ks" --rows "$rows" "${extra[@]}" \
      --json "$out/throughput-$ks.json" 2>&1 | tee "$out/fused-$ks.log"
    [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
  done
  summary+=("fused | rc $rc | $((SECONDS - t0)) s | tables in fused-<set>.log")
}

run_int8() {
  local budget="${SITS_INT8_BUDGET_S:-420}" t0=$SECONDS rc=0 left cache
  if [[ "$phase" == dry-run ]]; then
    summary+=("int8 | skipped | 0 s | bench/int8_rows.py needs a GPU"); return
  fi
  cache=$(mktemp -d)   # an empty Triton cache: the first warm-up is cold whatever ran on this machine before
  echo "== int8: bench/throughput.py --kernels triton-v1.2 --rows decode1-int8,b32-int8,b32, cold (TRITON_CACHE_DIR=$cache)"
  TRITON_CACHE_DIR="$cache" timeout -k 10 $((budget - 120)) "$py" bench/throughput.py --kernels triton-v1.2 \
    --rows decode1-int8,b32-int8,b32 --json "$out/throughput-int8.json" 2>&1 | tee "$out/int8.log"
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
  echo "== int8: a restart on the same cache: bench/throughput.py --kernels triton-v1.2 --rows decode1-int8"
  left=$((budget - (SECONDS - t0)))
  TRITON_CACHE_DIR="$cache" timeout -k 10 "$left" "$py" bench/throughput.py --kernels triton-v1.2 --rows decode1-int8 \
    --json "$out/throughput-int8-restart.json" 2>&1 | tee -a "$out/int8.log"
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
  echo "== int8: bench/throughput.py --kernels triton-v1.1 --rows b32-int8 (the Triton kernel at every row count)"
  left=$((budget - (SECONDS - t0)))
  TRITON_CACHE_DIR="$cache" timeout -k 10 "$left" "$py" bench/throughput.py --kernels triton-v1.1 --rows b32-int8 \
    --json "$out/throughput-int8-v1.1.json" 2>&1 | tee -a "$out/int8.log"
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
  echo "== int8: bench/int8_rows.py"
  left=$((budget - (SECONDS - t0)))
  timeout -k 10 "$left" "$py" bench/int8_rows.py --json "$out/int8-rows.json" 2>&1 | tee -a "$out/int8.log"
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
  summary+=("int8 | rc $rc | $((SECONDS - t0)) s | tables in int8.log")
}

# one GPU-only benchmark script: NAME (the summary's), SCRIPT, STEM (its .json and .log in $out), BUDGET (s), WHAT
# (the heading), NEEDS (why dry-run skips it)
gpu_bench() {
  local name="$1" script="$2" stem="$3" budget="$4" what="$5" needs="$6" t0=$SECONDS extra
  read -ra extra <<< "${7:-}"   # more arguments for the script (a phase's SITS_*_ARGS), split at spaces
  if [[ "$phase" == dry-run ]]; then
    summary+=("$name | skipped | 0 s | $script needs $needs"); return
  fi
  echo "== $what (budget ${budget} s): $script ${extra[*]}"
  timeout -k 10 "$budget" "$py" "$script" "${extra[@]}" --json "$out/$stem.json" 2>&1 | tee "$out/$stem.log"
  summary+=("$name | rc ${PIPESTATUS[0]} | $((SECONDS - t0)) s | tables in $stem.log")
}

run_fp8_rows() {
  gpu_bench "fp8 rows" bench/fp8_rows.py fp8-rows "${SITS_FP8_ROWS_BUDGET_S:-240}" "fp8 linear by rows" \
    "a GPU with fp8 tensor cores"
}

run_fused_rows() {
  gpu_bench "fused rows" bench/fused_rows.py fused-rows "${SITS_FUSED_ROWS_BUDGET_S:-300}" \
    "fused SiLU-and-mul (v1.6 prologue, v1.7 epilogue) by rows" "a GPU"
}

run_gemv_rows() {
  local budget="${SITS_GEMV_BUDGET_S:-330}" t0=$SECONDS
  if [[ "$phase" == dry-run ]]; then
    summary+=("gemv rows | skipped | 0 s | bench/gemv_rows.py needs a GPU"); return
  fi
  echo "== triton-v1.9's GEMV by weight shape (budget ${budget} s): bench/gemv_rows.py"
  # the sweep stops 60 s before the budget, so the table always prints
  timeout -k 10 "$budget" "$py" bench/gemv_rows.py --budget-s $((budget - 60)) --json "$out/gemv-rows.json" \
    ${SITS_GEMV_ARGS:-} 2>&1 | tee "$out/gemv-rows.log"
  summary+=("gemv rows | rc ${PIPESTATUS[0]} | $((SECONDS - t0)) s | tables in gemv-rows.log")
}

run_norm_gemv_rows() {
  gpu_bench "norm gemv rows" bench/norm_gemv_rows.py norm-gemv-rows "${SITS_NORM_GEMV_BUDGET_S:-240}" \
    "triton-v1.10's norm in the GEMV against v1.9's two ops" "a GPU"
}

run_pdl_chain() {
  gpu_bench "pdl chain" bench/pdl_chain.py pdl-chain "${SITS_PDL_BUDGET_S:-240}" \
    "a batch-1 layer chain with and without programmatic dependent launch" "a GPU with PDL (sm_90+)"
}

run_prologue_served() {
  # the product's gate replay against a triton-v1.5 baseline and a triton-v1.6 canary engine (llama3-8b int8), under
  # CUDA MPS as bench/gpu_demo.sh prologue ran them, then per canary variant
  if [[ "$phase" == dry-run ]]; then
    summary+=("prologue served | skipped | 0 s | bench/fused_prologue_served.py needs a GPU (on CPU: --device cpu)")
    return
  fi
  source bench/mps.sh
  mps_start "$out"
  echo "== engines share the GPU by: $SHARING"
  local budget="${SITS_PROLOGUE_BUDGET_S:-540}" t0=$SECONDS
  echo "== triton-v1.6's gate replay against served engines (budget ${budget} s): bench/fused_prologue_served.py"
  # the script skips a canary restart that would not finish 40 s before the budget, so its table always prints
  timeout -k 10 "$budget" "$py" bench/fused_prologue_served.py --budget-s $((budget - 40)) \
    --json "$out/prologue-served.json" ${SITS_PROLOGUE_ARGS:-} 2>&1 | tee "$out/prologue-served.log"
  summary+=("prologue served | rc ${PIPESTATUS[0]} | $((SECONDS - t0)) s | table in prologue-served.log")
  mps_stop "$out"
}

run_prologue_pattern() {
  gpu_bench "prologue pattern" bench/fused_prologue_pattern.py prologue-pattern "${SITS_PROLOGUE_BUDGET_S:-480}" \
    "triton-v1.6 under the gate's request pattern in-process, weights fingerprinted" "a GPU (llama3-8b)"
}

run_fp8_attention() {
  gpu_bench "fp8 attention" bench/decode_attention_fp8.py decode-attention-fp8 "${SITS_FP8_ATTENTION_BUDGET_S:-420}" \
    "FP8 decode attention" "a GPU with fp8 conversion"
}

run_attention_bound() {
  gpu_bench "attention bound" bench/decode_attention_bound.py decode-attention-bound \
    "${SITS_ATTENTION_BOUND_BUDGET_S:-420}" "what bounds FP8 decode attention (read probes and kernels)" \
    "a GPU with fp8 conversion"
}

run_attention_batch() {
  # SITS_ATTENTION_BATCH_ARGS: more arguments (e.g. "--no-sweep", "--batches 96,192")
  local name="attention batch" budget="${SITS_ATTENTION_BATCH_BUDGET_S:-300}" t0=$SECONDS extra
  read -ra extra <<< "${SITS_ATTENTION_BATCH_ARGS:-}"
  if [[ "$phase" == dry-run ]]; then
    echo "== $name (dry run): TRITON_INTERPRET=1 bench/decode_attention_batch.py --smoke"
    TRITON_INTERPRET=1 "$py" bench/decode_attention_batch.py --smoke 2>&1 | tee "$out/decode-attention-batch.log"
    summary+=("$name | rc ${PIPESTATUS[0]} | $((SECONDS - t0)) s | smoke in decode-attention-batch.log"); return
  fi
  echo "== FP8 decode attention by batch size (budget ${budget} s): bench/decode_attention_batch.py ${extra[*]}"
  timeout -k 10 "$budget" "$py" bench/decode_attention_batch.py "${extra[@]}" \
    --json "$out/decode-attention-batch.json" 2>&1 | tee "$out/decode-attention-batch.log"
  summary+=("$name | rc ${PIPESTATUS[0]} | $((SECONDS - t0)) s | tables in decode-attention-batch.log")
}

run_prefill_fp8() {
  gpu_bench "prefill fp8" bench/prefill_attention_fp8.py prefill-attention-fp8 "${SITS_PREFILL_FP8_BUDGET_S:-240}" \
    "prefill attention over FP8 pages: v1.17's pointer-gather kernel, v1.18's TMA kernel, v1.19's transposed one, v1.20's dequantized pages" "a Hopper GPU" \
    "${SITS_PREFILL_FP8_ARGS:-}"
}

run_fp8_fronts() {
  gpu_bench "fp8 fronts" bench/fp8_fronts.py fp8-fronts "${SITS_FRONTS_BUDGET_S:-300}" \
    "the norm + projection fronts with fp8 weights by set (v1.15, v1.16's epilogue, v1.17's quantizing norm)" \
    "a GPU with fp8 tensor cores" "${SITS_FRONTS_ARGS:-}"
}

run_conformance() {
  # the correctness gate's op-level conformance: every wrong release caught, every good one passing, on the tiny
  # model trained here (cached in $SITS_CACHE_DIR) and on llama3-8b (bench/conformance.py)
  local budget="${SITS_CONFORMANCE_BUDGET_S:-480}" t0=$SECONDS rc=0 tiny
  tiny="${SITS_CACHE_DIR:-/tmp/sits-cache}/tiny-trained-cuda"
  local dev=(--device cuda --tiny "$tiny")
  if [[ "$phase" == dry-run ]]; then dev=(--device cpu); else
    echo "== training the tiny model (bench/train_tiny.py --reuse, $tiny)"
    timeout 120 "$py" bench/train_tiny.py --out "$tiny" --device cuda --reuse --log-every 200 2>&1 | tail -2
  fi
  echo "== conformance (budget ${budget} s): bench/conformance.py ${dev[*]}"
  timeout -k 10 "$budget" "$py" bench/conformance.py "${dev[@]}" --json "$out/conformance.json" 2>&1 \
    | tee "$out/conformance.log"
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
  summary+=("conformance | rc $rc | $((SECONDS - t0)) s | table in conformance.log")
}

run_tensor_parallel() {
  local budget="${SITS_TP_BUDGET_S:-540}" t0=$SECONDS args=(--sizes "${SITS_TP_SIZES:-1,2}")
  [[ "$phase" == dry-run ]] && args=(--smoke)
  echo "== tensor parallelism (budget ${budget} s): bench/tensor_parallel.py ${args[*]}"
  timeout -k 10 "$budget" "$py" bench/tensor_parallel.py "${args[@]}" --json "$out/tensor-parallel.json" 2>&1 \
    | tee "$out/tensor-parallel.log"
  summary+=("tensor parallel | rc ${PIPESTATUS[0]} | $((SECONDS - t0)) s | table in tensor-parallel.log")
}

versions | tee "$out/versions.txt"
[[ "$phase" == dry-run ]] && export TRITON_INTERPRET=1
case "$phase" in
  all) phases=(tests serving) ;;
  dry-run) phases=(tests serving open-loop profile profile-sets throughput kv-fp8 fp8 fused attention-batch tensor-parallel) ;;
  *) IFS=, read -ra phases <<< "$phase" ;;
esac
for ph in "${phases[@]}"; do
  case "$ph" in
    tests) run_tests ;;
    serving) run_serving ;;
    profile) run_profile ;;
    profile-sets) run_profile_sets ;;
    throughput) run_throughput ;;
    kv-fp8) run_kv_fp8 ;;
    int8) run_int8 ;;
    fused) run_fused ;;
    fp8) run_fp8 ;;
    fp8-rows) run_fp8_rows ;;
    fused-rows) run_fused_rows ;;
    gemv-rows) run_gemv_rows ;;
    norm-gemv-rows) run_norm_gemv_rows ;;
    pdl-chain) run_pdl_chain ;;
    open-loop) run_open_loop ;;
    prologue-served) run_prologue_served ;;
    prologue-pattern) run_prologue_pattern ;;
    fp8-attention) run_fp8_attention ;;
    attention-bound) run_attention_bound ;;
    attention-batch) run_attention_batch ;;
    fp8-fronts) run_fp8_fronts ;;
    prefill-fp8) run_prefill_fp8 ;;
    conformance) run_conformance ;;
    tensor-parallel) run_tensor_parallel ;;
    *) echo "usage: $0 tests|serving|profile|profile-sets|throughput|kv-fp8|fp8|fused|fused-rows|gemv-rows|norm-gemv-rows|pdl-chain|open-loop|prologue-served|prologue-pattern|int8|fp8-rows|fp8-attention|attention-bound|attention-batch|fp8-fronts|prefill-fp8|conformance|tensor-parallel|all|dry-run (or a comma-separated list)"
       exit 2 ;;
  esac
done

fused_logs=()
for f in "$out"/fused-triton-*.log; do [[ -f "$f" ]] && fused_logs+=("$(basename "$f" .log)"); done
echo
echo "== session summary ($(cat "$out/versions.txt"))"
for s in "${summary[@]}"; do echo "| $s |"; done
if [[ -f "$out/throughput.log" ]]; then
  sed -n '/^row /,$p' "$out/throughput.log"
fi
if [[ -f "$out/decode-attention-fp8.log" ]]; then
  sed -n '/^| batch x ctx/,$p' "$out/decode-attention-fp8.log"
fi
if [[ -f "$out/decode-attention-bound.log" ]]; then
  sed -n '/^| what | us/,$p' "$out/decode-attention-bound.log"
fi
if [[ -f "$out/gemv-rows.log" ]]; then
  sed -n '/^sweep, the five best/,$p' "$out/gemv-rows.log"
fi
for name in bf16 fp8; do
  [[ -f "$out/open-loop-$name.log" ]] && { echo "-- open loop, $name"; sed -n '/^open loop: /,$p' "$out/open-loop-$name.log"; }
done
if [[ -f "$out/pdl-chain.log" ]]; then
  sed -n '/one row through/,$p' "$out/pdl-chain.log"
fi
if [[ -f "$out/fused-rows.log" ]]; then
  sed -n '/^autotune winners/,$p' "$out/fused-rows.log"
fi
if [[ -f "$out/prologue-pattern.log" ]]; then
  sed -n '/: the gate.s request pattern in-process/,$p' "$out/prologue-pattern.log"
fi
if [[ -f "$out/prologue-served.log" ]]; then
  sed -n '/: the product.s gate replay/,$p' "$out/prologue-served.log"
fi
if [[ -f "$out/fp8-rows.log" ]]; then
  sed -n '/^W8A8 GEMM tile/,$p' "$out/fp8-rows.log"
fi
for f in fp8 fp8-fp8kv "${fused_logs[@]}"; do
  [[ -f "$out/$f.log" ]] && { echo "-- $f.log"; sed -n '/^row /,$p' "$out/$f.log"; }
done
if [[ -f "$out/kv-fp8.log" ]]; then
  sed -n '/^row /,$p' "$out/kv-fp8.log"
fi
if [[ -f "$out/profile.log" ]]; then
  grep -E "^(### |\| )" "$out/profile.log"
fi
for f in "$out"/profile-*.log; do
  [[ -f "$f" ]] && { echo "-- $(basename "$f")"; grep -E "^(### |\| )" "$f"; }
done
if [[ -f "$out/tensor-parallel.log" ]]; then
  sed -n '/^row /,$p' "$out/tensor-parallel.log"
fi
if [[ -f "$out/serving.log" ]]; then
  sed -n '/^| /,$p' "$out/serving.log" | tail -30
fi
# on the device ($OUT set): at most 8 files come back; the versions and the phases' logs as they are, the JSON
# results and the rest in others.tar.gz where there are more
if [[ -n "${OUT:-}" ]]; then
  mapfile -t logs < <(cd "$out" && ls -t -- *.log 2>/dev/null | head -6)
  bash bench/bundle_out.sh "$out" versions.txt "${logs[@]}"
fi
