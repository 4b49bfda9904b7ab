"""Names of the metrics every engine exposes and the control plane, the dashboards and the chart's rules query.

One definition for both sides (ARCHITECTURE.md, "Wire contract"): the engine registers its collectors under these
names (engine/server/metrics.py), the analysis gates on them (control_plane/analysis/policy.py, promql.py), the UI and
the dashboards label them. Histograms are in seconds unless named for tokens; their buckets are in `buckets`.
"""

# labels
ENV = "env"                        # the variant's role: production | baseline | canary
SERVICE = "service"                # the rollout's service
ROUTE = "route"                    # the HTTP route (bounded: the server's routes, else "other")
STATUS = "status"                  # the HTTP status code, as text
KERNEL_VERSION = "kernel_version"  # the kernel set's version the engine serves
HTTP_LABELS = (ENV, SERVICE, ROUTE, STATUS)
ENGINE_LABELS = (ENV, SERVICE, KERNEL_VERSION)

# latency histograms: REQUEST_LATENCY by HTTP_LABELS, the others by ENGINE_LABELS
REQUEST_LATENCY = "http_request_duration_seconds"
TTFT = "sits_time_to_first_token_seconds"
ITL = "sits_inter_token_latency_seconds"
E2E = "sits_e2e_request_latency_seconds"
QUEUE_TIME = "sits_queue_time_seconds"
ENGINE_STEP = "sits_engine_step_seconds"
LATENCY_HISTOGRAMS = (REQUEST_LATENCY, TTFT, ITL, E2E, QUEUE_TIME, ENGINE_STEP)

# live requests' token counts (ENGINE_LABELS, `buckets.TOKEN_BUCKETS`): what low-traffic replay draws its workload from
PROMPT_TOKENS = "sits_request_prompt_tokens"
GENERATION_TOKENS = "sits_request_generation_tokens"

# counters (exposed with the _total suffix): inference requests by route, origin (ORIGINS) and stream ("true" |
# "false"), probes excluded; probes by status
INFERENCE_REQUESTS = "sits_inference_requests"
PROBE_REQUESTS = "sits_probe_requests"
ORIGIN = "origin"
ORIGIN_LIVE, ORIGIN_REPLAY = "live", "replay"

# the engine's own state, read at scrape time (ENGINE_LABELS): counters (exposed with _total) and gauges; the
# dashboards' engine panels
PROMPT_TOKENS_TOTAL = "sits_prompt_tokens"
GENERATION_TOKENS_TOTAL = "sits_generation_tokens"
PREEMPTIONS = "sits_num_preemptions"
PREFIX_CACHE_QUERIES = "sits_prefix_cache_queries"
PREFIX_CACHE_HITS = "sits_prefix_cache_hits"
REQUESTS_RUNNING = "sits_num_requests_running"
REQUESTS_WAITING = "sits_num_requests_waiting"
KV_CACHE_USAGE = "sits_kv_cache_usage_perc"
KV_CACHE_FREE_BLOCKS = "sits_kv_cache_free_blocks"
KV_CACHE_TOTAL_BLOCKS = "sits_kv_cache_total_blocks"

# the engine build: an info metric, exposed as ENGINE_INFO + "_info" (labels kernel_version, kernel_set, model, env,
# service, build); and the GPU memory gauge the GPU demo reads
ENGINE_INFO = "sits_engine"
ENGINE_INFO_METRIC = ENGINE_INFO + "_info"
DEVICE_MEMORY = "sits_device_memory_reserved_bytes"
