"""Pure canary analysis: Prometheus-exact quantiles, histogram windows, confidence intervals, verdicts, policies.

No I/O and no flask/kubernetes/requests/torch/engine imports: dataclasses in, dataclasses out.
"""
from .correctness import (CorrectnessVerdict, Continuation, PromptComparison, PromptReplay, TokenLogprob,
                          compare_replays)
from .deltas import Delta, compute_deltas
from .histogram import HistogramError, HistogramSnapshot, increase, merge_all
from .gate_policy import CorrectnessPolicy
from .low_traffic import GENERATION_TOKENS, PROMPT_TOKENS, WORKLOAD_METRICS, LowTrafficPolicy, live_requests_needed
from .policy import (E2E, ERROR_RATE, ITL, REQUEST_LATENCY, TTFT, MetricCheck, Policy, default_checks)
from .policy_error import PolicyError
from .quantile import histogram_quantile
from .stats import DeltaEstimate, QuantileBounds, proportion_diff, quantile_bounds, quantile_delta
from .verdict import Guard, Outcome, TestResult, VariantData, Verdict, assess

__all__ = [
    "histogram_quantile", "HistogramSnapshot", "HistogramError", "merge_all", "increase",
    "Policy", "PolicyError", "MetricCheck", "default_checks",
    "REQUEST_LATENCY", "TTFT", "ITL", "E2E", "ERROR_RATE",
    "QuantileBounds", "DeltaEstimate", "quantile_bounds", "quantile_delta", "proportion_diff",
    "LowTrafficPolicy", "live_requests_needed", "PROMPT_TOKENS", "GENERATION_TOKENS", "WORKLOAD_METRICS",
    "CorrectnessPolicy", "CorrectnessVerdict", "Continuation", "PromptComparison", "PromptReplay", "TokenLogprob",
    "compare_replays",
    "Guard", "Outcome", "TestResult", "VariantData", "Verdict", "assess", "Delta", "compute_deltas",
]
