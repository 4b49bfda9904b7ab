"""The built-in kernel sets. Every set is registered here, in one place.

A set that reuses most of another is made with `KernelSet.derive` (see registry.py); that is how a new version of one
op is released for canarying.
"""
from __future__ import annotations

from sits.kernels import decode_attention_regressions as _decode_bad
from sits.kernels import linear as _linear
from sits.kernels import linear_dequant as _linear_dequant
from sits.kernels import linear_fp8_f16 as _linear_fp8_f16
from sits.kernels import linear_gemv as _linear_gemv
from sits.kernels import norm_linear as _norm_linear
from sits.kernels import norm_w8a8 as _norm_w8a8
from sits.kernels import linear_silu_and_mul as _linear_silu_and_mul
from sits.kernels import linear_w8a8 as _linear_w8a8
from sits.kernels import linear_w8a8_silu as _linear_w8a8_silu
from sits.kernels import linear_w8a8_tma as _linear_w8a8_tma
from sits.kernels import paged_decode_attention as _decode
from sits.kernels import paged_decode_attention_fp8 as _decode_fp8
from sits.kernels import prefill_attention as _prefill
from sits.kernels import prefill_attention_fp8 as _prefill_fp8
from sits.kernels import prefill_attention_fp8_dequant as _prefill_fp8_dequant
from sits.kernels import prefill_attention_fp8_tma as _prefill_fp8_tma
from sits.kernels import prefill_attention_ref as _prefill_ref
from sits.kernels import rms_norm as _rms
from sits.kernels import rope_and_cache as _rope
from sits.kernels import silu_and_mul as _silu
from sits.kernels import silu_and_mul_linear as _silu_and_mul_linear
from sits.kernels.registry import KernelSet, register_kernel_set

TORCH = register_kernel_set(KernelSet(
    name="torch",
    version="1.0.0",
    devices=("cpu", "cuda"),
    description="reference implementations in plain PyTorch (fp32 softmax/norm statistics); runs anywhere",
    kv_cache_dtypes=("auto", "fp8"),
    rms_norm=_rms.rms_norm_ref,
    fused_add_rms_norm=_rms.fused_add_rms_norm_ref,
    silu_and_mul=_silu.silu_and_mul_ref,
    rope_and_cache=_rope.rope_and_cache_ref,
    prefill_attention=_prefill_ref.prefill_attention_ref,
    paged_decode_attention=_decode.paged_decode_attention_ref,
    linear=_linear.linear_ref,
))

TRITON_V1 = register_kernel_set(TORCH.derive(
    "triton-v1", "1.0.0",
    devices=("cuda", "cpu"),
    graph_safe=True,
    description="Triton: paged varlen flash prefill, split-KV GQA decode, fused RoPE+KV write, fused add+RMSNorm, "
                "SiLU-and-mul, int8/fp8 weight matmul (plain weights via cuBLAS); CPU only under TRITON_INTERPRET=1",
    rms_norm=_rms.rms_norm,
    fused_add_rms_norm=_rms.fused_add_rms_norm,
    silu_and_mul=_silu.silu_and_mul,
    rope_and_cache=_rope.rope_and_cache,
    prefill_attention=_prefill.prefill_attention,
    paged_decode_attention=_decode.paged_decode_attention,
    linear=_linear.linear,
))

TRITON_V1_1 = register_kernel_set(TRITON_V1.derive(
    "triton-v1.1", "1.1.0",
    description="triton-v1 with TMA page-tiled prefill attention on Hopper+ (fp16/bf16; elsewhere the v1 kernel)",
    prefill_attention=_prefill.prefill_attention_tma,
))

TRITON_V1_2 = register_kernel_set(TRITON_V1_1.derive(
    "triton-v1.2", "1.2.0",
    description="triton-v1.1 with weight-only int8/fp8 linears of 512+ rows (prefill) dequantized once per call into "
                "a scratch buffer and multiplied by cuBLAS (fp8 on fp8 tensor cores as before); other calls as v1.1",
    linear=_linear_dequant.linear_dequant_many_rows,
))

TRITON_V1_3 = register_kernel_set(TRITON_V1_2.derive(
    "triton-v1.3", "1.3.0",
    description="triton-v1.2 that also takes an FP8 KV cache (--kv-cache-dtype fp8): RoPE+KV write quantizes each "
                "token's kv-head vector to e4m3 with an fp32 scale, prefill and decode attention read e4m3 pages and "
                "dequantize in-kernel; plain pages run v1.2's kernels unchanged",
    kv_cache_dtypes=("auto", "fp8"),
    rope_and_cache=_rope.rope_and_cache_fp8kv,
    prefill_attention=_prefill_fp8.prefill_attention_fp8kv,
    paged_decode_attention=_decode_fp8.paged_decode_attention_fp8kv,
))

TRITON_V1_4 = register_kernel_set(TRITON_V1_3.derive(
    "triton-v1.4", "1.4.0",
    description="triton-v1.3 with fp8 weights (--quantization fp8) routed by row count as measured on the H200: up to "
                "32 rows v1.3's weight-only kernel, up to 512 activations to e4m3 per row then torch._scaled_mm, more "
                "the W8A8 GEMM tuned for prefill; int8 and plain weights as v1.3",
    linear=_linear_w8a8.linear_w8a8,
))

TRITON_V1_5 = register_kernel_set(TRITON_V1_4.derive(
    "triton-v1.5", "1.5.0",
    description="triton-v1.4 with e4m3 read through fp16 dots in a bf16 model (one conversion per e4m3 pair "
                "instead of two per element): attention over FP8 KV pages (--kv-cache-dtype fp8), q lowered by a "
                "power of two into fp16's range, decode attention at its launch config measured on the H200, and fp8 "
                "weights (--quantization fp8) times up to 16 rows; plain pages and other calls as v1.4",
    kv_cache_dtypes=("auto", "fp8"),
    linear=_linear_fp8_f16.linear_fp8_f16,
    prefill_attention=_prefill_fp8.prefill_attention_fp8kv_f16,
    paged_decode_attention=_decode_fp8.paged_decode_attention_fp8kv_f16,
))

TRITON_V1_6 = register_kernel_set(TRITON_V1_5.derive(
    "triton-v1.6", "1.6.0",
    description="triton-v1.5 with the MLP's SiLU-and-mul folded into the down projection (fused op "
                "silu_and_mul_linear): with int8/fp8 weights at decode sizes (up to 32 rows) the weight-only kernel "
                "computes silu(gate) * up as it loads each x tile, one launch fewer per layer; otherwise v1.5's two "
                "ops. Measured SLOWER (3-5x v1.5's two ops at llama3-8b's down projection with int8; served at 10 "
                "req/s beside other engines on an H100, ITL P90 +12.5 %): a regression for a canary to judge",
    silu_and_mul_linear=_silu_and_mul_linear.silu_and_mul_linear,
))

TRITON_V1_7 = register_kernel_set(TRITON_V1_5.derive(
    "triton-v1.7", "1.7.0",
    description="triton-v1.5 with the MLP's SiLU-and-mul folded into the gate/up projection's epilogue (fused op "
                "linear_silu_and_mul): with int8/fp8 weights at decode sizes (up to 32 rows) the weight-only kernel "
                "pairs gate and up rows in each output tile and writes silu(gate) * up, one launch and one [T, 2I] "
                "round trip fewer per layer; otherwise v1.5's two ops",
    linear_silu_and_mul=_linear_silu_and_mul.linear_silu_and_mul,
))

TRITON_V1_8 = register_kernel_set(TRITON_V1_7.derive(
    "triton-v1.8", "1.8.0",
    description="triton-v1.7 whose decode attention over FP8 KV pages (--kv-cache-dtype fp8) converts each e4m3 tile "
                "to fp16 where its load left it, not in the dots' operand layouts (no byte-wise shared-memory "
                "gathers of the value tile), at its own launch config measured on the H200; v1.5's values up to fp32 "
                "rounding (4e-5 relative on the H200); plain pages and other calls as v1.7",
    kv_cache_dtypes=("auto", "fp8"),
    paged_decode_attention=_decode_fp8.paged_decode_attention_fp8kv_staged,
))

TRITON_V1_9 = register_kernel_set(TRITON_V1_8.derive(
    "triton-v1.9", "1.9.0",
    description="triton-v1.8 with one row (batch-1 decode) times int8, fp8 or plain bf16/fp16 weights on a GEMV "
                "without tensor cores (kernels/linear_gemv.py): weight tiles loaded straight into registers, "
                "converted exactly and summed in fp32 on the CUDA cores, no shared memory, no split-K; the fused "
                "gate/up projection likewise, with v1.7's SiLU-and-mul epilogue; more rows as v1.8. Measured on an "
                "H100: batch-1 decode bf16 158 -> 179 tok/s, int8 245 -> 274, fp8 229 -> 277",
    linear=_linear_gemv.linear_gemv,
    linear_silu_and_mul=_linear_gemv.linear_silu_and_mul_gemv,
))

TRITON_V1_10 = register_kernel_set(TRITON_V1_9.derive(
    "triton-v1.10", "1.10.0",
    description="triton-v1.9 with the RMSNorm and its residual add folded into the batch-1 GEMVs that read them "
                "(fused ops add_rms_norm_linear, add_rms_norm_linear_silu_and_mul; kernels/norm_linear.py): the "
                "q/k/v and gate/up projections form h = x + residual as they load x, sum h^2 on the way and scale "
                "their dot products by 1/rms(h) once, so a decode layer launches two kernels fewer (64 a llama3-8b "
                "step); more rows as v1.9's norm then linear. Measured on the H200: NO FASTER than v1.9 at batch 1 "
                "(bf16 236 against 239 tok/s, int8 333 against 331, fp8 341 against 348): a release for the canary "
                "to judge, not a speed-up",
    add_rms_norm_linear=_norm_linear.add_rms_norm_linear,
    add_rms_norm_linear_silu_and_mul=_norm_linear.add_rms_norm_linear_silu_and_mul,
))

TRITON_V1_11 = register_kernel_set(TRITON_V1_9.derive(
    "triton-v1.11", "1.11.0",
    description="triton-v1.9 whose batch-1 GEMV loads x as broadcast tiles in the weight tile's layout (and int8/fp8 "
                "weights 8 bytes a load): no shared-memory shuffle and no barrier in its main loop "
                "(kernels/linear_gemv.py X_BCAST, NARROW_W); the same fp32 products and sums, v1.9's values to fp32 "
                "rounding; more rows as v1.9. Measured on the H200: NO FASTER than v1.9 at batch 1 (bf16 238-239 "
                "against 237-238 tok/s, fp8 349-350 against 346; each candidate 0-0.6 us a call): a release for the "
                "canary to judge, not a speed-up",
    linear=_linear_gemv.linear_gemv_bcast,
    linear_silu_and_mul=_linear_gemv.linear_silu_and_mul_gemv_bcast,
))

TRITON_V1_12 = register_kernel_set(TRITON_V1_9.derive(
    "triton-v1.12", "1.12.0",
    description="triton-v1.9 whose batch-1 GEMVs and RMSNorms launch with programmatic dependent launch on sm_90+ "
                "GPUs (Hopper and later): each starts while the kernel before it finishes, sends its first weight "
                "tile to the L2, waits for the earlier kernel's writes (griddepcontrol.wait) before it reads them "
                "and lets the next kernel launch once its main loop is done; the same kernels and values as v1.9, "
                "bit for bit; on other devices v1.9's launches. On an H100, batch-1 decode with fp8 weights 3.58 -> "
                "3.52 ms a step, bf16 unchanged (5.56): a step had only 0.13 ms between its kernels to win",
    linear=_linear_gemv.linear_gemv_pdl,
    linear_silu_and_mul=_linear_gemv.linear_silu_and_mul_gemv_pdl,
    rms_norm=_rms.rms_norm_pdl,
    fused_add_rms_norm=_rms.fused_add_rms_norm_pdl,
))

TRITON_V1_13 = register_kernel_set(TRITON_V1_12.derive(
    "triton-v1.13", "1.13.0",
    description="triton-v1.12 with RoPE and the KV write, decode attention and its split merge also launched with "
                "programmatic dependent launch on sm_90+ (plain and FP8 pages): every kernel of a batch-1 decode "
                "layer may start while the one before it finishes, each waiting for the earlier kernel's writes "
                "before it reads or writes anything; the same kernels and values as v1.9, bit for bit; on other "
                "devices v1.9's launches. On an H100 as v1.12 at batch 1 (fp8 weights 3.52 ms a step, bf16 5.56) "
                "and as v1.9 at 32 and 256 sequences",
    kv_cache_dtypes=("auto", "fp8"),
    rope_and_cache=_rope.rope_and_cache_pdl,
    paged_decode_attention=_decode_fp8.paged_decode_attention_pdl,
))

TRITON_V1_14 = register_kernel_set(TRITON_V1_13.derive(
    "triton-v1.14", "1.14.0",
    description="triton-v1.13 whose decode attention over FP8 KV pages (--kv-cache-dtype fp8) runs one warp a "
                "program on 32-token tiles instead of four warps on 128: the same kernel and arithmetic (v1.8's "
                "values within a few bf16 ulps); plain pages and other calls as v1.13. Why: read alone with the "
                "kernel's walk the FP8 pages stream at the copy rate, so the four-warp programs' on-chip path, not "
                "DRAM, bounds the kernel (bench/decode_attention_bound.py). Measured on an H100: 568 -> 522 us a "
                "layer at 256 x 2,304 tokens, a decode step at 256 sequences 24.27 -> 22.60 ms, 32 x 2048/512 +1 %, "
                "but 256 x 2048/512 0.7 % SLOWER (its prefill-carrying and tail steps lose more than its full-batch "
                "decode steps gain): a release for the canary to judge",
    kv_cache_dtypes=("auto", "fp8"),
    paged_decode_attention=_decode_fp8.paged_decode_attention_one_warp,
))

TRITON_V1_15 = register_kernel_set(TRITON_V1_14.derive(
    "triton-v1.15", "1.15.0",
    description="triton-v1.14 whose decode attention over FP8 KV pages (--kv-cache-dtype fp8) picks its launch config "
                "a call: one warp a program (v1.14's) unless v1.8's four warps fill more of the GPU's waves of "
                "programs (programs an SM from the compiled kernels and the device's limits); each call's values are "
                "v1.14's or v1.13's. Why: on an H100 one warp won at 16-128 and 256 sequences but lost 7-21 % at "
                "96-224, where its programs left much of a last wave idle (bench/decode_attention_batch.py); 256 x "
                "2048/512 with fp8 weights and FP8 pages 3.2 % faster than v1.14 (1.50x bf16). Plain pages and "
                "other calls as v1.14",
    kv_cache_dtypes=("auto", "fp8"),
    paged_decode_attention=_decode_fp8.paged_decode_attention_by_waves,
))

TRITON_V1_16 = register_kernel_set(TRITON_V1_15.derive(
    "triton-v1.16", "1.16.0",
    description="triton-v1.15 with the MLP's SiLU-and-mul in the W8A8 GEMM's epilogue at prefill sizes (fused op "
                "linear_silu_and_mul, kernels/linear_w8a8_silu.py): fp8 weights (--quantization fp8) times more "
                "than 512 rows multiply each x tile by gate and up rows in one program and write silu(gate) * up, "
                "one launch and the [T, 2I] bf16 round trip fewer a layer (llama3-8b at 2,048 tokens: 293 MB of "
                "traffic); both products rounded to bf16 first, as v1.15's two ops round them. Fewer rows, other "
                "weights and GPUs without fp8 tensor cores as v1.15. On an H100: the same bits as v1.15 at llama3-8b's "
                "shapes; gate/up at 2,048 rows 491 against 507 us; 256 x 2048/512 with fp8 weights and FP8 pages "
                "5,599 against 5,578 tok/s (+0.4 %, one machine)",
    linear_silu_and_mul=_linear_w8a8_silu.linear_silu_and_mul_w8a8,
))

TRITON_V1_17 = register_kernel_set(TRITON_V1_16.derive(
    "triton-v1.17", "1.17.0",
    description="triton-v1.16 whose RMSNorms in front of the q/k/v and gate/up projections quantize their own output "
                "for the W8A8 GEMM (fused ops add_rms_norm_linear, add_rms_norm_linear_silu_and_mul; "
                "kernels/norm_w8a8.py): fp8 weights (--quantization fp8) times more than 32 rows -- decode of 33+ "
                "sequences, prefill -- get e4m3 rows and their scales from the norm's own program instead of a bf16 "
                "[T, H] that a quantization kernel reads back: two launches and two [T, H] round trips fewer a layer "
                "(llama3-8b at 2,048 tokens: 2.1 GB of traffic a step); the same bytes, so v1.16's values bit for "
                "bit. Fewer rows, other weights and GPUs without fp8 tensor cores as v1.16. On an H100: the same bits; "
                "the q/k/v front 7-10 % faster at 64-2,048 rows; 256 x 2048/512 with fp8 weights and FP8 pages 5,661 "
                "tok/s against v1.15's 5,578 (+1.5 %; 1.52x bf16, one machine)",
    add_rms_norm_linear=_norm_w8a8.add_rms_norm_linear_w8a8,
    add_rms_norm_linear_silu_and_mul=_norm_w8a8.add_rms_norm_linear_silu_and_mul_w8a8,
))

TRITON_V1_18 = register_kernel_set(TRITON_V1_17.derive(
    "triton-v1.18", "1.18.0",
    description="triton-v1.17 whose prefill attention over FP8 KV pages (--kv-cache-dtype fp8) reads the e4m3 pages "
                "through the tensor-memory accelerator as triton-v1.1 reads bf16 pages (kernels/"
                "prefill_attention_fp8_tma.py): one descriptor box a page, v1.1's candidates (the tuner picked 64 "
                "queries, four warps on an H100), the tiles converted "
                "to fp16 where they are loaded, v1.5's scales and fp16 dots; the same function as v1.17's pointer-"
                "gather kernel to fp16 rounding (other tiles). Hopper and later, 16-bit models; plain pages and "
                "everything else as v1.17. Measured on an H100: the TMA kernel is 10 % SLOWER than v1.17's at 1 x "
                "2,048, 8 x 2,048 and 2 x 8,192 tokens (0.208 against 0.190 ms a layer at 1 x 2,048); 256 x 2048/512 "
                "5,644 against 5,661 tok/s. v1.17 is the faster set; this one stays as a release the canary judges",
    kv_cache_dtypes=("auto", "fp8"),
    prefill_attention=_prefill_fp8_tma.prefill_attention_fp8kv_tma,
))

TRITON_V1_19 = register_kernel_set(TRITON_V1_18.derive(
    "triton-v1.19", "1.19.0",
    description="triton-v1.18 whose TMA prefill attention over FP8 KV pages (--kv-cache-dtype fp8) computes the "
                "scores transposed (kernels/prefill_attention_fp8_tma.py): S^T = K Q^T and O^T += V^T P^T, so the "
                "e4m3 K and V tiles, converted to fp16 in registers, are the tensor-core dots' register operand and "
                "only the softmax weights go back through shared memory each step instead of K and V; 64 queries a "
                "program; v1.18's products, scales and fp16 dots, other accumulation order. Hopper and later, 16-bit "
                "models; plain pages and everything else as v1.18 (= v1.17 there). Measured SLOWER on an H100: "
                "0.229 ms a layer at 1 x 2,048 tokens against v1.18's 0.207 and v1.17's 0.190 (8 x 2,048: 1.495 / "
                "1.336 / 1.218), at every launch config tried; 256 x 2048/512 with fp8 weights 5,526 against "
                "v1.17's 5,572 tok/s. Triton fetches the e4m3 tiles into the dots' register layout with narrow "
                "shared-memory loads and warp shuffles, more work than the round trip saved (bench/"
                "kernel_resources.py). v1.17 is the faster set; a release the canary judges (promoted on the tiny "
                "model, whose short prompts hardly use the kernel)",
    kv_cache_dtypes=("auto", "fp8"),
    prefill_attention=_prefill_fp8_tma.prefill_attention_fp8kv_tma_t,
))

TRITON_V1_20 = register_kernel_set(TRITON_V1_17.derive(
    "triton-v1.20", "1.20.0",
    description="triton-v1.17 whose prefill attention over FP8 KV pages (--kv-cache-dtype fp8) dequantizes the pages "
                "the prefill reads once per call, into a 16-bit scratch cache (kernels/prefill_attention_fp8_dequant."
                "py: e4m3 x scale in fp32, rounded to the model's dtype, as the torch reference dequantizes), then "
                "attends with triton-v1.1's TMA kernel over it: each key converted once instead of once per query "
                "tile. 16-bit models with at most 256 MB of scratch a call (at llama3-8b's shapes eight prefill "
                "sequences at max_model_len 8,192); fp32 models, larger calls, plain pages and everything else as "
                "v1.17. On an H100: 0.122 against v1.17's 0.188 ms a layer at 1 x 2,048 tokens (v1.1 on bf16 pages "
                "0.118); TTFT of 2,048 tokens with fp8 weights and FP8 pages 31.4 against 33.4 ms; 256 x 2048/512 "
                "5,800 against 5,627 tok/s (+3.0 %, 1.55x bf16; interleaved engines, one machine)",
    kv_cache_dtypes=("auto", "fp8"),
    prefill_attention=_prefill_fp8_dequant.prefill_attention_fp8kv_dequant,
))

TRITON_V1_21 = register_kernel_set(TRITON_V1_20.derive(
    "triton-v1.21", "1.21.0",
    description="triton-v1.20 whose prefill attention over FP8 KV pages (--kv-cache-dtype fp8) dequantizes the pages "
                "only for calls with enough attention work to pay for its second launch and allocations "
                "(kernels/prefill_attention_fp8_dequant.py DEQUANT_MIN_WORK: T new tokens over b sequences x query "
                "heads x head_dim, T^2 / b x Hq x D, a lower bound the host knows without the context lengths); "
                "smaller calls -- short prompts, small models, launch-bound steps -- run v1.17's kernel. Each call's "
                "values are v1.20's or v1.17's bit for bit; plain pages and everything else as v1.20. Threshold "
                "2^32: llama3-8b from one 1,024-token prompt, never the tiny model at 2,048 tokens a step. Measured "
                "on an H100: v1.20's op adds 26-164 us of host work a call and saves 8 us of GPU time at 1 x 256, 22 "
                "at 1 x 1,024, 68 at 1 x 2,048; v1.21 ran v1.17's kernel at 1 x 256 and 1 x 512 (its bits) and "
                "v1.20's from 1 x 1,024 (0.117 against 0.185 ms at 1 x 2,048). A GPU canary against v1.20 on the "
                "tiny model (fp8 weights, FP8 pages, H100) promoted it after 19 checks: ITL P90 +1.8 % [-15.6, "
                "+22.7] (v1.20 had measured +5.2 % against v1.17 there)",
    kv_cache_dtypes=("auto", "fp8"),
    prefill_attention=_prefill_fp8_dequant.prefill_attention_fp8kv_dequant_large,
))

TRITON_V1_22 = register_kernel_set(TRITON_V1_21.derive(
    "triton-v1.22", "1.22.0",
    description="triton-v1.21 whose W8A8 GEMM past 512 rows (prefill steps with fp8 weights: the q/k/v, o, gate/up "
                "with SiLU-and-mul and down projections) is a persistent kernel fed by the tensor-memory accelerator "
                "(kernels/fp8_gemm_tma.py: one program an SM walking the output tiles, x and weight tiles copied "
                "by TMA descriptors, the epilogue stored through one) from 2^32 multiply-adds a call, launched "
                "through Triton's own launch path; the pointer kernel's math, K order and bits. MEASURED SLOWER on "
                "an H100: the kernel 5-9 % faster at 2,048 rows for q/k/v, o and down but 5-12 % slower with the "
                "SiLU-and-mul epilogue, and 50-113 us of host time a call against the pointer kernel's 18-42; 256 x "
                "2048/512 with fp8 weights and FP8 pages 4,638 against v1.21's 5,386 tok/s (-14 %, all of it in the "
                "steps with prompt tokens; profiled on another H100, a 2,048-token prefill step +1.2 ms: the "
                "SiLU-and-mul calls and the host's launches). triton-v1.23 keeps what won",
    kv_cache_dtypes=("auto", "fp8"),
    linear=_linear_w8a8_tma.linear_w8a8_tma,
    linear_silu_and_mul=_linear_w8a8_tma.linear_silu_and_mul_w8a8_tma,
    add_rms_norm_linear=_linear_w8a8_tma.add_rms_norm_linear_w8a8_tma,
    add_rms_norm_linear_silu_and_mul=_linear_w8a8_tma.add_rms_norm_linear_silu_and_mul_w8a8_tma,
))

TRITON_V1_23 = register_kernel_set(TRITON_V1_21.derive(
    "triton-v1.23", "1.23.0",
    description="triton-v1.21 whose q/k/v, o and down projections past 512 rows (from 2^32 multiply-adds a call) "
                "run v1.22's persistent TMA GEMM, launched through the project's fast launcher (host descriptors "
                "handed to Triton's compiled launcher, as for the pointer kernel) instead of Triton's launch path; "
                "the gate/up projection with SiLU-and-mul, where the TMA kernel measured slower, stays v1.21's. The "
                "same bits as v1.21 (the kernels agree to 0 ulp on an H100 at llama3-8b's shapes). Measured faster on "
                "an H100 (fp8 weights, FP8 pages, same call): TTFT of 2,048 tokens 31.5 against v1.21's 32.1 ms, "
                "256 x 2048/512 5,794 against 5,744 tok/s (+0.9 %, all of it in the steps with prompt tokens)",
    kv_cache_dtypes=("auto", "fp8"),
    linear=_linear_w8a8_tma.linear_w8a8_tma_fast,
    add_rms_norm_linear=_linear_w8a8_tma.add_rms_norm_linear_w8a8_tma_fast,
    # v1.21's own: their GEMM is not the replaced linear (derive() would otherwise drop fusions over `linear`)
    linear_silu_and_mul=TRITON_V1_21.linear_silu_and_mul,
    add_rms_norm_linear_silu_and_mul=TRITON_V1_21.add_rms_norm_linear_silu_and_mul,
))

TRITON_V1_24 = register_kernel_set(TRITON_V1_23.derive(
    "triton-v1.24", "1.24.0",
    description="triton-v1.23 whose gate/up projection with SiLU-and-mul past 512 rows runs the persistent TMA GEMM "
                "too, with the gate and up rows paired: each K step copies a tile's gate and up rows in one "
                "descriptor load and multiplies them in one dot into one accumulator (the plain GEMM's shape), "
                "where v1.22's kernel issued two dots into two accumulators and measured 5-12 % slower than the "
                "pointer kernel; launched through the fast launcher. The same bits as v1.21 (0 ulp from the pointer "
                "kernel on an H100). Measured on an H100: the gate/up GEMM at 2,048 rows 376 against the pointer "
                "kernel's 440 us, a 2,048-token step's linears 21.2 against v1.23's 23.2 ms; in the engine (fp8 "
                "weights, FP8 pages, v1.23 in the same call) TTFT of 2,048 tokens 29.6 ms median against v1.23's "
                "31.3-37.9, 256 x 2048/512 5,757 against 5,687 tok/s (+1.2 %), and 1.60x the bf16 engine in one "
                "call (5,903 against 3,688). A GPU canary against v1.21 (llama3-8b, fp8 weights, FP8 pages, H100) "
                "promoted it after 47 checks: ITL P90 +1.0 % [-2.8, +5.4]",
    kv_cache_dtypes=("auto", "fp8"),
    linear_silu_and_mul=_linear_w8a8_tma.linear_silu_and_mul_w8a8_tma_paired,
    add_rms_norm_linear_silu_and_mul=_linear_w8a8_tma.add_rms_norm_linear_silu_and_mul_w8a8_tma_paired,
))

TRITON_V1_25 = register_kernel_set(TRITON_V1_24.derive(
    "triton-v1.25", "1.25.0",
    description="triton-v1.24 whose gate/up projection with SiLU-and-mul takes the paired persistent TMA GEMM at "
                "33-512 rows too (decode steps of 33 or more sequences, small mixed steps), where v1.21's op runs "
                "torch._scaled_mm and then a separate SiLU-and-mul; tuned per row bucket, with 64-row tiles among "
                "the candidates; calls below 2^32 multiply-adds stay v1.21's (llama3-8b below 37 rows, the tiny "
                "model always); q/k/v, o and down stay on cuBLASLt, faster there. Values of the Triton W8A8 GEMM at "
                "those rows, not cuBLASLt's (4.0e-3 against 2.0e-3 from the exact product of the e4m3 operands; "
                "within 3.9e-3 of v1.21 at 256 rows). Measured faster on an H100: llama3-8b's gate/up GEMM 45.2-100.8 "
                "against 48.9-118.9 us at 40-512 rows; 256 x 2048/512 with fp8 weights and FP8 pages 6,063 against "
                "v1.24's 5,991 tok/s (+1.2 %, same call), a 256-sequence decode step 21.82 against 22.26 ms",
    kv_cache_dtypes=("auto", "fp8"),
    linear_silu_and_mul=_linear_w8a8_tma.linear_silu_and_mul_w8a8_tma_batched,
    add_rms_norm_linear_silu_and_mul=_linear_w8a8_tma.add_rms_norm_linear_silu_and_mul_w8a8_tma_batched,
))

TRITON_V1_26 = register_kernel_set(TRITON_V1_25.derive(
    "triton-v1.26", "1.26.0",
    description="triton-v1.25 whose decode attention over FP8 KV pages (--kv-cache-dtype fp8) converts the key tile "
                "in the q.k dot's operand layout instead of staging it as fp16 through shared memory (one tile back "
                "to shared memory a step instead of two), at the config v1.15's rule picks; the value tile stays "
                "staged. Values: v1.25's within a few bf16 ulps. Plain pages and other calls as v1.25. Measured on an "
                "H100: a layer's FP8 decode attention 14-18 % faster at 64-256 sequences of 2,048-2,560 tokens "
                "(256: 452 against 549 us); 256 x 2048/512 with fp8 weights and FP8 pages 6,439 against v1.25's "
                "5,583 tok/s (+15.3 %, same call), 1.72x the bf16 engine in one run",
    kv_cache_dtypes=("auto", "fp8"),
    paged_decode_attention=_decode_fp8.paged_decode_attention_k_in_dot,
))

# ---- examples of releases the canary must catch (docs/kernels.md "Example sets"); CPU-capable like their parent ----
TORCH_WRONG_ROPE = register_kernel_set(TORCH.derive(
    "torch-wrong-rope", "1.0.1",
    regression="wrong",
    description="EXAMPLE OF A WRONG RELEASE: torch with a RoPE that hard-codes base 10000 and drops the llama3 "
                "frequency scaling (ignores the model's cos/sin tables); as fast as torch, different answers",
    rope_and_cache=_rope.rope_and_cache_fixed_base_ref,
))

TORCH_SLOW_ATTN = register_kernel_set(TORCH.derive(
    "torch-slow-attn", "1.0.2",
    regression="slow",
    description="EXAMPLE OF A SLOW RELEASE: torch with unfused attention, one query row per (sequence, head) at a "
                "time in prefill and one (sequence, head) at a time in decode; the same answers as torch, slower",
    prefill_attention=_prefill_ref.prefill_attention_per_head_ref,
    paged_decode_attention=_decode.paged_decode_attention_per_head_ref,
))

TRITON_V1_UNSPLIT = register_kernel_set(TRITON_V1.derive(
    "triton-v1-unsplit", "1.0.3",
    regression="slow",
    description="EXAMPLE OF A SLOW TRITON RELEASE: triton-v1 with decode attention as one program per sequence "
                "(kv heads and the whole context in 16-token tiles one after the other; no split over the context): "
                "the same answers, most SMs idle at small batch",
    paged_decode_attention=_decode_bad.paged_decode_attention_per_seq,
))

TRITON_V1_FLOOR_PAGES = register_kernel_set(TRITON_V1.derive(
    "triton-v1-floor-pages", "1.0.4",
    regression="wrong",
    description="EXAMPLE OF A WRONG TRITON RELEASE: triton-v1 with a decode attention that bounds the context by "
                "whole KV pages (ctx // page * page): the tokens of the last, partly filled page are dropped; as fast",
    paged_decode_attention=_decode_bad.paged_decode_attention_floor_pages,
))
