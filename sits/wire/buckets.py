"""Histogram bucket layouts of the engine's metrics: every latency histogram, and the token-count ones.

Upper bounds grow geometrically by 2**(1/8) (~9.05 % per bucket: the layout of Prometheus native histograms at
schema 3) from 2**-11 s (0.488 ms) to 2**6 s (64 s): 137 finite bounds, then +Inf. Why so fine: the canary analysis
must see a 5 % shift of a P99 that sits at a few milliseconds (inter-token latency on a GPU is ~4 ms). With linear
interpolation inside a bucket the quantile estimate moves continuously with the distribution, and a bucket 9 % wide
keeps the interpolation error well under the 5-10 % thresholds; vLLM's ITL buckets start at 10 ms and cannot.
"""

FACTOR = 2.0 ** (1.0 / 8.0)
_LO_EXP, _HI_EXP = -11 * 8, 6 * 8

# round to 9 significant digits so the `le` label text is stable across processes and languages
LATENCY_BUCKETS: tuple[float, ...] = tuple(float(f"{2.0 ** (k / 8.0):.9g}") for k in range(_LO_EXP, _HI_EXP + 1))

assert len(LATENCY_BUCKETS) == 137 and LATENCY_BUCKETS[0] < 0.001 and LATENCY_BUCKETS[-1] == 64.0

# token counts of a request (sits_request_prompt_tokens, sits_request_generation_tokens): 1..16 exactly, then 2**(1/4)
# apart (~19 %) to 2**17 (131072): low-traffic replay samples lengths from these, uniformly inside a bucket
TOKEN_BUCKETS: tuple[float, ...] = tuple(sorted({float(n) for n in range(1, 17)}
                                                | {float(round(2.0 ** (k / 4.0))) for k in range(17, 69)}))

assert TOKEN_BUCKETS[0] == 1.0 and TOKEN_BUCKETS[-1] == 131072.0 and len(TOKEN_BUCKETS) < 70
