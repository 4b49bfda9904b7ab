"""What `sits-control demo` runs on each device: the canaries (scenarios), the demo policy, the traffic and the engine
flags. CPU (the default, unchanged): the tiny model and the torch example sets. GPU (`--device cuda`): Triton sets
of a real release line on one GPU shared by every engine (control_plane/demo/runner.py runs either)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from sits.control_plane.analysis import ERROR_RATE, ITL, REQUEST_LATENCY, LowTrafficPolicy, MetricCheck, Policy
from sits.control_plane.demo.traffic import LengthDist, TrafficMix
from sits.control_plane.rollout import Phase


@dataclass(slots=True, frozen=True)
class Scenario:
    name: str
    kernels: str | None             # the canary's kernel set; None: production's own (a release of engine flags)
    expected: Phase
    what: str
    canary_args: tuple[str, ...] = ()   # `sits-engine serve` flags only the canary gets, after every engine's

    def canary_kernels(self, production: str) -> str:
        return self.kernels or production

    def canary(self, production: str) -> str:
        """What the canary runs, as the output names it: its set and the flags it adds."""
        return " ".join((self.canary_kernels(production), *self.canary_args))


# an FP8 KV cache as a release of its own: the production's kernels, e4m3 pages on the canary only
KV_FP8 = ("--kv-cache-dtype", "fp8")


SCENARIOS = {s.name: s for s in (
    Scenario("slow", "torch-slow-attn", Phase.ROLLED_BACK,
             "a genuinely SLOWER kernel set (correct, unfused per-head attention): the P90/P99 deltas must roll it back"),
    Scenario("wrong", "torch-wrong-rope", Phase.ROLLED_BACK,
             "a WRONG kernel set (as fast, RoPE without the llama3 scaling): the correctness gate must roll it back"),
    Scenario("good", "torch", Phase.SUCCEEDED,
             "a GOOD release (production's own kernels, an equivalent set): it must be promoted"),
    Scenario("kvfp8", None, Phase.SUCCEEDED,
             "an ENGINE FLAG release (production's own kernels, an FP8 KV cache on the canary: e4m3 pages, twice "
             "the tokens in the same memory): the gate judges its answers, the checks its speed; expected to be "
             "promoted", canary_args=KV_FP8))}

GPU_SCENARIOS = {s.name: s for s in (
    Scenario("slow", "triton-v1-unsplit", Phase.ROLLED_BACK,
             "a genuinely SLOWER Triton release (correct; decode attention one program per sequence, no split "
             "over the context): the latency deltas must roll it back"),
    Scenario("wrong", "triton-v1-floor-pages", Phase.ROLLED_BACK,
             "a WRONG Triton release (as fast; decode attention drops the last, partly filled KV page): the "
             "correctness gate must roll it back before it gets traffic"),
    Scenario("good", "triton-v1.1", Phase.SUCCEEDED,
             "a GOOD Triton release (TMA page-tiled prefill attention on Hopper): it must be promoted"),
    Scenario("aa", "triton-v1", Phase.SUCCEEDED,
             "an A/A run (production's own kernels as the canary): any rollback is a false one"),
    # the fp8 releases: run with --production-kernels triton-v1.3 --engine-arg '--quantization fp8 --kv-cache-dtype
    # fp8' so that all three engines serve fp8 weights and FP8 KV pages (bench/gpu_demo.sh: SITS_DEMO_ARGS)
    Scenario("w8a8", "triton-v1.4", Phase.SUCCEEDED,
             "an fp8 release (fp8 weights on the fp8 tensor cores by row count: weight-only, torch._scaled_mm, the "
             "W8A8 GEMM): expected to be promoted; the correctness gate judges its e4m3 activations"),
    Scenario("f16", "triton-v1.5", Phase.SUCCEEDED,
             "an fp8 release (e4m3 weights and KV pages read through fp16 dots): expected to be promoted"),
    Scenario("fused", "triton-v1.7", Phase.SUCCEEDED,
             "a fused release (SiLU-and-mul in the gate/up projection's epilogue with int8/fp8 weights at decode "
             "sizes): expected to be promoted; with --production-kernels triton-v1.5 the gate judges only the fused op"),
    Scenario("staged", "triton-v1.8", Phase.SUCCEEDED,
             "an fp8 attention release (decode attention over FP8 pages converting each tile where it is loaded, a "
             "sequence's kv heads side by side): expected to be promoted; with --production-kernels triton-v1.7 the "
             "gate judges only paged_decode_attention"),
    Scenario("gemv", "triton-v1.9", Phase.SUCCEEDED,
             "a batch-1 release (int8/fp8 and bf16 weights times one row on a GEMV without tensor cores, the fused "
             "gate/up projection too; offline +12-21 % tok/s at batch 1 on an H100): expected to be promoted; with "
             "--production-kernels triton-v1.8 the gate judges only linear and linear_silu_and_mul. With --model "
             "llama3-8b int8 at --rate 3 on an H100 it was promoted with ITL unchanged (-0.2 %): beside two other "
             "engines under MPS the GPU's bandwidth is shared"),
    Scenario("normfused", "triton-v1.10", Phase.SUCCEEDED,
             "a fused-norm release (the RMSNorm and its residual add inside the batch-1 GEMVs of the q/k/v and "
             "gate/up projections: two launches fewer a decode layer, the same values to one bf16 rounding): "
             "expected to be promoted; with --production-kernels triton-v1.9 the gate judges only the two fused "
             "norm ops. Offline on the H200 it measured no faster than v1.9 at batch 1; here on the H200 (tiny "
             "trained model) it was promoted after 26 checks"),
    Scenario("bcast", "triton-v1.11", Phase.SUCCEEDED,
             "a batch-1 GEMV release (x loaded as broadcast tiles in the weight tile's layout, 8-bit weights 8 "
             "bytes a load: no shared-memory shuffle or barrier in the main loop; v1.9's values to fp32 rounding): "
             "expected to be promoted; with --production-kernels triton-v1.9 the gate judges only linear and "
             "linear_silu_and_mul. Offline on the H200 no faster than v1.9; here promoted after 13 checks"),
    Scenario("pdl", "triton-v1.12", Phase.SUCCEEDED,
             "a launch release (v1.9's batch-1 GEMVs and RMSNorms launched with programmatic dependent launch on "
             "sm_90+: each starts while the kernel before it finishes; the same values bit for bit): expected to "
             "be promoted; with --production-kernels triton-v1.9 the gate judges linear, linear_silu_and_mul, "
             "rms_norm and fused_add_rms_norm. On the H100 (tiny trained model) promoted after 20 checks"),
    Scenario("pdlall", "triton-v1.13", Phase.SUCCEEDED,
             "a launch release (every kernel of a batch-1 decode layer launched with programmatic dependent launch "
             "on sm_90+: v1.12 plus RoPE and the KV write, decode attention and its split merge; the same values "
             "bit for bit): expected to be promoted; with --production-kernels triton-v1.9 the gate judges those "
             "six ops. On the H100 (tiny trained model) promoted after 24 checks"),
    Scenario("onewarp", "triton-v1.14", Phase.SUCCEEDED,
             "an fp8 attention release (decode attention over FP8 pages at one warp a program on 32-token tiles "
             "instead of four warps on 128; the same kernel, values within a few bf16 ulps): expected to be "
             "promoted; with --production-kernels triton-v1.13 --engine-arg '--kv-cache-dtype fp8' the gate judges "
             "only paged_decode_attention. On the H100 (tiny trained model, FP8 pages in every engine) promoted "
             "after 10 checks"),
    Scenario("waves", "triton-v1.15", Phase.SUCCEEDED,
             "an fp8 attention release (decode attention over FP8 pages at v1.14's one-warp config or v1.8's "
             "four-warp one, whichever fills more of the GPU's waves of programs a launch; each call's values are "
             "v1.14's or v1.13's bit for bit): expected to be promoted; with --production-kernels triton-v1.14 "
             "--engine-arg '--kv-cache-dtype fp8' the gate judges only paged_decode_attention. On the H100 (tiny "
             "trained model, FP8 pages in every engine) promoted after 19 checks"),
    Scenario("epilogue", "triton-v1.16", Phase.SUCCEEDED,
             "an fp8 prefill release (the gate/up projection past 512 rows with the SiLU-and-mul in the W8A8 GEMM's "
             "epilogue; v1.15's two ops' values to bf16 rounding): expected to be promoted; with "
             "--production-kernels triton-v1.15 --engine-arg '--quantization fp8 --kv-cache-dtype fp8' the gate "
             "judges only linear_silu_and_mul. On the H100 (tiny trained model, fp8 weights and FP8 pages in every "
             "engine) promoted after 10 checks"),
    Scenario("normquant", "triton-v1.17", Phase.SUCCEEDED,
             "an fp8 release (the norms in front of the q/k/v and gate/up projections quantize their own output for "
             "the W8A8 GEMM past 32 rows; v1.16's values bit for bit): expected to be promoted; with "
             "--production-kernels triton-v1.16 --engine-arg '--quantization fp8 --kv-cache-dtype fp8' the gate "
             "judges only the two fused norm ops. On the H100 promoted after 12 checks"),
    Scenario("tmafp8", "triton-v1.18", Phase.SUCCEEDED,
             "an fp8 attention release (prefill attention over FP8 pages through the tensor-memory accelerator, "
             "128 queries a program; v1.17's values to fp16 rounding): expected to be promoted; with "
             "--production-kernels triton-v1.17 --engine-arg '--kv-cache-dtype fp8' the gate judges only "
             "prefill_attention. On the H100 promoted after 14 checks (its kernel is 10 % slower than v1.17's at "
             "llama3-8b's shapes, which the tiny model's short prompts do not show)"),
    Scenario("transposed", "triton-v1.19", Phase.SUCCEEDED,
             "an fp8 attention release (v1.18's TMA prefill attention over FP8 pages with the scores transposed: "
             "the converted K and V tiles stay the tensor-core dots' register operands, one tile a step back "
             "through shared memory instead of two; v1.18's values to fp16 rounding): expected to be promoted; "
             "with --production-kernels triton-v1.17 --engine-arg '--quantization fp8 --kv-cache-dtype fp8' the "
             "gate judges only prefill_attention. On the H100 promoted after 20 checks (its kernel is 10 % slower "
             "than v1.18's and 20 % slower than v1.17's at llama3-8b's shapes, which the tiny model's short prompts "
             "do not show)"),
    Scenario("dequant", "triton-v1.20", Phase.SUCCEEDED,
             "an fp8 attention release (prefill attention over FP8 pages dequantized once a call into a bf16 "
             "scratch cache, then triton-v1.1's kernel over it: each key converted once instead of once per query "
             "tile; the torch reference's dequantized values, so v1.17's to bf16 rounding): expected to be "
             "promoted; with --production-kernels triton-v1.17 --engine-arg '--quantization fp8 --kv-cache-dtype "
             "fp8' the gate judges only prefill_attention. On the H100 promoted after 27 checks, measured slower on "
             "the tiny model (ITL P90 +5.2 % [+1.7, +15.9], under the +12.5 % ship line): its host-bound steps pay "
             "the second launch a prefill layer; at llama3-8b's prompt lengths it is faster"),
    Scenario("bywork", "triton-v1.21", Phase.SUCCEEDED,
             "an fp8 attention release (v1.20's dequantized FP8 pages only for prefill calls with enough attention "
             "work to pay for the second launch, v1.17's kernel below that; each call's values are v1.20's or "
             "v1.17's bit for bit): expected to be promoted; with --production-kernels triton-v1.20 --engine-arg "
             "'--quantization fp8 --kv-cache-dtype fp8' the gate judges only prefill_attention, and the tiny "
             "model's prompts run v1.17's kernel, without v1.20's second launch: its latency should be no worse "
             "than production's (v1.20 measured ITL P90 +5.2 % against v1.17 there). On the H100 promoted after 19 "
             "checks, ITL P90 +1.8 % [-15.6, +22.7]"),
    Scenario("tmagemm", "triton-v1.23", Phase.SUCCEEDED,
             "an fp8 linear release (the q/k/v, o and down projections of prefill steps on a persistent GEMM fed by "
             "TMA descriptors, from 2^32 multiply-adds a call, through the fast launcher; the pointer kernel's bits; "
             "the gate/up projection v1.21's): expected to be promoted; with --model llama3-8b --production-kernels "
             "triton-v1.21 --engine-arg '--quantization fp8 --kv-cache-dtype fp8' the gate judges linear and "
             "add_rms_norm_linear past 512 rows on the TMA kernel. The tiny model's calls stay below the threshold: "
             "there it is v1.21. Measured on the H100 against v1.21: TTFT -1.9 %, 256 x 2048/512 +0.9 %; the "
             "canary not yet run on a GPU"),
    Scenario("pairedgemm", "triton-v1.24", Phase.SUCCEEDED,
             "an fp8 linear release (v1.23's persistent TMA GEMM for every projection of prefill steps, the gate/up "
             "projection with SiLU-and-mul too, its gate and up rows paired in one accumulator; the pointer "
             "kernel's bits): expected to be promoted; with --model llama3-8b --production-kernels triton-v1.21 "
             "--engine-arg '--quantization fp8 --kv-cache-dtype fp8' the gate judges the four linear ops past 512 "
             "rows on the TMA kernel. The tiny model's calls stay below the threshold: there it is v1.21. Measured on "
             "the H100 against v1.23: TTFT 29.6 ms (v1.23 31.3 at best), 256 x 2048/512 +1.2 %; promoted in a GPU "
             "canary against v1.21 (H100, those flags, rate 3) after 47 checks, ITL P90 +1.0 % [-2.8, +5.4]"),
    Scenario("batchedgemm", "triton-v1.25", Phase.SUCCEEDED,
             "an fp8 linear release (v1.24 whose gate/up projection with SiLU-and-mul takes the paired TMA GEMM "
             "from 33 rows too, where v1.21's op runs torch._scaled_mm and then SiLU-and-mul; other values than "
             "cuBLASLt's there, 3.9e-3 apart at 256 rows): expected to be promoted; with --model llama3-8b "
             "--production-kernels triton-v1.24 --engine-arg '--quantization fp8 --kv-cache-dtype fp8' the gate "
             "judges the gate/up ops at 33-512 rows on the TMA kernel (decode batches of 33+ sequences, prefill "
             "steps of 40-512 tokens). The tiny model's calls stay below the threshold: there it is v1.21. Measured "
             "on the H100 against v1.24 in the same call: 256 x 2048/512 +1.2 %, a 256-sequence decode step 21.8 "
             "against 22.3 ms; promoted in a GPU canary against v1.24 (H100, those flags, rate 3) after 41 checks, "
             "ITL P90 +0.1 % [-4.6, +5.0]"),
    Scenario("kindot", "triton-v1.26", Phase.SUCCEEDED,
             "an fp8 attention release (v1.25 whose decode attention over FP8 pages converts the key tile in the "
             "q.k dot's operand layout instead of staging it as fp16 through shared memory; v1.25's values within "
             "a few bf16 ulps): expected to be promoted; with --model llama3-8b --production-kernels triton-v1.25 "
             "--engine-arg '--quantization fp8 --kv-cache-dtype fp8' the gate judges paged_decode_attention on FP8 "
             "pages. Measured on the H100: a layer's FP8 decode attention 14-18 % faster at 64-256 sequences, 256 x "
             "2048/512 +15.3 % against v1.25 in the same call; promoted in a GPU canary against v1.25 (H100, those "
             "flags, rate 3) after 39 checks, ITL P90 +1.7 % [-1.9, +5.4]"),
    Scenario("prologue", "triton-v1.6", Phase.ROLLED_BACK,
             "a SLOWER fused release (SiLU-and-mul in the down projection's prologue: 3-5x slower than v1.5's two "
             "ops at llama3-8b's decode shapes with int8, +52 % a batch-1 step on the H200): with --model llama3-8b "
             "--engine-arg '--quantization int8' --production-kernels triton-v1.5 it should be rolled back on "
             "latency. Not yet seen: at 10 req/s under CUDA MPS (H100) its ITL P90 moved +13 %, between the "
             "policy's ship and limit lines, and it was promoted (its earlier rollback by the answer-level gate was "
             "an engine fault both variants shared, since mended; BENCHMARKS.md \"Fused decode layers\")"),
    Scenario("kvfp8", None, Phase.SUCCEEDED,
             "an ENGINE FLAG release (production's own kernels, an FP8 KV cache on the canary: e4m3 pages, twice "
             "the tokens in the same memory; production must read them: --production-kernels triton-v1.3 or "
             "later): the gate judges every op on FP8 pages and the answers; expected to be promoted",
             canary_args=KV_FP8))}


# from this live rate on (requests/s through the router) the checked step's samples come mostly from users: the slow
# set saturates under them and its P99 clears +50 % from the first check that may decide
BUSY_RATE = 10.0


def demo_policy(rate: float = 25.0) -> Policy:
    """Short steps for a few-minute demo on 2 CPU cores, sequential statistics (analysis/sequential.py). One checked
    step at 50 %. Request latency is gated at P99 with two boundaries: a change below +50 % ships, +150 % must not:
    two identical engine processes sharing 2 busy cores differ by ~20 % at P99 for minutes at a time, and their
    per-window P99s spread by ~0.37 in log (a window holds ~100 requests per variant, ~6 s), so an A/A's upper bound
    falls below +150 % from the sixth window on (below +100 % only after ~15: a 4-minute demo could not wait); the slow
    set (~1.7x slower in decode, ~2.7x in prefill) sits at +300-600 %, its lower bound above +50 % from the sixth.
    P90 is shown (every check's deltas), not gated: with both gated, whichever left its boundary first decided. Low-traffic mode is on: at a thin live rate
    (--rate 0.5) replayed requests supply the samples (4 in flight per variant); a pass still needs 200 live canary
    requests. Below BUSY_RATE the checks also gate inter-token latency at P99 (+100 %): replayed load does not
    saturate the slow set, whose ITL P99 is +180..+330 % there (BENCHMARKS.md "Low-traffic mode")."""
    checks = (MetricCheck(REQUEST_LATENCY, quantile=0.99, max_rel_delta=1.50, ship_rel_delta=0.50),
              MetricCheck(ERROR_RATE, max_abs_delta=0.02))
    if rate < BUSY_RATE:
        checks += (MetricCheck(ITL, quantile=0.99, max_rel_delta=1.00),)
    # sequential statistics: 5 s windows (P99: 100 requests per variant, one beyond the quantile), 6 before any
    # decision, one sequence over the rollout; the boundaries sit above what two identical engines on two shared
    # cores differ by (P99 ~20 %, P90 up to ~17 %), far below the slow set (+70 % and more)
    return Policy(steps=(50, 100), check_interval_s=5.0, warmup_s=3.0, checks=checks,
                  min_samples=200, min_tail_samples=2, window_s=5.0, window_tail_samples=1, min_windows=6,
                  max_duration_s=600.0, on_max_duration="rollback", ready_timeout_s=300.0, min_error_samples=100,
                  low_traffic=LowTrafficPolicy(enabled=True, max_rps=30.0, max_requests_per_step=4000,
                                               max_requests_per_rollout=8000, concurrency=4, min_live_requests=200))


def mps_running() -> bool:
    """A CUDA MPS control daemon is where CUDA clients look for it (CUDA_MPS_PIPE_DIRECTORY, default
    /tmp/nvidia-mps): engines started now share the GPU's SMs at once rather than taking turns."""
    return (Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps") / "control").exists()


def gpu_policy(mps: bool = True) -> Policy:
    """The demo policy on one GPU that three engines share; the gates depend on how they share it (measured on an
    H200, BENCHMARKS.md "GPU demo (H200)" and "Sequential statistics").

    Under CUDA MPS (the engines' kernels run side by side) the slow release (triton-v1-unsplit) moved ITL P90 by
    +119..+160 % and request-latency P90 by +70..+122 %, while A/A runs and the good release spread ITL P90 over
    -10..+13 %; ITL P50 (host jitter between processes, not a kernel's speed) is not gated. Hence ITL P90 +25 % (ship
    +12.5 %), ITL P99.9 +50 %, request P90 +25 %. Time-slicing (no MPS daemon) hides most of the slow set's decode
    attention behind the other engines' turns: ITL P50 and P90 at +10 % there.

    Why the ITL tail gate is P99.9 and not P99: this traffic's inter-token times have two modes, plain decode steps
    (~0.5-1.5 ms) and the steps that carry a 1,200-token prompt's prefill chunk (4-14 ms); the slow mode held 0.45-3.8 %
    of the tokens in the 13 stored MPS rollouts, and 6 of their step P99s fell between the modes (1.6-4.3 ms). On such
    a cliff a window's P99 jumps 3-5x with the prefill chunks it happened to catch, the windows scatter (log-ratio sd
    0.48 in triton-v1.8's canary against 0.11 at P90), and the check held that canary and triton-v1.7's undecided for
    minutes. P99.9 lies inside the slow mode in every one of those runs (sd 0.29 on triton-v1.8's windows): it gates
    the prefill-carrying steps' speed. `bench/tail_cliff.py` replays a store's windows and simulates the two modes
    (BENCHMARKS.md "A tail quantile on a cliff"). On the H200 with it, the canaries of triton-v1.7 and v1.8 were
    promoted in 12 checks each (2026-12-05; ITL P99.9 +2.1 % [-7.2, +12.3] and -2.0 % [-13.1, +12.3]).

    Sequential statistics with 5 s windows and 8 of them before a decision (every window holds thousands of
    inter-token times); a checked step at 50 %, a readiness deadline for cold CUDA warm-ups."""
    itl = ((MetricCheck(ITL, quantile=0.90, max_rel_delta=0.25),) if mps else
           (MetricCheck(ITL, quantile=0.90, max_rel_delta=0.10), MetricCheck(ITL, quantile=0.50, max_rel_delta=0.10)))
    return Policy(steps=(50, 100), check_interval_s=5.0, warmup_s=5.0,
                  checks=(*itl,
                          MetricCheck(ITL, quantile=0.999, max_rel_delta=0.50),
                          MetricCheck(REQUEST_LATENCY, quantile=0.90, max_rel_delta=0.25),
                          MetricCheck(ERROR_RATE, max_abs_delta=0.02)),
                  min_samples=100, min_tail_samples=2, window_s=5.0, min_windows=8, max_duration_s=600.0,
                  on_max_duration="rollback", ready_timeout_s=600.0, min_error_samples=100)


# chat-like traffic for the tiny model: prompts ~64 tokens (long tail to 400), answers ~6 (to 32), 40 % streamed;
# all on /v1/completions (each route's percentiles are compared on their own: a second route halves the samples)
DEMO_MIX = TrafficMix(LengthDist(64, 0.6, 16, 400), LengthDist(6, 0.6, 1, 32), stream_fraction=0.4,
                      chat_fraction=0.0)
# on the GPU: long contexts (within the tiny model's 4096 positions; decode attention's share of a step grows with
# them) and longer answers, so that decode steps dominate; every request streamed (client-side TTFT and ITL)
GPU_MIX = TrafficMix(LengthDist(1200, 0.4, 256, 3500), LengthDist(48, 0.5, 8, 128), stream_fraction=1.0,
                     chat_fraction=0.0)


@dataclass(slots=True, frozen=True)
class Profile:
    device: str                       # "cpu" | "cuda": every engine's `--device`
    scenarios: Mapping[str, Scenario]
    production_kernels: str
    model: str                        # what the engines serve unless --model says otherwise
    rate: float                       # requests/s through the router unless --rate says otherwise
    threads: int
    mix: TrafficMix
    engine_args: tuple[str, ...]      # every engine's extra `sits-engine serve` flags (the GPU memory split)

    def policy(self, rate: float) -> Policy:
        return demo_policy(rate) if self.device == "cpu" else gpu_policy(mps=mps_running())


CPU = Profile("cpu", SCENARIOS, "torch", "tiny", 25.0, 12, DEMO_MIX, ())
# up to four engines at once on the GPU: production, baseline and canary, and a promotion's new production started
# before the old one stops; each takes a fifth of the GPU's memory (weights, activations, KV cache)
GPU_MEMORY_SHARE = 0.2
GPU = Profile("cuda", GPU_SCENARIOS, "triton-v1", "tiny-trained", 40.0, 64, GPU_MIX,
              ("--gpu-memory-utilization", str(GPU_MEMORY_SHARE), "--max-num-seqs", "64"))
PROFILES = {p.device: p for p in (CPU, GPU)}
