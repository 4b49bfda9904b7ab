"""`Policy`: traffic steps, checks and limits of a rollout. Validated once, serialisable to/from plain dicts."""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Mapping

REQUEST_LATENCY = "http_request_duration_seconds"
TTFT = "sits_time_to_first_token_seconds"
ITL = "sits_inter_token_latency_seconds"
E2E = "sits_e2e_request_latency_seconds"
ERROR_RATE = "error_rate"  # pseudo-metric: errors / requests of the variant
TARGETS = ("baseline", "production")
MAX_CHECKS = 32
MAX_REPORT_METRICS = 32
_METRIC_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]{0,199}$")   # a Prometheus metric name: it goes into PromQL
# (low, high) of every numeric policy field: a typo or a hostile file cannot ask for 1e-300 s or 1e25 failures
LIMITS: dict[str, tuple[float, float]] = {
    "check_interval_s": (0.1, 86400.0), "warmup_s": (0.0, 3600.0), "max_duration_s": (1.0, 30 * 86400.0),
    "ready_timeout_s": (1.0, 86400.0), "min_samples": (1, 10 ** 9), "min_tail_samples": (1, 10 ** 6),
    "failure_limit": (1, 1000), "inconclusive_limit": (1, 100_000), "min_error_samples": (1, 10 ** 9),
    "z_fail": (0.01, 10.0), "z_pass": (0.01, 10.0), "max_error_rate": (0.0001, 1.0), "max_rel_delta": (0.0001, 100.0),
}


class PolicyError(ValueError):
    """An invalid policy value; the message names the field."""


def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(slots=True, frozen=True)
class MetricCheck:
    """One gate. Latency: relative delta of the `quantile` of `metric` (every series whose key is `metric` or
    `metric{...}`, e.g. one per route) must be <= max_rel_delta. Error rate: canary - target <= max_abs_delta."""
    metric: str
    quantile: float | None = None
    max_rel_delta: float | None = None
    max_abs_delta: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.metric, str) or not (self.metric == ERROR_RATE or _METRIC_RE.match(self.metric)):
            raise PolicyError(f"check.metric must be a Prometheus metric name or {ERROR_RATE!r}, got "
                              f"{_short(self.metric)}")
        if self.metric == ERROR_RATE:
            if self.quantile is not None or self.max_rel_delta is not None:
                raise PolicyError("error_rate checks take max_abs_delta only")
            if not _num(self.max_abs_delta) or not 0 <= self.max_abs_delta < 1:
                raise PolicyError("error_rate check needs max_abs_delta in [0, 1) (0.01 = 1 point)")
        else:
            if not _num(self.quantile) or not 0 < self.quantile < 1:
                raise PolicyError(f"{self.metric}: quantile must be in (0, 1), got {self.quantile!r}")
            if not _num(self.max_rel_delta) or not _within("max_rel_delta", self.max_rel_delta):
                lo, hi = LIMITS["max_rel_delta"]
                raise PolicyError(f"{self.metric}: the threshold must be between +{lo * 100:g} % and +{hi * 100:g} %"
                                  f" (max_rel_delta in {_range('max_rel_delta')}, 0.10 = +10 %), got "
                                  + (f"{self.max_rel_delta * 100:+g} %" if _num(self.max_rel_delta)
                                     else _short(self.max_rel_delta)))
            if self.max_abs_delta is not None:
                raise PolicyError(f"{self.metric}: latency checks take max_rel_delta, not max_abs_delta")

    @property
    def name(self) -> str:
        if self.metric == ERROR_RATE:
            return ERROR_RATE
        return f"{self.metric}:p{_pct(self.quantile)}"


def default_checks() -> tuple[MetricCheck, ...]:
    return (MetricCheck(REQUEST_LATENCY, quantile=0.99, max_rel_delta=0.10),
            MetricCheck(REQUEST_LATENCY, quantile=0.90, max_rel_delta=0.05),
            MetricCheck(ERROR_RATE, max_abs_delta=0.01))


@dataclass(slots=True, frozen=True)
class Tolerances:
    """How far a canary may be from the baseline and still compute the same model (analysis/correctness.py).
    Drifts and margins are in nats (natural-log probability)."""
    min_identical_fraction: float   # prompts whose first K greedy tokens are identical
    min_top1_agreement: float       # teacher forcing: positions where the baseline's token is the canary's top-1
    max_mean_logprob_drift: float   # mean |canary - baseline| of the chosen tokens' logprobs
    max_logprob_drift: float        # max of the same (greedy prefix and teacher forcing)
    max_flip_margin: float          # a divergence where the baseline preferred its token by more is a real change
    # Margin-aware rules (half precision): > 0 turns them on. A position is "confident" when the baseline preferred
    # its token over the runner-up by more than confident_margin nats: rounding cannot flip it there, so the drift
    # rules and min_confident_top1 count only such positions, and with fewer than min_confident_positions of them
    # (a flat, e.g. random-weight, model) a replay that found nothing wrong is INCONCLUSIVE, never a pass.
    confident_margin: float = 0.0
    min_confident_positions: int = 0
    min_confident_top1: float = 0.0   # teacher forcing, confident positions: the canary's top-1 is the baseline's

    def __post_init__(self) -> None:
        if isinstance(self.min_confident_positions, bool) or not isinstance(self.min_confident_positions, int) \
                or not 0 <= self.min_confident_positions <= 100_000:
            raise PolicyError("correctness tolerance min_confident_positions must be an integer in [0, 100000], got "
                              f"{self.min_confident_positions!r}")
        for name in ("min_identical_fraction", "min_top1_agreement", "min_confident_top1"):
            v = getattr(self, name)
            if not _num(v) or not 0 <= v <= 1:
                raise PolicyError(f"correctness tolerance {name} must be a fraction in [0, 1], got {v!r}")
        for name in ("max_mean_logprob_drift", "max_logprob_drift", "max_flip_margin", "confident_margin"):
            v = getattr(self, name)
            if not _num(v) or not 0 <= v <= 100:
                raise PolicyError(f"correctness tolerance {name} must be a number of nats in [0, 100], got {v!r}")


# Measured (docs/control-loop.md "Correctness gate", BENCHMARKS.md "Correctness gate"): fp32 is the torch set against
# itself with other batch compositions on CPU (max drift 9.5e-7 over 100 replays); the half-precision ones are
# margin-aware, from a trained tiny checkpoint in bf16 (equivalent sets flip only below a 0.06-nat margin, drift at
# confident positions <= 0.048) and the H200's random-weight figures (flips below 0.31 nats, drift <= 0.22).
_HALF = Tolerances(min_identical_fraction=0.0, min_top1_agreement=0.8, max_mean_logprob_drift=0.1,
                   max_logprob_drift=1.0, max_flip_margin=1.0, confident_margin=1.0, min_confident_positions=20,
                   min_confident_top1=0.98)
DEFAULT_TOLERANCES: dict[str, Tolerances] = {
    "float32": Tolerances(min_identical_fraction=0.9, min_top1_agreement=0.98, max_mean_logprob_drift=1e-5,
                          max_logprob_drift=1e-4, max_flip_margin=1e-3),
    "bfloat16": _HALF,
    "float16": _HALF,
}
LOOSEST_DTYPE = "bfloat16"   # used for a dtype the policy has no tolerances for


def _default_tolerances() -> dict[str, Tolerances]:
    return dict(DEFAULT_TOLERANCES)


@dataclass(slots=True, frozen=True)
class CorrectnessPolicy:
    """The kernel-correctness gate (analysis/correctness.py): before the first traffic step and at every step (plus
    every interval_s when > 0) the prompt set is replayed greedily against canary and baseline, and compared with
    the tolerances of the engines' dtype."""
    enabled: bool = True
    prompt_set: str = "default"          # "default" (analysis/prompts.py) or a file: a JSON list of strings
    max_tokens: int = 16                 # greedy tokens generated per prompt
    compare_tokens: int = 8              # K: "identical" means identical over the first K tokens
    top_logprobs: int = 5                # alternatives per position (for the margins at a divergence)
    interval_s: float = 0.0              # 0: once per step; > 0: also every interval_s within a step
    max_error_fraction: float = 0.25     # more prompts failing to replay: inconclusive
    request_timeout_s: float = 60.0
    concurrency: int = 4                 # replay requests in flight per variant
    tolerances: Mapping[str, Tolerances] = field(default_factory=_default_tolerances)   # dtype -> tolerances

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise PolicyError("correctness.enabled must be true or false")
        if not isinstance(self.prompt_set, str) or not self.prompt_set or len(self.prompt_set) > 4096:
            raise PolicyError("correctness.prompt_set must be 'default' or a file path")
        for name, lo, hi in (("max_tokens", 1, 256), ("compare_tokens", 1, 256), ("top_logprobs", 1, 20),
                             ("concurrency", 1, 64)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise PolicyError(f"correctness.{name} must be an integer in [{lo}, {hi}], got {v!r}")
        if self.compare_tokens > self.max_tokens:
            raise PolicyError("correctness.compare_tokens must be <= correctness.max_tokens")
        if not _num(self.max_error_fraction) or not 0 <= self.max_error_fraction <= 1:
            raise PolicyError("correctness.max_error_fraction must be a fraction in [0, 1]")
        if not _num(self.interval_s) or self.interval_s < 0:
            raise PolicyError("correctness.interval_s must be >= 0 seconds (0 = once per step)")
        if not _num(self.request_timeout_s) or not 0 < self.request_timeout_s <= 3600:
            raise PolicyError("correctness.request_timeout_s must be in (0, 3600] seconds")
        if not isinstance(self.tolerances, Mapping) or not self.tolerances:
            raise PolicyError("correctness.tolerances must map dtypes (float32, bfloat16, ...) to tolerances")
        tol = {}
        for dtype, t in self.tolerances.items():
            if not isinstance(dtype, str) or not dtype:
                raise PolicyError("correctness.tolerances keys must be dtype names such as 'bfloat16'")
            tol[dtype] = t if isinstance(t, Tolerances) else _tolerances(dtype, t)
        object.__setattr__(self, "tolerances", tol)

    def tolerances_for(self, dtype: str) -> Tolerances:
        return self.tolerances.get(dtype) or self.tolerances.get(LOOSEST_DTYPE) or next(iter(self.tolerances.values()))

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "tolerances"}
        d["tolerances"] = {k: asdict(t) for k, t in self.tolerances.items()}
        return d

    @classmethod
    def from_dict(cls, d) -> "CorrectnessPolicy":
        """Plain dict -> policy; `tolerances` entries are merged field by field over the defaults of that dtype."""
        if isinstance(d, CorrectnessPolicy):
            return d
        if not isinstance(d, Mapping):
            raise PolicyError("correctness must be an object, e.g. {\"enabled\": false}")
        unknown = sorted(set(d) - {f.name for f in fields(cls)})
        if unknown:
            raise PolicyError(f"unknown correctness field(s): {', '.join(unknown)}")
        d = dict(d)
        if "tolerances" in d:
            if not isinstance(d["tolerances"], Mapping):
                raise PolicyError("correctness.tolerances must map dtypes (float32, bfloat16, ...) to tolerances")
            d["tolerances"] = {**DEFAULT_TOLERANCES, **{k: _tolerances(k, v) for k, v in d["tolerances"].items()}}
        return cls(**d)


def _tolerances(dtype: str, t) -> Tolerances:
    if isinstance(t, Tolerances):
        return t
    if not isinstance(t, Mapping):
        raise PolicyError(f"correctness.tolerances.{dtype} must be an object")
    base = DEFAULT_TOLERANCES.get(dtype, DEFAULT_TOLERANCES[LOOSEST_DTYPE])
    unknown = sorted(set(t) - {f.name for f in fields(Tolerances)})
    if unknown:
        raise PolicyError(f"unknown correctness.tolerances.{dtype} field(s): {', '.join(unknown)}")
    return Tolerances(**{**asdict(base), **t})


@dataclass(slots=True, frozen=True)
class Policy:
    steps: tuple[int, ...] = (5, 10, 25, 50, 100)   # canary traffic %, the last one reached by promotion
    check_interval_s: float = 30.0
    warmup_s: float = 10.0                           # data right after a deploy or weight change is dropped
    checks: tuple[MetricCheck, ...] = field(default_factory=default_checks)
    min_samples: int = 200                          # requests per variant before a latency check may decide
    min_tail_samples: int = 10                      # n * (1 - q) needed for a quantile
    failure_limit: int = 2                          # consecutive failed checks before rolling back
    inconclusive_limit: int = 20                    # consecutive inconclusive checks before on_inconclusive
    on_inconclusive: str = "pause"                  # "pause" | "rollback"
    max_duration_s: float = 4 * 3600.0              # rollout deadline (paused time excluded) -> rollback
    ready_timeout_s: float = 600.0                  # deploy -> ready deadline -> rollback
    compare_to: str = "baseline"                    # "baseline" | "production"
    auto_promote: bool = True                       # False: wait in PAUSED for a manual promote at the last step
    z_fail: float = 2.3                             # one-sided z of each variant's bound in the fail test
    z_pass: float = 1.0                             # one-sided z of each variant's bound in the pass test
    max_error_rate: float = 0.05                    # guard: canary error rate above this fails at once
    min_error_samples: int = 100                    # requests before the error-rate guard may fire
    report_metrics: tuple[str, ...] = (TTFT, ITL, E2E)  # deltas shown in every check, not decided on
    correctness: CorrectnessPolicy = field(default_factory=CorrectnessPolicy)

    def __post_init__(self) -> None:
        steps = tuple(self.steps)
        if not steps or any(isinstance(s, bool) or not isinstance(s, int) or not 0 < s <= 100 for s in steps):
            raise PolicyError("steps must be integer percents in (0, 100], e.g. (5, 10, 25, 50, 100)")
        if any(a >= b for a, b in zip(steps, steps[1:])):
            raise PolicyError("steps must be strictly increasing")
        if steps[0] >= 100:
            raise PolicyError("steps need at least one step below 100 % (the canary is analysed next to a baseline "
                              "before promotion)")
        object.__setattr__(self, "steps", steps)
        if isinstance(self.checks, (str, bytes, Mapping)) or not isinstance(self.checks, (list, tuple)):
            raise PolicyError("checks must be a list of check objects")
        if not 1 <= len(self.checks) <= MAX_CHECKS:
            raise PolicyError(f"a policy needs at least one check and at most {MAX_CHECKS}, got {len(self.checks)}")
        checks = tuple(_check(c, i) for i, c in enumerate(self.checks))
        object.__setattr__(self, "checks", checks)
        for name in ("check_interval_s", "max_duration_s", "ready_timeout_s", "warmup_s"):
            if not _num(getattr(self, name)) or not _within(name, getattr(self, name)):
                raise PolicyError(f"{name} must be a number of seconds in {_range(name)}, got "
                                  f"{_short(getattr(self, name))}")
        for name in ("min_samples", "failure_limit", "inconclusive_limit", "min_error_samples", "min_tail_samples"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not _within(name, v):
                raise PolicyError(f"{name} must be an integer in {_range(name)}, got {_short(v)}")
        if self.on_inconclusive not in ("pause", "rollback"):
            raise PolicyError("on_inconclusive must be 'pause' or 'rollback'")
        if self.compare_to not in TARGETS:
            raise PolicyError("compare_to must be 'baseline' or 'production'")
        if not isinstance(self.auto_promote, bool):
            raise PolicyError("auto_promote must be true or false")
        for name in ("z_fail", "z_pass", "max_error_rate"):
            if not _num(getattr(self, name)) or not _within(name, getattr(self, name)):
                raise PolicyError(f"{name} must be in {_range(name)}, got {_short(getattr(self, name))}")
        if isinstance(self.report_metrics, (str, bytes, Mapping)) or not isinstance(self.report_metrics, (list, tuple)):
            raise PolicyError("report_metrics must be a list of metric names")
        if len(self.report_metrics) > MAX_REPORT_METRICS:
            raise PolicyError(f"report_metrics has {len(self.report_metrics)} names; at most {MAX_REPORT_METRICS}")
        report = tuple(self.report_metrics)
        if not all(isinstance(m, str) and _METRIC_RE.match(m) for m in report):
            raise PolicyError("report_metrics must be a list of Prometheus metric names")
        object.__setattr__(self, "report_metrics", report)
        if not isinstance(self.correctness, CorrectnessPolicy):
            object.__setattr__(self, "correctness", CorrectnessPolicy.from_dict(self.correctness))

    @property
    def metrics(self) -> tuple[str, ...]:
        """Every histogram metric a metrics source should fetch: the checked ones, then the reported ones."""
        checked = [c.metric for c in self.checks if c.metric != ERROR_RATE]
        return tuple(dict.fromkeys([REQUEST_LATENCY, *checked, *self.report_metrics]))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["steps"] = list(self.steps)
        d["report_metrics"] = list(self.report_metrics)
        d["checks"] = [{k: v for k, v in asdict(c).items() if v is not None} for c in self.checks]
        d["correctness"] = self.correctness.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: Mapping | None) -> "Policy":
        if d is not None and not isinstance(d, Mapping):
            raise PolicyError(f"a policy must be an object of fields, got {type(d).__name__}")
        d = dict(d or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(str(k) for k in set(d) - known)
        if unknown:
            raise PolicyError(f"unknown policy field(s): {_short(', '.join(unknown))}")
        for key in ("steps", "report_metrics"):
            if key in d and not isinstance(d[key], (list, tuple)):
                raise PolicyError(f"{key} must be a list, got {type(d[key]).__name__}")
            if key in d:
                d[key] = tuple(d[key])
        if "correctness" in d:
            d["correctness"] = CorrectnessPolicy.from_dict(d["correctness"])
        return cls(**d)


def _check(c, i: int) -> MetricCheck:
    if isinstance(c, MetricCheck):
        return c
    if not isinstance(c, Mapping):
        raise PolicyError(f"bad check: checks[{i}] must be an object like {{\"metric\": ..., \"quantile\": 0.99, "
                          f"\"max_rel_delta\": 0.1}}, got {_short(c)}")
    unknown = sorted(str(k) for k in set(c) - {f.name for f in fields(MetricCheck)})
    if unknown:
        raise PolicyError(f"bad check: checks[{i}] has unknown field(s): {_short(', '.join(unknown))}")
    return MetricCheck(**c)


def _within(name: str, v: float) -> bool:
    lo, hi = LIMITS[name]
    return lo <= v <= hi


def _range(name: str) -> str:
    lo, hi = LIMITS[name]
    return f"[{lo:g}, {hi:g}]"


def _short(v) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:80] + "..."


def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _pct(q: float) -> str:
    return f"{q * 100:g}".replace(".", "_")
